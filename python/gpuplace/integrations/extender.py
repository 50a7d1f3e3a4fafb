"""A kube-scheduler extender: ``filter`` and ``prioritize`` that send each pod of a gang to the
node gpuplace planned for it.

kube-scheduler POSTs ``ExtenderArgs`` and reads ``ExtenderFilterResult`` / ``HostPriorityList``
(k8s.io/kube-scheduler/extender/v1). Those Go types carry no JSON tags, so the keys are the Go
field names: ``Pod``, ``Nodes`` (a NodeList), ``NodeNames``; ``Nodes``, ``NodeNames``,
``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``; ``Host``, ``Score`` (0-10).

A pod takes part when it carries the annotation ``gpuplace/job`` (a job document, JSON, as in
a job file). Its gang is its namespace and ``batch.kubernetes.io/job-name`` label (or its
``gpuplace/gang`` annotation); its rank is ``batch.kubernetes.io/job-completion-index``. The
first pod of a gang to arrive has gpuplace place the whole job on the extender's state; the plan
is cached, and every pod of the gang is filtered to its rank's node. Other pods pass through.

Bad bodies get HTTP 400 with ``{"Error": message}``; the server binds to 127.0.0.1 unless told
otherwise.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuplace.cluster.state import ClusterState
from gpuplace.errors import GpuplaceError
from gpuplace.model.job import Job
from gpuplace.placement.place import place
from gpuplace.placement.result import Placement

__all__ = ["MAX_SCORE", "BadRequest", "Extender", "serve"]

MAX_SCORE = 10
JOB_ANNOTATION = "gpuplace/job"
GANG_ANNOTATION = "gpuplace/gang"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
MAX_BODY = 8 << 20


class BadRequest(ValueError):
    """The request body is not ExtenderArgs; answered with HTTP 400."""


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: expected an object")
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest(f"{where}: expected a map of strings")
    return value


class Extender:
    """Plans gangs on ``state`` (changed: each plan is allocated) and answers the verbs."""

    def __init__(self, state: ClusterState, *, solver: str = "greedy"):
        self.state = state
        self.solver = solver
        self.plans: dict[tuple[str, str], Placement] = {}
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- request parsing
    @staticmethod
    def _candidates(args: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
        """The candidate node names, and the NodeList when names came from one."""
        names = args.get("NodeNames")
        nodes = args.get("Nodes")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise BadRequest("NodeNames: expected a list of node names")
            return list(names), None
        if nodes is None:
            raise BadRequest("expected Nodes or NodeNames")
        node_list = _obj(nodes, "Nodes")
        items = node_list.get("items") or []
        if not isinstance(items, list):
            raise BadRequest("Nodes.items: expected a list")
        out = []
        for i, item in enumerate(items):
            meta = _obj(
                _obj(item, f"Nodes.items[{i}]").get("metadata"), f"Nodes.items[{i}].metadata"
            )
            if not isinstance(meta.get("name"), str):
                raise BadRequest(f"Nodes.items[{i}].metadata.name: expected a string")
            out.append(meta["name"])
        return out, node_list

    def _rank_node(self, pod: dict[str, Any]) -> tuple[str, int, str] | None:
        """(gang, rank, planned node) of a gpuplace pod, planning its gang if new; None for a
        pod that does not ask for gpuplace."""
        meta = _obj(pod.get("metadata"), "Pod.metadata")
        annotations = _str_map(meta.get("annotations"), "Pod.metadata.annotations")
        labels = _str_map(meta.get("labels"), "Pod.metadata.labels")
        if JOB_ANNOTATION not in annotations:
            return None
        namespace = meta.get("namespace") or "default"
        gang_name = annotations.get(GANG_ANNOTATION) or labels.get(JOB_NAME_LABEL)
        if not isinstance(namespace, str) or not gang_name:
            raise BadRequest(
                f"Pod: a gpuplace pod needs the {JOB_NAME_LABEL} label or a {GANG_ANNOTATION} "
                "annotation"
            )
        index = labels.get(INDEX_LABEL, annotations.get(INDEX_LABEL))
        if index is None or not index.isdigit():
            raise BadRequest(f"Pod: {INDEX_LABEL} must be a completion index, got {index!r}")
        key = (namespace, gang_name)
        with self._lock:
            plan = self.plans.get(key)
            if plan is None:
                try:
                    spec = json.loads(annotations[JOB_ANNOTATION])
                    if isinstance(spec, dict):
                        # One plan per gang: the job is named after it, whatever the spec says.
                        spec = {**spec, "name": f"{namespace}.{gang_name}"}
                    job = Job.from_dict(spec, source=f"annotation {JOB_ANNOTATION}")
                except (json.JSONDecodeError, RecursionError) as exc:
                    raise BadRequest(f"annotation {JOB_ANNOTATION}: not JSON ({exc})") from None
                except GpuplaceError as exc:
                    raise BadRequest(str(exc)) from None
                try:
                    plan = place(self.state, job, self.solver)
                except GpuplaceError as exc:
                    raise BadRequest(f"gang {namespace}/{gang_name}: {exc}") from None
                self.state.allocate(plan)
                self.plans[key] = plan
        rank = int(index)
        if rank >= len(plan.gpus):
            raise BadRequest(
                f"Pod: completion index {rank} beyond the gang's {len(plan.gpus)} ranks"
            )
        return f"{namespace}/{gang_name}", rank, plan.topology.host_of(int(plan.gpus[rank]))

    # ----------------------------------------------------------------- verbs
    def filter(self, args: Any) -> dict[str, Any]:
        """ExtenderArgs -> ExtenderFilterResult: a gpuplace pod keeps only its planned node."""
        args = _obj(args, "ExtenderArgs")
        pod = _obj(args.get("Pod"), "Pod")
        names, node_list = self._candidates(args)
        target = self._rank_node(pod)
        if target is None:
            keep, failed = names, {}
        else:
            gang, rank, host = target
            keep = [n for n in names if n == host]
            reason = f"gpuplace planned rank {rank} of {gang} on {host}"
            failed = {n: reason for n in names if n != host}
        result: dict[str, Any] = {
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        if node_list is None:
            result.update(Nodes=None, NodeNames=keep)
        else:
            items = [
                item for item in node_list.get("items") or [] if item["metadata"]["name"] in keep
            ]
            result.update(Nodes={**node_list, "items": items}, NodeNames=None)
        return result

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        """ExtenderArgs -> HostPriorityList: the planned node scores 10, the others 0; every
        node 0 for a pod that does not ask for gpuplace."""
        args = _obj(args, "ExtenderArgs")
        pod = _obj(args.get("Pod"), "Pod")
        names, _ = self._candidates(args)
        target = self._rank_node(pod)
        host = target[2] if target else None
        return [{"Host": n, "Score": MAX_SCORE if n == host else 0} for n in names]


class _Handler(BaseHTTPRequestHandler):
    extender: Extender
    prefix: str

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no per-request log lines
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        verb = self.path[len(self.prefix) :].strip("/") if self.path.startswith(self.prefix) else ""
        if verb not in ("filter", "prioritize"):
            self._send(404, {"Error": f"unknown verb {self.path!r}; expected filter or prioritize"})
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
            if length <= 0 or length > MAX_BODY:
                raise BadRequest(f"expected a JSON body of 1 byte to {MAX_BODY} bytes")
            raw = self.rfile.read(length)
            try:
                args = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                raise BadRequest(f"body is not JSON: {exc}") from None
            result = (
                self.extender.filter(args) if verb == "filter" else self.extender.prioritize(args)
            )
        except (BadRequest, ValueError) as exc:
            self._send(400, {"Error": str(exc)})
            return
        except Exception as exc:  # a bug, not the caller's: say so rather than drop the request
            self._send(500, {"Error": f"internal error: {type(exc).__name__}: {exc}"})
            return
        self._send(200, result)


def serve(
    extender: Extender, *, host: str = "127.0.0.1", port: int = 8888, prefix: str = ""
) -> ThreadingHTTPServer:
    """A server answering ``POST {prefix}/filter`` and ``{prefix}/prioritize`` (not started:
    call ``serve_forever``). Binds to 127.0.0.1 unless ``host`` says otherwise."""
    handler = type("ExtenderHandler", (_Handler,), {"extender": extender, "prefix": prefix})
    return ThreadingHTTPServer((host, port), handler)
