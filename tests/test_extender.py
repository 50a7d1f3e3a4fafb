"""The kube-scheduler extender over HTTP on 127.0.0.1: recorded filter/prioritize exchanges, one
plan per gang, pods that do not ask passing through, and fuzzed bad bodies answered with 400
and a message while the server keeps serving."""

from __future__ import annotations

import copy
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import gpuplace
import pytest
from gpuplace.integrations.extender import Extender, serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DATA = Path(__file__).parent / "data" / "extender"


def load(name: str) -> object:
    return json.loads((DATA / name).read_text())


def fresh_extender() -> Extender:
    return Extender(gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=4)))


@pytest.fixture
def server() -> Iterator[tuple[Extender, int]]:
    extender = fresh_extender()
    httpd = serve(extender, port=0, prefix="/gpuplace")
    assert httpd.server_address[0] == "127.0.0.1"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield extender, httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def post(port: int, verb: str, body: bytes) -> tuple[int, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST", f"/gpuplace/{verb}", body=body, headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_recorded_filter_and_prioritize(server: tuple[Extender, int]) -> None:
    extender, port = server
    status, answer = post(port, "filter", (DATA / "filter-request.json").read_bytes())
    assert status == 200
    assert answer == load("filter-response.json")
    status, answer = post(port, "prioritize", (DATA / "prioritize-request.json").read_bytes())
    assert status == 200
    assert answer == load("prioritize-response.json")
    # One plan for the gang, allocated in the extender's state.
    (plan,) = extender.plans.values()
    assert extender.state.jobs["research.train"].tolist() == sorted(plan.gpus.tolist())


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
    assert hosts == [plan.topology.host_of(int(g)) for g in plan.gpus]
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
def test_bad_requests_get_400_with_a_message(server, mutate, message: str) -> None:
    _, port = server
    request = load("filter-request.json")
    mutate(request)
    status, answer = post(port, "filter", json.dumps(request).encode())
    assert status == 400
    assert message in answer["Error"]


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
def test_fuzzed_bodies_never_crash_the_server(server, body: bytes, verb: str) -> None:
    _, port = server
    status, answer = post(port, verb, body)
    assert status in (200, 400), answer
    if status == 400:
        assert isinstance(answer, dict) and answer["Error"]
    # And it still answers a good request.
    good, _ = post(port, "prioritize", (DATA / "prioritize-request.json").read_bytes())
    assert good == 200


def test_empty_body_and_unknown_verb(server) -> None:
    _, port = server
    assert post(port, "filter", b"")[0] == 400
    assert post(port, "bind", b"{}")[0] == 404
