"""A kube-scheduler extender: ``filter`` and ``prioritize`` that send each pod of a gang to the
node gpuplace planned for it.

kube-scheduler POSTs ``ExtenderArgs`` and reads ``ExtenderFilterResult`` / ``HostPriorityList``
(k8s.io/kube-scheduler/extender/v1). Those Go types carry no JSON tags, so the keys are the Go
field names: ``Pod``, ``Nodes`` (a NodeList), ``NodeNames``; ``Nodes``, ``NodeNames``,
``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``; ``Host``, ``Score`` (0-10).

A pod takes part when it carries the annotation ``gpuplace/job`` (a job document, JSON, as in
a job file). Its gang is its namespace and ``batch.kubernetes.io/job-name`` label (or its
``gpuplace/gang`` annotation); its rank is ``batch.kubernetes.io/job-completion-index``. The
first pod of a gang to arrive has the whole job planned (by a :class:`Planner`: the live
service's, or :class:`StatePlanner` on a state in memory), and every pod of the gang is
filtered to its rank's node. Other pods pass through. :meth:`Extender.release` forgets a
gang's plan (its Job ended or failed).

A pod whose completion index the job does not have is refused before anything is planned, and
a plan made for a request that then fails is released again, so a bad pod never holds GPUs.
Bad bodies raise :class:`BadRequest` with a message naming the field; the service answers them
with HTTP 400 and ``{"Error": message}``.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from gpuplace._util.documents import parse_json
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import GpuplaceError, InvalidJob
from gpuplace.model.job import Job
from gpuplace.placement.place import place

__all__ = ["MAX_SCORE", "BadRequest", "Extender", "Planner", "StatePlanner", "parse_body"]

MAX_SCORE = 10
JOB_ANNOTATION = "gpuplace/job"
GANG_ANNOTATION = "gpuplace/gang"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
#: The largest request body the service takes by default (``gpuplace serve --max-body``): a
#: larger one is answered 413 before it is read further, so :func:`parse_body` never sees it.
MAX_BODY = 1 << 20


class BadRequest(ValueError):
    """The request body is not ExtenderArgs; answered with HTTP 400."""


def parse_body(raw: bytes) -> Any:
    """A request body as JSON, with the limits of the documents users write (integer digits,
    nesting, a key given twice); :class:`BadRequest` naming what is wrong if it is not. (The
    service has refused a body over its size limit before reading it.)"""
    try:
        return parse_json(raw.decode("utf-8"), "body", InvalidJob)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body: not UTF-8 (byte {exc.start})") from None
    except InvalidJob as exc:
        raise BadRequest(f"{exc} (ExtenderArgs expected)") from None


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


class Planner(Protocol):
    """Where gang plans live: ``plan`` places a job and holds its GPUs, returning the host of
    each rank; ``rank_hosts`` gives an existing plan's; ``release`` drops one."""

    def rank_hosts(self, gang: str) -> list[str] | None: ...

    def plan(self, gang: str, job: Job) -> list[str]: ...

    def release(self, gang: str) -> bool: ...


class StatePlanner:
    """Plans on a :class:`ClusterState` in memory (allocated there)."""

    def __init__(self, state: ClusterState, *, solver: str = "greedy"):
        self.state = state
        self.solver = solver
        self._lock = threading.Lock()
        self.plans: dict[str, list[str]] = {}

    def rank_hosts(self, gang: str) -> list[str] | None:
        return self.plans.get(gang)

    def plan(self, gang: str, job: Job) -> list[str]:
        with self._lock:
            if gang in self.plans:
                return self.plans[gang]
            placement = place(self.state, job, self.solver)
            self.state.allocate(placement)
            hosts = [placement.topology.host_of(int(g)) for g in placement.gpus]
            self.plans[gang] = hosts
            return hosts

    def release(self, gang: str) -> bool:
        with self._lock:
            hosts = self.plans.pop(gang, None)
            if hosts is None:
                return False
            job = gang_job_name(gang)
            if self.state.job_gpus(job) is not None:
                self.state.release(job)
            return True


def gang_job_name(gang: str) -> str:
    """The job name a gang's plan is held under (``namespace.gang``)."""
    return gang.replace("/", ".", 1)


class Extender:
    """Answers the verbs, planning each gang once through ``planner`` (default: a
    :class:`StatePlanner` on ``state``)."""

    def __init__(
        self,
        state: ClusterState | None = None,
        *,
        solver: str = "greedy",
        planner: Planner | None = None,
    ):
        if planner is None:
            if state is None:
                raise ValueError("give a state or a planner")
            planner = StatePlanner(state, solver=solver)
        self.planner = planner
        self.state = state
        self._lock = threading.Lock()

    @property
    def plans(self) -> dict[str, list[str]]:
        """Gang -> host of each rank (for a :class:`StatePlanner`)."""
        return dict(getattr(self.planner, "plans", {}))

    def release(self, gang: str) -> bool:
        """Forget a gang's plan (``namespace/name``) and free its GPUs; False if unknown."""
        return self.planner.release(gang)

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
        if index is None or not (index.isascii() and index.isdigit()) or len(index) > 9:
            raise BadRequest(f"Pod: {INDEX_LABEL} must be a completion index, got {index!r}")
        rank = int(index)
        gang = f"{namespace}/{gang_name}"
        with self._lock:
            hosts = self.planner.rank_hosts(gang)
            if hosts is None:
                job = self._job(annotations, gang)
                if rank >= job.gpus:
                    # Refused before planning: a bad pod never holds the gang's GPUs.
                    raise BadRequest(
                        f"Pod: completion index {rank} beyond the gang's {job.gpus} ranks"
                    )
                try:
                    hosts = self.planner.plan(gang, job)
                except GpuplaceError as exc:
                    raise BadRequest(f"gang {gang}: {' '.join(str(exc).split())}") from None
        if rank >= len(hosts):
            raise BadRequest(f"Pod: completion index {rank} beyond the gang's {len(hosts)} ranks")
        return gang, rank, hosts[rank]

    @staticmethod
    def _job(annotations: dict[str, str], gang: str) -> Job:
        try:
            # The bounded parser: huge integers and deep nesting are refused, not raised raw.
            spec = parse_json(
                annotations[JOB_ANNOTATION],
                f"annotation {JOB_ANNOTATION}",
                InvalidJob,
                what="not JSON",
            )
        except InvalidJob as exc:
            raise BadRequest(" ".join(str(exc).split())) from None
        if not isinstance(spec, dict):
            raise BadRequest(
                f"annotation {JOB_ANNOTATION}: expected a JSON object (a job document)"
            )
        # One plan per gang: the job is named after it, whatever the spec says.
        spec = {**spec, "name": gang_job_name(gang)}
        try:
            return Job.from_dict(spec, source=f"annotation {JOB_ANNOTATION}")
        except GpuplaceError as exc:
            raise BadRequest(" ".join(str(exc).split())) from None

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
