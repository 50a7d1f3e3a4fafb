"""MIG: per-model profiles and their placement rules, and what a MIG request asks for.

**Rules.** A MIG-capable GPU has ``memory_slices`` memory slices (8 on A100/H100/H200, 4 on
A30) and ``compute_slices`` compute slices (7; 4 on A30). A GPU instance of a profile
occupies ``size`` consecutive memory slices starting at one of the profile's allowed
``starts`` (what ``nvidia-smi mig -lgipp`` prints as ``{0,2,4}:2``) and ``compute`` compute
slices; instances never overlap, the compute slices in use never exceed the GPU's, and a
profile has at most ``instances`` instances (``+me`` media profiles: one). The built-in tables
(:data:`MODELS`) are NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): A100
40 GB and 80 GB, H100 80 GB and 94 GB, H200 141 GB, with the placements of the guide's
figures; :func:`gpuplace.io.read_nvidia_smi_mig` builds the same rules from a real listing,
so a new GPU needs no code change.

How MIG GPUs of a cluster are packed with requests: :mod:`gpuplace.cluster.mig`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplace._util.documents import Checker
from gpuplace.errors import Infeasible, InvalidTopology

__all__ = ["GUIDE", "MODELS", "MigModel", "MigProfile", "Request", "model_for", "profile_for_share"]

GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"
_NAME = re.compile(r"^(?:MIG\s+)?(\d+)g\.(\d+)gb(\+me)?$", re.IGNORECASE)


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile: ``1g.10gb`` has 1 compute slice and ~10 GB."""

    name: str
    compute: int
    size: int  # memory slices
    starts: tuple[int, ...]
    memory_gb: float
    instances: int
    profile_id: int | None = None

    @property
    def media(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True)
class MigModel:
    """The MIG rules of one GPU model."""

    model: str
    memory_slices: int
    compute_slices: int
    profiles: Mapping[str, MigProfile]
    source: str = GUIDE

    def profile(self, name: str) -> MigProfile:
        key = name.removeprefix("MIG ").strip()
        if key not in self.profiles:
            raise Infeasible(
                f"{self.model} has no MIG profile {name!r} (profiles: {', '.join(self.profiles)})"
            )
        return self.profiles[key]

    @property
    def built_in(self) -> bool:
        """One of the built-in tables (:data:`MODELS`), as opposed to rules read from a
        listing."""
        return MODELS.get(self.model) == self

    def to_dict(self) -> dict[str, Any]:
        """The rules as a document (what a state file keeps for rules read from a listing)."""
        return {
            "model": self.model,
            "memory_slices": self.memory_slices,
            "compute_slices": self.compute_slices,
            "source": self.source,
            "profiles": [
                {
                    "name": p.name,
                    "compute": p.compute,
                    "size": p.size,
                    "starts": list(p.starts),
                    "memory_gb": p.memory_gb,
                    "instances": p.instances,
                    **({} if p.profile_id is None else {"profile_id": p.profile_id}),
                }
                for p in self.profiles.values()
            ],
        }

    @classmethod
    def from_dict(cls, raw: Any, c: Checker, path: str) -> MigModel:
        """Rules from :meth:`to_dict`, checked (the error names the field)."""
        d = c.mapping(raw, path)
        c.keys(d, path, {"model", "memory_slices", "compute_slices", "source", "profiles"})
        profiles: dict[str, MigProfile] = {}
        for i, entry in enumerate(c.sequence(d.get("profiles"), f"{path}.profiles")):
            p = f"{path}.profiles[{i}]"
            e = c.mapping(entry, p)
            c.keys(
                e, p, {"name", "compute", "size", "starts", "memory_gb", "instances", "profile_id"}
            )
            name = c.string(e.get("name"), f"{p}.name")
            if name in profiles:
                raise c.fail(f"{p}.name", f"profile {name} appears twice")
            starts = tuple(
                c.integer(v, f"{p}.starts", minimum=0, maximum=63)
                for v in c.sequence(e.get("starts"), f"{p}.starts")
            )
            if not starts:
                raise c.fail(f"{p}.starts", "expected at least one start")
            profiles[name] = MigProfile(
                name,
                c.integer(e.get("compute"), f"{p}.compute", minimum=1, maximum=64),
                c.integer(e.get("size"), f"{p}.size", minimum=1, maximum=64),
                starts,
                c.number(e.get("memory_gb", 0), f"{p}.memory_gb", minimum=0),
                c.integer(e.get("instances", 1), f"{p}.instances", minimum=1, maximum=64),
                None
                if e.get("profile_id") is None
                else c.integer(e["profile_id"], f"{p}.profile_id", minimum=0),
            )
        if not profiles:
            raise c.fail(f"{path}.profiles", "expected at least one profile")
        model = cls(
            c.string(d.get("model"), f"{path}.model"),
            c.integer(d.get("memory_slices"), f"{path}.memory_slices", minimum=1, maximum=64),
            c.integer(d.get("compute_slices"), f"{path}.compute_slices", minimum=1, maximum=64),
            profiles,
            c.string(d.get("source", GUIDE), f"{path}.source"),
        )
        try:
            model.check()
        except InvalidTopology as exc:
            raise c.fail(path, str(exc)) from None
        return model

    def check(self) -> None:
        """Every placement fits in the GPU (raises InvalidTopology)."""
        for p in self.profiles.values():
            if p.compute > self.compute_slices:
                raise InvalidTopology(
                    f"{self.model}: profile {p.name} has {p.compute} compute slices; the GPU has "
                    f"{self.compute_slices}"
                )
            for s in p.starts:
                if s < 0 or s + p.size > self.memory_slices:
                    raise InvalidTopology(
                        f"{self.model}: profile {p.name} placement {s}:{p.size} exceeds the "
                        f"{self.memory_slices} memory slices"
                    )


def _guide_model(model: str, sizes: tuple[int, int, int, int, int, int]) -> MigModel:
    """The A100/H100/H200 layout of the guide with the GB figures of one memory size:
    (1g, 1g double memory, 2g, 3g, 4g, 7g)."""
    one, one2, two, three, four, seven = sizes
    rows = [
        (f"1g.{one}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), one, 7, 19),
        (f"1g.{one}gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), one, 1, 20),
        (f"1g.{one2}gb", 1, 2, (0, 2, 4, 6), one2, 4, 15),
        (f"2g.{two}gb", 2, 2, (0, 2, 4), two, 3, 14),
        (f"3g.{three}gb", 3, 4, (0, 4), three, 2, 9),
        (f"4g.{four}gb", 4, 4, (0,), four, 1, 5),
        (f"7g.{seven}gb", 7, 8, (0,), seven, 1, 0),
    ]
    profiles = {
        name: MigProfile(name, g, size, starts, float(gb), n, pid)
        for name, g, size, starts, gb, n, pid in rows
    }
    return MigModel(model, 8, 7, profiles)


#: Built-in MIG rules, by GPU model (NVIDIA MIG User Guide, "Supported MIG Profiles").
MODELS: dict[str, MigModel] = {
    m.model: m
    for m in (
        _guide_model("A100-40GB", (5, 10, 10, 20, 20, 40)),
        _guide_model("A100-80GB", (10, 20, 20, 40, 40, 80)),
        _guide_model("H100-80GB", (10, 20, 20, 40, 40, 80)),
        _guide_model("H100-94GB", (12, 24, 24, 47, 47, 94)),
        _guide_model("H200-141GB", (18, 35, 35, 71, 71, 141)),
    )
}


def model_for(gpu_model: str) -> MigModel:
    """The built-in rules for a GPU model name such as ``H100-SXM5-80GB`` or ``A100-80GB``."""
    text = gpu_model.upper()
    for key, model in MODELS.items():
        family, memory = key.split("-")
        if family in text and memory in text:
            return model
    raise InvalidTopology(
        f"no built-in MIG rules for GPU model {gpu_model!r} (built in: {', '.join(MODELS)}); "
        "read them from `nvidia-smi mig -lgip` and `-lgipp` with gpuplace.io.read_nvidia_smi_mig"
    )


# --------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Request:
    """An inference request: a profile name, or a minimum of memory (GB) and compute slices
    (served by the smallest profile that has both)."""

    name: str
    profile: str | None = None
    min_memory_gb: float = 0.0
    min_compute: int = 1

    def candidates(self, model: MigModel) -> list[MigProfile]:
        if self.profile is not None:
            return [model.profile(self.profile)]
        fits = [
            p
            for p in model.profiles.values()
            if not p.media and p.memory_gb >= self.min_memory_gb and p.compute >= self.min_compute
        ]
        if not fits:
            raise Infeasible(
                f"request {self.name!r}: no {model.model} MIG profile has >= "
                f"{self.min_memory_gb:g} GB and >= {self.min_compute} compute slices"
            )
        smallest = min((p.compute, p.size) for p in fits)
        return [p for p in fits if (p.compute, p.size) == smallest]

    def kind(self) -> str:
        """What the request distribution counts: the profile, or the minimums."""
        return self.profile or f"{self.min_memory_gb:g}gb/{self.min_compute}g"


# --------------------------------------------------------------------- GPU state


def request_of_kind(kind: str) -> Request:
    m = re.match(r"^([\d.]+)gb/(\d+)g$", kind)
    if m:
        return Request(kind, None, float(m.group(1)), int(m.group(2)))
    return Request(kind, kind)


def profile_for_share(model: MigModel, share: float) -> MigProfile:
    """The profile nearest to a GPU share (``gpu_milli / 1000``): the one whose compute
    fraction is closest, ties to the larger (a pod never gets less than it asked by more than
    half a slice); media profiles are never chosen."""
    options = [p for p in model.profiles.values() if not p.media]
    # Among profiles with the same compute, the one with the least memory.
    by_compute: dict[int, MigProfile] = {}
    for p in sorted(options, key=lambda p: (p.compute, p.size)):
        by_compute.setdefault(p.compute, p)
    target = share * model.compute_slices
    return min(by_compute.values(), key=lambda p: (abs(p.compute - target), -p.compute))
