"""MIG in a live cluster: the geometry of every MIG-mode GPU, its instances, and the packing of
requests onto them. The profiles and their start rules are in :mod:`gpuplace.model.mig`.

**Packing.** :class:`MigCluster` places requests (a profile, or a minimum of memory and
compute) with one of three policies:

- ``fgd``: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation: Scheduling
  GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23), adapted to MIG:
  the fragmentation of a GPU for a request type is the part of its free compute share that
  instances of that type could not use under the start rules (all of it when none fits,
  FGD's definition for a GPU too small for a task; the stranded remainder otherwise); the
  expected fragmentation weighs the request types by their frequency in a request
  distribution; the request goes to
  the (GPU, profile, start) that increases the expected fragmentation least (then the
  tightest fit, then the lowest GPU id);
- ``best-fit``: the GPU with the least free compute that can host it, the lowest valid start;
- ``first-fit``: the lowest GPU id that can host it, the lowest valid start.

A GPU's state is its occupied memory slices, compute slices in use and ``+me`` count, so GPUs
are grouped by state and each request scores a few dozen states, not every GPU: packing
10,000 GPUs stays fast in Python.

**Geometry.** Instances exist busy (serving a request) or free (from a configured geometry,
:meth:`MigCluster.add_free_instances`, or left by a finished request). A request first reuses
a free instance of its profile, else gets a new instance in free slices, else free instances
in the way are destroyed to make room (a reconfiguration); busy instances never move, and
each tier is scored by the policy. Fragmentation and unallocated share count free instances
as free capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplace.errors import Constraint, Explanation, Infeasible, InvalidState, InvalidTopology
from gpuplace.model.mig import MigModel, MigProfile, Request, model_for, request_of_kind
from gpuplace.model.policy import attribute_table

__all__ = ["MIG_JOB", "POLICIES", "Instance", "MigCluster", "enable", "gpu_model_of", "restore"]


@dataclass(frozen=True)
class Instance:
    """A GPU instance: its profile, first memory slice and the request it serves (None: it
    exists but is free, e.g. from the GPU's configured geometry or a finished request)."""

    profile: str
    start: int
    owner: str | None


#: (occupied memory-slice bitmask, compute slices in use, instances per profile (sorted)).
State = tuple[int, int, tuple[tuple[str, int], ...]]
_EMPTY: State = (0, 0, ())


def _placements(model: MigModel, state: State, p: MigProfile) -> list[int]:
    """Valid starts of profile ``p`` on a GPU in ``state`` under every MIG rule."""
    mask, compute, counts = state
    if compute + p.compute > model.compute_slices:
        return []
    if dict(counts).get(p.name, 0) >= p.instances:
        return []
    window = (1 << p.size) - 1
    return [s for s in p.starts if not mask & (window << s)]


def _packable(model: MigModel, state: State, p: MigProfile) -> int:
    """How many more instances of ``p`` fit on a GPU in ``state`` (lowest starts first, which
    is optimal for one profile: its windows are aligned to its size)."""
    count = 0
    while True:
        starts = _placements(model, state, p)
        if not starts:
            return count
        state = _add(state, p, starts[0])
        count += 1


def _add(state: State, p: MigProfile, start: int) -> State:
    mask, compute, counts = state
    c = dict(counts)
    c[p.name] = c.get(p.name, 0) + 1
    return (mask | (((1 << p.size) - 1) << start), compute + p.compute, tuple(sorted(c.items())))


def _remove(state: State, p: MigProfile, start: int) -> State:
    mask, compute, counts = state
    c = dict(counts)
    c[p.name] -= 1
    if not c[p.name]:
        del c[p.name]
    return (mask & ~(((1 << p.size) - 1) << start), compute - p.compute, tuple(sorted(c.items())))


@dataclass
class _Gpu:
    instances: list[Instance] = field(default_factory=list)
    #: Every instance (what occupies slices) and the busy ones only (what is allocated).
    state: State = _EMPTY
    busy: State = _EMPTY
    #: The free instances, as sorted (profile, start).
    free: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> tuple[State, State, tuple[tuple[str, int], ...]]:
        return (self.state, self.busy, self.free)


def _overlaps(a_start: int, a_size: int, b_start: int, b_size: int) -> bool:
    return a_start < b_start + b_size and b_start < a_start + a_size


POLICIES = ("fgd", "best-fit", "first-fit")


class MigCluster:
    """MIG-mode GPUs of one model, their instances, and request placement.

    ``distribution`` maps request kinds (a profile name, or ``"<gb>gb/<g>g"``) to their
    frequency; FGD weighs fragmentation by it (default: every profile equally)."""

    def __init__(
        self,
        model: MigModel,
        gpus: int | Iterable[Any],
        *,
        distribution: Mapping[str, float] | None = None,
    ):
        model.check()
        self.model = model
        ids = list(range(gpus)) if isinstance(gpus, int) else list(gpus)
        self.gpus: dict[Any, _Gpu] = {g: _Gpu() for g in ids}
        self._order = {g: i for i, g in enumerate(ids)}
        self._by_state: dict[tuple[State, State, tuple[tuple[str, int], ...]], set[Any]] = {
            (_EMPTY, _EMPTY, ()): set(ids)
        }
        self.owners: dict[str, tuple[Any, Instance]] = {}
        #: Instances created, free instances reused, and free instances destroyed to make room
        #: (reconfigurations of free capacity; a busy instance is never touched).
        self.created = 0
        self.reused = 0
        self.destroyed = 0
        self.set_distribution(distribution)

    # ------------------------------------------------------------- fragmentation
    def set_distribution(self, distribution: Mapping[str, float] | None) -> None:
        self.distribution = dict(distribution or {})
        if not distribution:
            distribution = {p: 1.0 for p in self.model.profiles if not p.endswith("+me")}
        total = float(sum(distribution.values()))
        if total <= 0 or any(not w > 0 for w in distribution.values()):
            raise InvalidState("distribution: expected positive frequencies")
        self._types: list[tuple[float, list[MigProfile]]] = []
        for kind, weight in distribution.items():
            try:
                candidates = request_of_kind(kind).candidates(self.model)
            except Infeasible as exc:
                raise InvalidState(f"distribution: {kind!r}: {exc}") from None
            self._types.append((weight / total, candidates))
        self._frag_cache: dict[State, float] = {}

    def fragmentation(self, state: State) -> float:
        """Expected fragmentation of one GPU, in GPUs (0..1): for each request type, the free
        compute share that instances of that type could not use (all of it when none fits;
        the stranded remainder when some do, e.g. the seventh compute slice next to two
        3g instances), weighted by the type's probability."""
        cached = self._frag_cache.get(state)
        if cached is None:
            c = self.model.compute_slices
            free = c - state[1]
            cached = 0.0
            for weight, profiles in self._types:
                usable = max(_packable(self.model, state, p) * p.compute for p in profiles)
                cached += weight * (free - min(usable, free)) / c
            self._frag_cache[state] = cached
        return cached

    # ------------------------------------------------------------- queries
    def free_share(self) -> float:
        """Unallocated compute (free slices and free instances), in GPUs."""
        c = self.model.compute_slices
        return sum((c - gpu.busy[1]) / c for gpu in self.gpus.values())

    def instances(self) -> list[tuple[Any, Instance]]:
        return [(g, inst) for g, gpu in self.gpus.items() for inst in gpu.instances]

    def check(self) -> None:
        """Every instance obeys the rules of its model (raises InvalidState naming it)."""
        for g, gpu in self.gpus.items():
            state = _EMPTY
            for inst in gpu.instances:
                p = self.model.profile(inst.profile)
                if inst.start not in _placements(self.model, state, p):
                    raise InvalidState(
                        f"GPU {g}: instance {inst.profile} at slice {inst.start} breaks the "
                        f"{self.model.model} placement rules"
                    )
                state = _add(state, p, inst.start)
            if state != gpu.state:
                raise InvalidState(f"GPU {g}: recorded state differs from its instances")
            owned = [i.owner for i in gpu.instances if i.owner is not None]
            if any(self.owners.get(o, (None, None))[0] != g for o in owned):
                raise InvalidState(f"GPU {g}: an instance's owner is not recorded on it")

    # ------------------------------------------------------------- changes
    def place(self, request: Request, policy: str = "fgd") -> tuple[Any, Instance]:
        """Place one request (changing this cluster); raises Infeasible naming the rule when no
        GPU can host it."""
        if policy not in POLICIES:
            raise InvalidState(f"unknown MIG policy {policy!r}; use {', '.join(POLICIES)}")
        if request.name in self.owners:
            raise InvalidState(f"request {request.name!r} is already placed")
        best: tuple[Any, ...] | None = None
        c = self.model.compute_slices
        for (full, busy, free), members in self._by_state.items():
            if not members:
                continue
            before = self.fragmentation(busy)
            first = None
            for p in request.candidates(self.model):
                # (tier, start, free instances destroyed): reuse a free instance, else create
                # one in free slices, else destroy the free instances in the way.
                options: list[tuple[int, int, tuple[tuple[str, int], ...]]] = [
                    (0, start, ()) for name, start in free if name == p.name
                ]
                creatable = set(_placements(self.model, full, p))
                options += [(1, start, ()) for start in sorted(creatable)]
                if free:
                    for start in p.starts:
                        if start in creatable:
                            continue
                        gone = tuple(
                            f
                            for f in free
                            if _overlaps(start, p.size, f[1], self.model.profiles[f[0]].size)
                        )
                        if not gone:
                            continue
                        trimmed = full
                        for name, fstart in gone:
                            trimmed = _remove(trimmed, self.model.profiles[name], fstart)
                        if start in _placements(self.model, trimmed, p):
                            options.append((2, start, gone))
                for tier, start, gone in options:
                    after = _add(busy, p, start)
                    if first is None:
                        first = min(members, key=self._order.__getitem__)
                    free_after = c - after[1]
                    key: tuple[float, ...]
                    if policy == "fgd":
                        key = (
                            tier,
                            self.fragmentation(after) - before,
                            free_after,
                            self._order[first],
                        )
                    elif policy == "best-fit":
                        key = (tier, free_after, self._order[first], start)
                    else:
                        key = (tier, self._order[first], start)
                    if best is None or key < best[0]:
                        best = (key, first, p, start, tier, gone)
        if best is None:
            raise self._why_not(request)
        _, gpu_id, p, start, tier, gone = best
        inst = Instance(p.name, start, request.name)
        kept = [
            i
            for i in self.gpus[gpu_id].instances
            if not (i.owner is None and (i.profile, i.start) in gone)
            and not (tier == 0 and i.owner is None and (i.profile, i.start) == (p.name, start))
        ]
        self._set(gpu_id, [*kept, inst])
        self.owners[request.name] = (gpu_id, inst)
        self.reused += tier == 0
        self.created += tier != 0
        self.destroyed += len(gone)
        return gpu_id, inst

    def _attach(self, gpu_id: Any, inst: Instance) -> None:
        self._set(gpu_id, [*self.gpus[gpu_id].instances, inst])
        if inst.owner is not None:
            self.owners[inst.owner] = (gpu_id, inst)

    def release(self, name: str, *, destroy: bool = False) -> None:
        """End a request: its instance stays as a free instance (``destroy``: is removed)."""
        entry = self.owners.pop(name, None)
        if entry is None:
            raise InvalidState(f"no MIG request named {name!r} is placed")
        gpu_id, inst = entry
        rest = [i for i in self.gpus[gpu_id].instances if i != inst]
        if not destroy:
            rest.append(Instance(inst.profile, inst.start, None))
        self._set(gpu_id, rest)

    def _set(self, gpu_id: Any, instances: list[Instance]) -> None:
        gpu = self.gpus[gpu_id]
        state = busy = _EMPTY
        for inst in instances:
            p = self.model.profile(inst.profile)
            state = _add(state, p, inst.start)
            if inst.owner is not None:
                busy = _add(busy, p, inst.start)
        self._by_state[gpu.key].discard(gpu_id)
        if not self._by_state[gpu.key]:
            del self._by_state[gpu.key]
        gpu.instances, gpu.state, gpu.busy = instances, state, busy
        gpu.free = tuple(sorted((i.profile, i.start) for i in instances if i.owner is None))
        self._by_state.setdefault(gpu.key, set()).add(gpu_id)

    def add_free_instances(self, gpu_id: Any, profiles: Iterable[str]) -> None:
        """Create free instances (a configured geometry) on one GPU, at starts that satisfy
        every rule for all of them together (searched, largest first); all or nothing
        (raises InvalidState when the profiles cannot coexist there)."""
        gpu = self.gpus[gpu_id]
        try:
            wanted = sorted(
                (self.model.profile(n) for n in profiles), key=lambda p: (-p.size, -p.compute)
            )
        except Infeasible as exc:
            raise InvalidState(str(exc)) from None

        def arrange(state: State, rest: list[MigProfile]) -> list[int] | None:
            if not rest:
                return []
            for start in _placements(self.model, state, rest[0]):
                tail = arrange(_add(state, rest[0], start), rest[1:])
                if tail is not None:
                    return [start, *tail]
            return None

        starts = arrange(gpu.state, wanted)
        if starts is None:
            raise InvalidState(
                f"geometry: {', '.join(p.name for p in wanted)} cannot coexist on a "
                f"{self.model.model} GPU"
                + (
                    f" next to {', '.join(i.profile for i in gpu.instances)}"
                    if gpu.instances
                    else ""
                )
                + " under its placement rules"
            )
        added = [Instance(p.name, s, None) for p, s in zip(wanted, starts, strict=True)]
        self._set(gpu_id, [*gpu.instances, *added])

    def add_existing_instances(self, gpu_id: Any, rows: Iterable[tuple[str, int, int]]) -> None:
        """Record instances that exist on one GPU (``nvidia-smi mig -lgi``: profile, start,
        size in memory slices) as free instances; all or nothing (InvalidState naming the
        instance that breaks the rules)."""
        gpu = self.gpus[gpu_id]
        state, added = gpu.state, list[Instance]()
        for profile, start, size in rows:
            p = self.model.profiles.get(profile)
            if p is None:
                raise InvalidState(
                    f"instance {profile}: not a {self.model.model} profile "
                    f"({', '.join(self.model.profiles)})"
                )
            if size != p.size or start not in _placements(self.model, state, p):
                raise InvalidState(
                    f"instance {profile} at {start}:{size} breaks the {self.model.model} "
                    f"placement rules (starts {sorted(p.starts)}, size {p.size}) next to "
                    f"{', '.join(f'{i.profile}@{i.start}' for i in [*gpu.instances, *added]) or 'nothing'}"
                )
            added.append(Instance(p.name, start, None))
            state = _add(state, p, start)
        self._set(gpu_id, [*gpu.instances, *added])

    def _why_not(self, request: Request) -> Infeasible:
        """The Infeasible for a request no GPU can host, with its explanation: capacity (the
        most free compute on any GPU) and the MIG start rule (GPUs with that compute but no
        free window at an allowed start)."""
        profiles = request.candidates(self.model)
        names = ", ".join(p.name for p in profiles)
        free_compute = max(
            (self.model.compute_slices - k[1][1] for k, m in self._by_state.items() if m),
            default=0,
        )
        need = min(p.compute for p in profiles)
        roomy = sum(
            len(m) for k, m in self._by_state.items() if self.model.compute_slices - k[1][1] >= need
        )
        binding_capacity = free_compute < need
        constraints = [
            Constraint(
                "capacity",
                "free compute slices",
                "gpu",
                need,
                free_compute,
                binding_capacity,
                f"the GPU with the most free compute has {free_compute} of "
                f"{self.model.compute_slices} slices; {names} needs {need}",
            ),
            Constraint(
                "mig",
                "MIG start rule",
                "gpu",
                1,
                0,
                not binding_capacity,
                f"{roomy} GPUs have {need} free compute slices but no free window of "
                f"{min(p.size for p in profiles)} memory slices at an allowed start "
                f"({'; '.join(f'{p.name}: {sorted(p.starts)}' for p in profiles)})",
            ),
        ]
        if binding_capacity:
            rule = (
                f"capacity: no GPU has {need} free compute slices (the most free is {free_compute})"
            )
        else:
            rule = (
                "MIG start rule: GPUs with enough free compute have no free window at an "
                f"allowed start ({'; '.join(f'{p.name} starts {set(p.starts)}' for p in profiles)})"
            )
        exc = Infeasible(
            f"request {request.name!r} ({names}) cannot be placed on {len(self.gpus)} "
            f"{self.model.model} GPUs: {rule}"
        )
        exc.explanation = Explanation(request.name, 1, False, constraints, str(exc))
        return exc

    # ------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.model,
            # Rules read from a listing travel with the state; built-in ones by name.
            **({} if self.model.built_in else {"rules": self.model.to_dict()}),
            **({"distribution": self.distribution} if self.distribution else {}),
            "gpus": {
                str(g): [
                    {"profile": i.profile, "start": i.start, "owner": i.owner}
                    for i in gpu.instances
                ]
                for g, gpu in self.gpus.items()
            },
        }


# --------------------------------------------------------------------- in a cluster state
#: The job name under which a cluster state holds its MIG-mode GPUs, so that no whole-GPU
#: solver gives them to a training job.
MIG_JOB = "mig"


def gpu_model_of(state: Any, gpu: int) -> str | None:
    """A GPU's model: its ``model`` attribute (``gpuplace.policy``), else its node type's."""
    column = attribute_table(state.topology, state.effective_policy()).column("model")
    if column and column[gpu] is not None:
        return column[gpu]
    topo = state.topology
    return topo.node_types[topo.host_types[int(topo.host_of_gpu[gpu])]].gpu_model


def enable(
    state: Any,
    gpus: Iterable[int],
    *,
    model: MigModel | None = None,
    geometry: Iterable[str] = (),
    existing: Mapping[int, Iterable[tuple[str, int, int]]] | None = None,
) -> MigCluster:
    """Put free GPUs of ``state`` in MIG mode (all or nothing): they leave whole-GPU placement
    (held by the job ``mig``) and join ``state.mig``, each configured with the free instances
    ``geometry`` lists (profile names; none: left unpartitioned, instances are created per
    request), or with the instances that already exist on them (``existing``: GPU id ->
    ``nvidia-smi mig -lgi`` rows, recorded free). The rules come from ``model`` or from the
    GPUs' model name (built-in tables). Returns ``state.mig``."""
    ids = sorted({int(g) for g in gpus})
    if not ids:
        raise InvalidState("name at least one GPU to put in MIG mode")
    current: MigCluster | None = getattr(state, "mig", None)
    if model is None:
        if current is not None:
            model = current.model
        else:
            names = {gpu_model_of(state, g) for g in ids}
            only = next(iter(names)) if len(names) == 1 else None
            if only is None:
                raise InvalidState(
                    f"the GPUs have models {sorted(map(str, names))}; give one model's GPUs, or "
                    "the rules (a listing read with gpuplace.io.read_nvidia_smi_mig)"
                )
            model = model_for(only)
    layout = list(geometry)
    if layout:  # refuse a geometry that breaks the rules before changing anything
        MigCluster(model, 1).add_free_instances(0, layout)
    existing = {int(g): list(rows) for g, rows in (existing or {}).items()}
    for g, rows in existing.items():
        if g not in ids:
            raise InvalidState(f"instances listed for GPU {g}, which is not being enabled")
        try:
            MigCluster(model, 1).add_existing_instances(0, rows)
        except InvalidState as exc:
            raise InvalidState(f"GPU {g}: {exc}") from None
    if current is not None and current.model != model:
        raise InvalidState(
            f"the state's MIG GPUs are {current.model.model}; cannot add {model.model} GPUs"
        )
    held = list(state.job_gpus(MIG_JOB)) if state.job_gpus(MIG_JOB) is not None else []
    already = set(int(g) for g in held)
    new = [g for g in ids if g not in already]
    taken = [g for g in new if not state.free_mask()[g]]
    if taken:
        raise InvalidState(f"GPU {taken[0]} is not free; only free GPUs can enter MIG mode")
    if held:
        state.release(MIG_JOB)
    try:
        state.allocate(name=MIG_JOB, gpus=sorted(already | set(new)))
    except InvalidState:
        if held:
            state.allocate(name=MIG_JOB, gpus=held)
        raise
    cluster = MigCluster(model, sorted(already | set(new)))
    if current is not None:
        cluster.set_distribution(current.distribution)
        for g, inst in current.instances():
            cluster._attach(g, inst)
    for g in new:
        if layout:
            cluster.add_free_instances(g, layout)  # checked on an empty GPU above
        if g in existing:
            cluster.add_existing_instances(g, existing[g])
    state.mig = cluster
    return cluster


def restore(state: Any, raw: Any, c: Any) -> None:
    """Rebuild ``state.mig`` from a state file's ``mig`` section, checking every instance
    against the start rules (raises InvalidState naming the entry)."""
    doc = c.mapping(raw, "mig")
    name = c.string(doc.get("model"), "mig.model")
    if "rules" in doc:
        model = MigModel.from_dict(doc["rules"], c, "mig.rules")
        if model.model != name:
            raise c.fail("mig.rules.model", f"{model.model!r} differs from mig.model {name!r}")
    else:
        try:
            model = model_for(name)
        except InvalidTopology as exc:
            raise c.fail("mig.model", str(exc)) from None
    gpus = c.mapping(doc.get("gpus", {}), "mig.gpus")
    ids = []
    for key in gpus:
        if not key.isdigit() or int(key) >= state.topology.num_gpus:
            raise c.fail(f"mig.gpus.{key}", "expected a GPU id of the cluster")
        ids.append(int(key))
    held = state.job_gpus(MIG_JOB)
    if sorted(ids) != sorted(int(g) for g in (held if held is not None else [])):
        raise c.fail(
            "mig.gpus", f"must name exactly the GPUs the job {MIG_JOB!r} holds (the MIG-mode GPUs)"
        )
    cluster = MigCluster(model, sorted(ids))
    if "distribution" in doc:
        dist = c.mapping(doc["distribution"], "mig.distribution")
        cluster.set_distribution(
            {k: c.number(v, f"mig.distribution.{k}", positive=True) for k, v in dist.items()}
        )
    for key, entries in gpus.items():
        g = int(key)
        for i, entry in enumerate(c.sequence(entries, f"mig.gpus.{key}")):
            p = f"mig.gpus.{key}[{i}]"
            e = c.mapping(entry, p)
            prof = c.string(e.get("profile"), f"{p}.profile")
            start = c.integer(e.get("start"), f"{p}.start", minimum=0)
            owner = None if e.get("owner") is None else c.string(e["owner"], f"{p}.owner")
            if prof not in model.profiles:
                raise c.fail(
                    f"{p}.profile", f"not a {model.model} profile ({', '.join(model.profiles)})"
                )
            if start not in _placements(model, cluster.gpus[g].state, model.profiles[prof]):
                raise c.fail(p, f"{prof} at slice {start} breaks the {model.model} placement rules")
            if owner is not None and owner in cluster.owners:
                raise c.fail(f"{p}.owner", f"request {owner!r} appears twice")
            cluster._attach(g, Instance(prof, start, owner))
    state.mig = cluster
