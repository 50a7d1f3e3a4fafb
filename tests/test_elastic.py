"""Elastic jobs: degree ranges and layout alternatives, placed at the best size that fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gpuplace
import pytest
from gpuplace.errors import Infeasible, InvalidJob
from hypothesis import given
from hypothesis import strategies as st

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "policy"


def elastic(low: int, high: int, **extra: Any) -> gpuplace.Job:
    return gpuplace.Job.from_dict(
        {
            "name": "e",
            "parallelism": {"tp": 4, "dp": {"min": low, "max": high}},
            "communication": {"tp": {"bytes": 1e8, "count": 100}, "dp": {"bytes": 1e9}},
            **extra,
        }
    )


def small_cluster() -> gpuplace.Topology:
    """16 hosts of 4 GPUs under 4 leaves."""
    return gpuplace.Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "levels": [
                {"name": "node", "bandwidth_gbps": 450},
                {"name": "leaf", "bandwidth_gbps": 50},
                {"name": "spine", "bandwidth_gbps": 25},
            ],
            "node_types": {"hgx": {"gpus": 4}},
            "nodes": [
                {
                    "name": f"h[{4 * k + 1:02d}-{4 * k + 4:02d}]",
                    "type": "hgx",
                    "domains": {"leaf": f"l{k}", "spine": "s"},
                }
                for k in range(4)
            ],
        }
    )


def test_ranges_and_alternatives_round_trip_and_are_checked():
    job = elastic(2, 8, alternatives=[{"parallelism": {"tp": 2, "dp": {"min": 4, "max": 16}}}])
    assert (job.dp, job.elastic.dim, job.elastic.low, job.elastic.high) == (8, "dp", 2, 8)
    assert job.elastic.alternatives[0].tp == 2 and job.elastic.alternatives[0].dp == 16
    again = gpuplace.Job.from_dict(job.to_dict())
    assert again.to_dict() == job.to_dict()
    with pytest.raises(InvalidJob, match=r"parallelism\.dp: min \(9\) is above max \(8\)"):
        elastic(9, 8)
    with pytest.raises(InvalidJob, match="at most one dimension"):
        gpuplace.Job.from_dict(
            {"name": "x", "parallelism": {"tp": {"min": 1, "max": 2}, "dp": {"min": 1, "max": 2}}}
        )
    with pytest.raises(InvalidJob, match=r"alternatives\[0\]\.policy: unknown field"):
        elastic(1, 2, alternatives=[{"policy": {}}])


def test_an_elastic_job_shrinks_to_fit_and_says_why():
    topo = small_cluster()
    state = gpuplace.ClusterState(topo)
    state.allocate(name="busy", gpus=list(range(0, 40)))  # 24 GPUs free: l2 half, l3 whole
    job = elastic(1, 8, constraints={"max_span": "leaf"})
    p = gpuplace.place(state, job)
    info = p.details["elastic"]
    assert info["gpus"] == 16 and len(p.gpus) == 16  # dp 4 = one whole leaf
    assert info["rejected"][0]["layout"] == "tp 4, dp 8"
    assert "needs 32 GPUs" in info["rejected"][0]["reason"]
    # dp 4 is also the largest size an empty cluster takes inside one leaf
    assert info["relative_throughput"] == pytest.approx(1.0)
    assert "tp 4, dp 4 (16 GPUs) fits now at" in info["summary"]
    state.allocate(p)
    state.check()


def test_an_elastic_job_that_fits_nowhere_lists_every_layout():
    state = gpuplace.ClusterState(small_cluster())
    state.allocate(name="busy", gpus=list(range(64)))
    job = elastic(1, 2, alternatives=[{"parallelism": {"tp": 2, "dp": 1}}])
    with pytest.raises(Infeasible) as err:
        gpuplace.place(state, job)
    assert "tp 4, dp 2 (8 GPUs)" in str(err.value) and "tp 2 (2 GPUs)" in str(err.value)


def test_the_chosen_alternative_keeps_the_jobs_name():
    import dataclasses

    state = gpuplace.ClusterState(small_cluster())
    state.allocate(name="busy", gpus=[g for g in range(64) if g % 4 >= 2])  # 2 free per host
    job = elastic(1, 2, alternatives=[{"parallelism": {"tp": 2, "dp": 4}}])
    renamed = dataclasses.replace(job, name="renamed")
    p = gpuplace.place(state, renamed)
    assert p.details["elastic"]["chosen"] == "tp 2, dp 4"
    assert p.job.name == "renamed"


@given(
    st.lists(st.integers(0, 15), unique=True, max_size=16),
    st.data(),
    st.sampled_from([None, "leaf"]),
)
def test_more_free_gpus_never_yield_a_smaller_chosen_size(busy_hosts, data, span):
    topo = small_cluster()
    job = elastic(1, 16, **({"constraints": {"max_span": span}} if span else {}))
    freed = data.draw(
        st.lists(st.sampled_from(busy_hosts), unique=True) if busy_hosts else st.just([])
    )
    sizes = []
    for hosts in (busy_hosts, [h for h in busy_hosts if h not in freed]):
        state = gpuplace.ClusterState(topo)
        gpus = [4 * h + k for h in hosts for k in range(4)]
        if gpus:
            state.allocate(name="busy", gpus=gpus)
        try:
            sizes.append(len(gpuplace.place(state, job).gpus))
        except Infeasible:
            sizes.append(0)
    assert sizes[1] >= sizes[0]


def test_cli_elastic_job_shrinks_on_a_built_in_cluster(tmp_path):
    import json
    import subprocess
    import sys

    state = str(tmp_path / "s.json")
    cluster = ["-c", "h100-superpod", "--nodes", "64"]

    def place(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuplace.cli", "place", *cluster, "--state", state, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    for name in ("a", "b", "c"):
        assert place("-j", str(EXAMPLES / "filler.yaml"), "--name", name).returncode == 0
    r = place("-j", str(EXAMPLES / "elastic.yaml"), "--format", "json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)["details"]["elastic"]
    assert info["gpus"] == 160
    assert [x["gpus"] for x in info["rejected"][:2]] == [256, 256]
