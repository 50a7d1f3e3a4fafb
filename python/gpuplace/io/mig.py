"""Reader of ``nvidia-smi mig -lgip`` and ``nvidia-smi mig -lgipp`` into MIG placement rules.

``-lgip`` lists the GPU-instance profiles (name, ID, instances free/total, memory in GiB,
SMs, ...); ``-lgipp`` lists each profile ID's allowed placements as ``{starts}:size`` in
memory slices (``Placements:``, or ``Placement :`` when there is one start). Both may come in
one file (one after the other, as a session transcript) or in two. Tables from drivers R450
to R550+ differ in width, in which profiles exist (``1g.10gb`` on A100 40 GB arrived later,
``+me`` profiles from R470) and in the GiB figures; the reader keys on the row pattern, not
on column positions. Only the first GPU's profiles are read; a listing whose GPUs disagree is
refused (pass one GPU's listing, ``-i N``).
"""

from __future__ import annotations

import re

from gpuplace.errors import InvalidTopology
from gpuplace.io._common import Source, fail, guarded, read_source
from gpuplace.model.mig import MODELS, MigModel, MigProfile, model_for

__all__ = ["read_nvidia_smi_mig", "read_nvidia_smi_mig_instances"]

_LGIP_ROW = re.compile(
    r"^\|?\s*(\d{1,9})\s+MIG\s+(\d{1,2}g\.\d{1,4}gb(?:\+me)?)\s+(\d{1,9})\s+(\d{1,9})\s*/\s*(\d{1,9})\s+([\d.]{1,12})\s",
    re.IGNORECASE,
)
_LGIPP_ROW = re.compile(
    r"^\s*GPU\s+(\d{1,9})\s+Profile\s+ID\s+(\d{1,9})\s+Placements?\s*:\s*\{([^}]*)\}\s*:\s*(\d{1,9})",
    re.IGNORECASE,
)
_NAME = re.compile(r"^(\d{1,9})g\.(\d{1,9})gb(\+me)?$", re.IGNORECASE)
_MAX_SLICES = 64


@guarded
def read_nvidia_smi_mig(
    source: Source, placements: Source | None = None, *, model: str | None = None
) -> MigModel:
    """MIG rules from ``nvidia-smi mig -lgip`` (``source``) and ``-lgipp`` (``placements``,
    or the same file). ``model`` names the GPU model (default: named after the full profile,
    e.g. ``MIG 7g.94gb GPU``). Raises InvalidTopology naming the file and line."""
    name, text = read_source(source)
    sources = [(name, text)]
    if placements is not None:
        sources.append(read_source(placements))
    profiles: dict[int, tuple[str, float, int, str, int]] = {}
    starts: dict[int, tuple[tuple[int, ...], int, str, int]] = {}
    gpu_seen: int | None = None
    for src, body in sources:
        for lineno, line in enumerate(body.splitlines(), 1):
            row = _LGIP_ROW.match(line)
            if row:
                gpu = int(row.group(1))
                if gpu_seen is None:
                    gpu_seen = gpu
                if gpu != gpu_seen:
                    continue
                pname, pid, total = row.group(2).lower(), int(row.group(3)), int(row.group(5))
                if total < 1:
                    raise fail(src, lineno, f"profile {pname}: expected at least 1 instance")
                prev = profiles.get(pid)
                if prev is not None and prev[0] != pname:
                    raise fail(src, lineno, f"profile ID {pid} named both {prev[0]} and {pname}")
                profiles[pid] = (pname, float(row.group(6)), total, src, lineno)
                continue
            row = _LGIPP_ROW.match(line)
            if row:
                gpu, pid, size = int(row.group(1)), int(row.group(2)), int(row.group(4))
                if gpu_seen is None:
                    gpu_seen = gpu
                if gpu != gpu_seen:
                    continue
                items = [s.strip() for s in row.group(3).split(",") if s.strip()]
                if not items or not all(s.isascii() and s.isdigit() and len(s) <= 9 for s in items):
                    raise fail(
                        src, lineno, f"placements: expected {{n,n,...}}:size, got {line.strip()!r}"
                    )
                values = tuple(int(s) for s in items)
                if not 1 <= size <= _MAX_SLICES or max(values) + size > _MAX_SLICES:
                    raise fail(src, lineno, f"placement {line.strip()!r} is out of range")
                starts[pid] = (values, size, src, lineno)
    if not profiles:
        raise fail(name, None, "no `nvidia-smi mig -lgip` profile rows (| 0  MIG 1g.10gb  19 ...)")
    if not starts:
        builtin = _builtin_for(profiles, model)
        if builtin is None:
            raise fail(
                name,
                None,
                "no `nvidia-smi mig -lgipp` placement rows (GPU 0 Profile ID 19 Placements: "
                "...), and the profiles listed are not those of a GPU model with built-in "
                f"placements ({', '.join(MODELS)})",
            )
        return builtin
    out: dict[str, MigProfile] = {}
    for pid, (pname, gib, total, src, lineno) in profiles.items():
        if pid not in starts:
            raise fail(src, lineno, f"profile {pname} (ID {pid}) has no -lgipp placement row")
        values, size, _, _ = starts[pid]
        parsed = _NAME.match(pname)
        if parsed is None:  # the row pattern admits only names that match
            raise fail(src, lineno, f"unexpected profile name {pname!r}")
        out[pname] = MigProfile(
            pname, int(parsed.group(1)), size, values, gib, 1 if parsed.group(3) else total, pid
        )
    for pid, (_, _, src, lineno) in starts.items():
        if pid not in profiles:
            raise fail(
                src, lineno, f"placement row for profile ID {pid}, which -lgip does not list"
            )
    # The full-GPU profile (most compute) spans every memory slice; placements of the
    # others must stay inside it.
    full = max(out.values(), key=lambda p: (p.compute, p.size))
    memory_slices = full.size
    rules = MigModel(
        model or f"MIG {full.name} GPU",
        memory_slices,
        full.compute,
        dict(sorted(out.items(), key=lambda kv: (kv[1].compute, kv[1].size, kv[0]))),
        source=f"nvidia-smi mig -lgip/-lgipp ({name})",
    )
    try:
        rules.check()
    except Exception as exc:  # InvalidTopology without the file name
        raise fail(name, None, str(exc)) from None
    return rules


def _builtin_for(
    profiles: dict[int, tuple[str, float, int, str, int]], model: str | None
) -> MigModel | None:
    """The built-in placement rules (NVIDIA's MIG guide) for a ``-lgip`` listing without its
    ``-lgipp`` placements: those of ``model`` when given, else of the GPU model whose profiles
    (names and IDs) include every listed one; restricted to the listed profiles (an older
    driver offers fewer). None when no built-in model fits."""
    listed = {pname: pid for pid, (pname, *_rest) in profiles.items()}
    if model is not None:
        try:
            candidates = [model_for(model)]
        except InvalidTopology:
            return None
    else:
        candidates = list(MODELS.values())
    for rules in candidates:
        if all(
            pname in rules.profiles and rules.profiles[pname].profile_id == pid
            for pname, pid in listed.items()
        ):
            kept = {n: p for n, p in rules.profiles.items() if n in listed}
            full = max(kept.values(), key=lambda p: (p.compute, p.size))
            if full.compute != rules.compute_slices:
                return None  # the full-GPU profile is not listed: the geometry is unknown
            return MigModel(
                model or rules.model,
                rules.memory_slices,
                rules.compute_slices,
                kept,
                source=f"nvidia-smi mig -lgip; placements of {rules.model} (NVIDIA MIG guide)",
            )
    return None


_LGI_ROW = re.compile(
    r"^\|?\s*(\d{1,9})\s+MIG\s+(\d{1,2}g\.\d{1,4}gb(?:\+me)?)\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s*:\s*(\d{1,9})\s*(?:\|\s*)?$",
    re.IGNORECASE,
)


@guarded
def read_nvidia_smi_mig_instances(source: Source) -> dict[int, list[tuple[str, int, int]]]:
    """The GPU instances ``nvidia-smi mig -lgi`` lists: GPU index -> [(profile, start,
    size)], in memory slices. Raises InvalidTopology naming the file and line."""
    name, text = read_source(source)
    out: dict[int, list[tuple[str, int, int]]] = {}
    seen: set[tuple[int, int]] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        row = _LGI_ROW.match(line)
        if not row:
            continue
        gpu, profile, instance = int(row.group(1)), row.group(2).lower(), int(row.group(4))
        start, size = int(row.group(5)), int(row.group(6))
        if not 1 <= size <= _MAX_SLICES or start + size > _MAX_SLICES:
            raise fail(name, lineno, f"placement {start}:{size} is out of range")
        if (gpu, instance) in seen:
            raise fail(name, lineno, f"GPU {gpu} instance ID {instance} is listed twice")
        seen.add((gpu, instance))
        out.setdefault(gpu, []).append((profile, start, size))
    if not out:
        raise fail(name, None, "no `nvidia-smi mig -lgi` rows (|   0  MIG 3g.40gb   9   1   4:4 |)")
    return out
