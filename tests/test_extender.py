"""The kube-scheduler extender, served by `gpuplace serve` over HTTP on 127.0.0.1: recorded
filter/prioritize exchanges, one plan per gang held in the service's state, pods that do not
ask passing through, a bad pod never holding GPUs, a gang's plan released, fuzzed bad bodies
answered with 400 and a message while the server keeps serving, and 50 parallel clients with
hundreds of idle connections all answered."""

from __future__ import annotations

import copy
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gpuplace
import pytest
from gpuplace.integrations.extender import Extender
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_harness import Running, running_service

DATA = Path(__file__).parent / "data" / "extender"


def load(name: str) -> object:
    return json.loads((DATA / name).read_text())


def fresh_extender() -> Extender:
    return Extender(gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=4)))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Running]:
    with running_service(
        tmp_path, fresh_extender().state, tcp=True, extender_prefix="/gpuplace", idle_timeout=1
    ) as running:
        yield running


def post(running: Running, verb: str, body: bytes) -> tuple[int, object]:
    return running.post(f"/gpuplace/{verb}", body)


def held(running: Running) -> dict[str, list[int]]:
    rt = running.engine.cluster(None)
    return {name: sorted(g.tolist()) for name, g in rt.state.jobs.items()}


def test_recorded_filter_and_prioritize(server: Running) -> None:
    status, answer = post(server, "filter", (DATA / "filter-request.json").read_bytes())
    assert status == 200
    assert answer == load("filter-response.json")
    status, answer = post(server, "prioritize", (DATA / "prioritize-request.json").read_bytes())
    assert status == 200
    assert answer == load("prioritize-response.json")
    # One plan for the gang, held in the service's state (and journaled: it survives a restart).
    assert list(held(server)) == ["research.train"]
    hold = server.engine.cluster(None).holds["research.train"]
    assert (hold.origin, hold.label) == ("k8s", "research/train")


def test_every_rank_of_a_gang_goes_to_its_planned_node() -> None:
    extender = fresh_extender()
    request = load("filter-request.json")
    hosts = []
    for rank in range(16):
        pod_request = copy.deepcopy(request)
        pod_request["Pod"]["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = str(
            rank
        )
        result = extender.filter(pod_request)
        (host,) = result["NodeNames"]
        assert set(result["FailedNodes"]) == set(request["NodeNames"]) - {host}
        hosts.append(host)
    (plan,) = extender.plans.values()
    assert hosts == plan
    # A second gang is planned around the first.
    other = copy.deepcopy(request)
    other["Pod"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "eval"
    other["Pod"]["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "0"
    (host,) = extender.filter(other)["NodeNames"]
    assert host not in hosts


def test_pods_without_the_annotation_pass_through() -> None:
    extender = fresh_extender()
    request = load("prioritize-request.json")
    del request["Pod"]["metadata"]["annotations"]["gpuplace/job"]
    result = extender.filter(request)
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == [
        "dgx001",
        "dgx003",
        "dgx004",
    ]
    assert result["FailedNodes"] == {}
    assert extender.prioritize(request) == [
        {"Host": n, "Score": 0} for n in ("dgx001", "dgx003", "dgx004")
    ]
    assert extender.plans == {}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("Pod"), "Pod: expected an object"),
        (lambda r: r.update(NodeNames=None), "expected Nodes or NodeNames"),
        (lambda r: r.update(NodeNames="dgx001"), "NodeNames: expected a list"),
        (lambda r: r["Pod"]["metadata"]["annotations"].update({"gpuplace/job": "{"}), "not JSON"),
        (
            lambda r: r["Pod"]["metadata"]["annotations"].update(
                {"gpuplace/job": '{"parallelism": {"tp": 64}}'}
            ),
            "research/train",
        ),
        (
            lambda r: r["Pod"]["metadata"]["labels"].update(
                {"batch.kubernetes.io/job-completion-index": "99"}
            ),
            "completion index 99 beyond the gang's 16 ranks",
        ),
    ],
)
def test_bad_requests_get_400_with_a_message(server: Running, mutate, message: str) -> None:
    request = load("filter-request.json")
    mutate(request)
    status, answer = post(server, "filter", json.dumps(request).encode())
    assert status == 400
    assert message in answer["Error"]
    # A refused pod never holds GPUs (the completion index is checked before planning).
    assert held(server) == {}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = ["Pod", "Nodes", "NodeNames", "metadata", "labels", "annotations", "items", "name"]


def _mutations() -> st.SearchStrategy[bytes]:
    """Bodies near the valid one (a field replaced by any JSON value), any JSON, any bytes."""

    @st.composite
    def near(draw: st.DrawFn) -> bytes:
        request = load("filter-request.json")
        target = request
        path = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3))
        for key in path[:-1]:
            if isinstance(target, dict) and isinstance(target.get(key), dict):
                target = target[key]
        if isinstance(target, dict):
            target[path[-1]] = draw(json_values)
        return json.dumps(request).encode()

    return near() | json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=200)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(body=_mutations(), verb=st.sampled_from(["filter", "prioritize"]))
def test_fuzzed_bodies_never_crash_the_server(server: Running, body: bytes, verb: str) -> None:
    status, answer = post(server, verb, body)
    assert status in (200, 400), answer
    if status == 400:
        assert isinstance(answer, dict) and answer["Error"]
        # The message is gpuplace's, not a Python exception's text.
        assert "Traceback" not in answer["Error"] and "invalid literal" not in answer["Error"]
    # And it still answers a good request.
    good, _ = post(server, "prioritize", (DATA / "prioritize-request.json").read_bytes())
    assert good == 200


def test_empty_body_and_unknown_verb(server: Running) -> None:
    assert post(server, "filter", b"")[0] == 400
    assert post(server, "bind", b"{}")[0] == 404


def test_a_bad_first_pod_holds_nothing_and_a_gang_is_released(server: Running) -> None:
    """A 4-node cluster (32 GPUs): a first pod whose completion index the job lacks used to
    leave the gang's whole plan allocated; now it is refused before planning. A planned gang
    is released through the release verb (its Job ended or failed)."""
    request = load("filter-request.json")
    labels = request["Pod"]["metadata"]["labels"]
    labels["batch.kubernetes.io/job-completion-index"] = "99"
    assert post(server, "filter", json.dumps(request).encode())[0] == 400
    labels["batch.kubernetes.io/job-completion-index"] = "\u00b2"  # a digit int() refuses
    status, answer = post(server, "filter", json.dumps(request).encode())
    assert status == 400 and "must be a completion index" in answer["Error"]
    assert held(server) == {}
    labels["batch.kubernetes.io/job-completion-index"] = "0"
    assert post(server, "filter", json.dumps(request).encode())[0] == 200
    assert list(held(server)) == ["research.train"]
    status, answer = post(server, "release", json.dumps({"gang": "research/train"}).encode())
    assert (status, answer) == (200, {"released": True})
    assert held(server) == {}
    assert post(server, "release", json.dumps({"gang": "research/train"}).encode())[1] == {
        "released": False
    }


def test_parallel_clients_and_idle_connections_are_all_served(server: Running) -> None:
    """The old server (listen backlog 5, a thread per connection, no read timeout) reset
    15-35 of 50 parallel requests, and idle connections locked everyone out. Here 300 idle
    connections stay open while 50 clients post at once: every request is answered, and the
    idle connections are closed by the server after its idle timeout."""
    idle = []
    for _ in range(300):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        idle.append(sock)
    body = (DATA / "prioritize-request.json").read_bytes()
    try:
        with ThreadPoolExecutor(50) as pool:
            statuses = list(pool.map(lambda _: post(server, "prioritize", body)[0], range(50)))
        assert statuses == [200] * 50
        time.sleep(2.5)  # idle timeout is 1 s here
        closed = 0
        for sock in idle:
            sock.settimeout(5)
            try:
                closed += sock.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == len(idle)
    finally:
        for sock in idle:
            sock.close()
