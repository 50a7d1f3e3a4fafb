"""What a shared-GPU workload asks for and the nodes that serve it.

A :class:`SharedRequest` (an inference pod, a notebook, a small job) asks for CPU (milli-CPU),
memory (MiB) and either no GPU, a *share* of one GPU (``gpus=1``, ``gpu_milli`` < 1000
milli-GPUs), or whole GPUs (``gpu_milli`` 1000). It may accept only some GPU models, and only
some sharing (``isolation``): ``any``, ``mig`` (a MIG instance: memory and compute isolated in
hardware) or ``fractional`` (a time-sliced share of a whole GPU, as Alibaba's GPU-sharing
clusters and Kubernetes GPU-sharing device plugins run them). ``gpu_memory_mib`` (per GPU)
picks its MIG profile with the share. A :class:`SharedNode` has CPU, memory and GPUs of one
model.

:func:`typical_mix` is the workload's distribution of *typical* requests that FGD weighs
fragmentation by (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC'23, section 4.2).

How such requests are packed onto nodes: :mod:`gpuplace.cluster.share` (the cluster) and
:mod:`gpuplace.placement.share` (the policies).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuplace._util.documents import Checker
from gpuplace.enums import Isolation
from gpuplace.errors import InvalidJob, InvalidTopology

__all__ = ["MILLI", "SharedNode", "SharedRequest", "node_models", "typical_mix"]

#: Milli-GPUs in one GPU.
MILLI = 1000

#: Largest request or node figure accepted (milli-CPU, MiB): far above any machine, small enough
#: for the core's integers.
_MAX = 2**40


@dataclass(frozen=True)
class SharedNode:
    """A node: ``cpu_milli`` CPU, ``memory_mib`` memory, ``gpus`` GPUs of ``model``."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    model: str | None = None

    def __post_init__(self) -> None:
        c = Checker(InvalidTopology, None)
        c.string(self.name, "node name")
        c.integer(self.cpu_milli, f"node {self.name}: cpu_milli", minimum=0, maximum=2**32 - 1)
        c.integer(self.memory_mib, f"node {self.name}: memory_mib", minimum=0, maximum=_MAX)
        c.integer(self.gpus, f"node {self.name}: gpus", minimum=0, maximum=1024)
        if self.gpus and not self.model:
            raise InvalidTopology(f"node {self.name}: {self.gpus} GPUs but no GPU model")
        if not self.gpus and self.model:
            object.__setattr__(self, "model", None)


@dataclass(frozen=True)
class SharedRequest:
    """A request for CPU, memory and a share of a GPU or whole GPUs (see the module docs).

    ``gpu_milli`` is per GPU: 1-1000 with one GPU, 1000 with several (0 or omitted with GPUs
    means whole GPUs). ``models``: the GPU models it may run on (empty: any). ``gpu_memory_mib``
    and ``isolation``: see the module docs."""

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    models: tuple[str, ...] = field(default=())
    gpu_memory_mib: int = 0
    isolation: str = "any"

    def __post_init__(self) -> None:
        c = Checker(InvalidJob, None)
        where = f"request {self.name!r}"
        c.string(self.name, "request name")
        c.integer(self.cpu_milli, f"{where}: cpu_milli", minimum=0, maximum=2**32 - 1)
        c.integer(self.memory_mib, f"{where}: memory_mib", minimum=0, maximum=_MAX)
        c.integer(self.gpus, f"{where}: gpus", minimum=0, maximum=1024)
        c.integer(self.gpu_milli, f"{where}: gpu_milli", minimum=0, maximum=MILLI)
        if self.gpus and not self.gpu_milli:
            object.__setattr__(self, "gpu_milli", MILLI)
        if not self.gpus and self.gpu_milli:
            raise InvalidJob(f"{where}: gpu_milli {self.gpu_milli} without a GPU (gpus is 0)")
        if self.gpus > 1 and self.gpu_milli != MILLI:
            raise InvalidJob(
                f"{where}: gpu_milli {self.gpu_milli} on {self.gpus} GPUs; a share is of one "
                f"GPU, several GPUs are whole ({MILLI})"
            )
        models = tuple(self.models)
        for m in models:
            c.string(m, f"{where}: models")
        object.__setattr__(self, "models", tuple(dict.fromkeys(models)))
        c.integer(self.gpu_memory_mib, f"{where}: gpu_memory_mib", minimum=0, maximum=_MAX)
        try:
            Isolation.from_label(self.isolation)
        except InvalidJob as exc:
            raise InvalidJob(f"{where}: {exc}") from None
        if not self.gpus and (self.gpu_memory_mib or self.isolation != "any"):
            raise InvalidJob(f"{where}: GPU memory or isolation without a GPU (gpus is 0)")

    @property
    def shared(self) -> bool:
        """A share of one GPU."""
        return self.gpus == 1 and self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.gpus * self.gpu_milli

    @property
    def kind(self) -> str:
        """``no GPU``, ``share`` or ``N GPU``."""
        if not self.gpus:
            return "no GPU"
        return "share" if self.shared else f"{self.gpus} GPU"

    @property
    def shape(self) -> tuple[int, int, int, int, tuple[str, ...], int, str]:
        """What it asks, without its name: (cpu_milli, memory_mib, gpus, gpu_milli, models,
        gpu_memory_mib, isolation), the constructor's order."""
        return (
            self.cpu_milli,
            self.memory_mib,
            self.gpus,
            self.gpu_milli,
            self.models,
            self.gpu_memory_mib,
            self.isolation,
        )

    @property
    def row(self) -> tuple[int, int, int, int, int, int]:
        """What it asks as the core takes it, but the models: (cpu_milli, memory_mib, gpus,
        gpu_milli, gpu_memory_mib, isolation code)."""
        return (
            self.cpu_milli,
            self.memory_mib,
            self.gpus,
            self.gpu_milli,
            self.gpu_memory_mib,
            int(Isolation.from_label(self.isolation)),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "cpu_milli": self.cpu_milli}
        if self.memory_mib:
            out["memory_mib"] = self.memory_mib
        if self.gpus:
            out["gpus"] = self.gpus
            out["gpu_milli"] = self.gpu_milli
        if self.models:
            out["models"] = list(self.models)
        if self.gpu_memory_mib:
            out["gpu_memory_mib"] = self.gpu_memory_mib
        if self.isolation != "any":
            out["isolation"] = self.isolation
        return out

    @classmethod
    def from_dict(cls, raw: Any, c: Checker, path: str, name: str | None = None) -> SharedRequest:
        """A request from a mapping: ``name``, ``cpu_milli`` (or ``cpu`` in cores),
        ``memory_mib`` (or ``memory_gib``), ``gpus``, ``gpu_milli`` (or ``gpu``: a share such
        as 0.25, or a number of whole GPUs), ``models``, ``gpu_memory_mib`` (or
        ``gpu_memory_gib``), ``isolation``."""
        d = c.mapping(raw, path)
        c.keys(
            d,
            path,
            {
                "name",
                "cpu_milli",
                "cpu",
                "memory_mib",
                "memory_gib",
                "gpus",
                "gpu_milli",
                "gpu",
                "models",
                "gpu_memory_mib",
                "gpu_memory_gib",
                "isolation",
                "count",
            },
        )
        title = name if name is not None else c.string(d.get("name"), f"{path}.name")
        cpu = _one_of(c, d, path, "cpu_milli", "cpu", 1000)
        memory = _one_of(c, d, path, "memory_mib", "memory_gib", 1024)
        if "gpu" in d:
            if "gpus" in d or "gpu_milli" in d:
                raise c.fail(path, "give gpu, or gpus and gpu_milli, not both")
            amount = c.number(d["gpu"], f"{path}.gpu", minimum=0)
            if 0 < amount < 1:
                gpus, milli = 1, round(amount * MILLI)
                if milli < 1:
                    raise c.fail(f"{path}.gpu", f"{amount} is less than one milli-GPU")
            elif float(amount).is_integer():
                gpus, milli = int(amount), MILLI if amount else 0
            else:
                raise c.fail(f"{path}.gpu", f"expected a share below 1 or whole GPUs, got {amount}")
        else:
            gpus = c.integer(d.get("gpus", 0), f"{path}.gpus", minimum=0, maximum=1024)
            milli = c.integer(
                d.get("gpu_milli", MILLI if gpus else 0),
                f"{path}.gpu_milli",
                minimum=0,
                maximum=MILLI,
            )
        models = tuple(
            c.string(m, f"{path}.models") for m in c.sequence(d.get("models", []), f"{path}.models")
        )
        gpu_memory = _one_of(c, d, path, "gpu_memory_mib", "gpu_memory_gib", 1024)
        isolation = c.string(d.get("isolation", "any"), f"{path}.isolation")
        try:
            return cls(title, cpu, memory, gpus, milli, models, gpu_memory, isolation)
        except InvalidJob as exc:
            raise c.fail(path, str(exc)) from None


def _one_of(c: Checker, d: Mapping[str, Any], path: str, exact: str, scaled: str, unit: int) -> int:
    if exact in d and scaled in d:
        raise c.fail(path, f"give {exact} or {scaled}, not both")
    if exact in d:
        return c.integer(d[exact], f"{path}.{exact}", minimum=0, maximum=_MAX)
    if scaled in d:
        return round(c.number(d[scaled], f"{path}.{scaled}", minimum=0) * unit)
    return 0


def typical_mix(
    requests: Iterable[SharedRequest], coverage: float = 0.95
) -> list[tuple[SharedRequest, float]]:
    """FGD's typical requests: the request shapes (CPU, milli-GPUs per GPU, GPUs, models) by
    frequency, most frequent first, until they cover ``coverage`` of the requests; each with
    its count as weight, and the mean memory of its requests. Ties in frequency go to the
    larger shape (as the authors' ``GetTypicalPods``, ``pkg/utils/frag.go``, sorts)."""
    if not 0 < coverage <= 1:
        raise InvalidJob(f"typical mix: coverage {coverage} is not in (0, 1]")
    counts: Counter[tuple[int, int, int, str, int, str]] = Counter()
    memory: defaultdict[tuple[int, int, int, str, int, str], list[int]] = defaultdict(list)
    models: dict[str, tuple[str, ...]] = {}
    total = 0
    for r in requests:
        spec = "|".join(r.models)
        models[spec] = r.models
        key = (r.cpu_milli, r.gpu_milli, r.gpus, spec, r.gpu_memory_mib, r.isolation)
        counts[key] += 1
        memory[key].append(r.memory_mib)
        total += 1
    if not total:
        raise InvalidJob("typical mix: no requests")
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    out: list[tuple[SharedRequest, float]] = []
    covered = 0
    for key, count in ranked:
        if covered >= coverage * total:
            break
        cpu, milli, gpus, spec, gpu_memory, isolation = key
        mem = round(sum(memory[key]) / count)
        typical = SharedRequest(
            f"typical-{len(out)}", cpu, mem, gpus, milli, models[spec], gpu_memory, isolation
        )
        out.append((typical, float(count)))
        covered += count
    return out


def node_models(nodes: Sequence[SharedNode]) -> list[str]:
    """The GPU models of ``nodes``, sorted."""
    return sorted({n.model for n in nodes if n.model})
