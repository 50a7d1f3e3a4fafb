"""Readers of Alibaba's openb cluster trace (the GPU-sharing cluster of the FGD paper, Weng et
al., ATC'23; alibaba/clusterdata ``cluster-trace-gpu-v2023``): node lists and pod lists.

- Node list (``openb_node_list_*.csv``): ``sn, cpu_milli, memory_mib, gpu, model`` (model empty
  on nodes without GPUs) -> :class:`SharedNode`; errors are InvalidTopology.
- Pod list (``openb_pod_list_*.csv``): ``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` and
  optionally ``gpu_spec`` (allowed models joined with ``|``) and the rest, ignored ->
  :class:`SharedRequest`, sorted by name as the authors' simulator sorts them; errors are
  InvalidJob.

Each takes a path (``.csv`` or ``.csv.gz``) or an open file and names the file and line of any
bad row.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import zlib
from collections.abc import Mapping
from typing import Any

from gpuplace._util.documents import csv_rows, text_lines
from gpuplace.errors import GpuplaceError, InvalidJob, InvalidTopology
from gpuplace.io._common import MAX_INPUT_BYTES, fail, guarded, read_source
from gpuplace.model.share import MILLI, SharedNode, SharedRequest

__all__ = ["read_openb_nodes", "read_openb_pods"]


def _rows(
    source: Any, need: tuple[str, ...], error: type[GpuplaceError]
) -> tuple[str, list[tuple[int, dict[str, str]]]]:
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).endswith(".gz"):
        path = os.fspath(source)
        name = os.path.basename(path)
        try:
            with gzip.open(path, "rb") as fh:
                data = fh.read(MAX_INPUT_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise error(f"{name}: cannot read gzip file: {exc}") from None
        name, text = read_source(io.BytesIO(data))
        name = os.path.basename(path)
    else:
        name, text = read_source(source)
    reader = csv.DictReader(text_lines(text))
    try:
        raw = {f.strip(): f for f in (reader.fieldnames or [])}
    except csv.Error as exc:
        raise error(f"{name}:1: not valid CSV: {exc}") from None
    missing = [f for f in need if f not in raw]
    if missing:
        raise error(
            f"{name}:1: expected the columns {', '.join(need)}; missing {', '.join(missing)}"
        )
    rows = []
    for line, row in csv_rows(reader, name, error, location=lambda line: f"{name}:{line}"):
        if None in row:
            raise error(f"{name}:{line}: more fields than the header's {len(raw)}")
        short = next((f for f in need if row[raw[f]] is None), None)
        if short is not None:
            raise error(f"{name}:{line}: {short}: missing (fewer fields than the header)")
        rows.append((line, {k.strip(): (v or "").strip() for k, v in row.items()}))
    return name, rows


def _int(row: dict[str, str], key: str, name: str, line: int, error: type[GpuplaceError]) -> int:
    text = row.get(key, "")
    digits = text[1:] if text.startswith(("+", "-")) else text
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 18):
        raise error(f"{name}:{line}: {key}: expected an integer, got {text[:40]!r}")
    value = int(text)
    if value < 0:
        raise error(f"{name}:{line}: {key}: expected 0 or more, got {value}")
    if value > MAX_COUNT:
        raise error(f"{name}:{line}: {key}: expected at most {MAX_COUNT}, got {value}")
    return value


#: The largest count or size a row may give (milli-CPUs, MiB, GPUs): far beyond any machine.
MAX_COUNT = 2**53


@guarded
def read_openb_nodes(source: Any) -> list[SharedNode]:
    """Nodes of an openb node list (see the module docs)."""
    name, rows = _rows(source, ("sn", "cpu_milli", "memory_mib", "gpu", "model"), InvalidTopology)
    out = []
    seen: set[str] = set()
    for line, row in rows:
        sn = row["sn"]
        if not sn:
            raise fail(name, line, "sn: expected a node name")
        if sn in seen:
            raise fail(name, line, f"node {sn} is listed twice")
        seen.add(sn)
        gpus = _int(row, "gpu", name, line, InvalidTopology)
        model = row["model"] or None
        if gpus and not model:
            raise fail(name, line, f"node {sn} has {gpus} GPUs but no model")
        cpu = _int(row, "cpu_milli", name, line, InvalidTopology)
        memory = _int(row, "memory_mib", name, line, InvalidTopology)
        try:
            out.append(SharedNode(sn, cpu, memory, gpus, model))
        except InvalidTopology as exc:
            raise fail(name, line, str(exc)) from None
    if not out:
        raise fail(name, None, "no nodes")
    return out


def read_openb_pods(
    source: Any, *, isolation_for_qos: Mapping[str, str] | None = None
) -> list[SharedRequest]:
    """Requests of an openb pod list (see the module docs), sorted by name.
    ``isolation_for_qos``: the isolation that pods of a QoS class ask when they share a GPU
    (for example ``{"LS": "mig"}``: latency-sensitive shares on MIG instances); the trace
    itself states none."""
    try:
        return _read_pods(source, dict(isolation_for_qos or {}))
    except InvalidJob:
        raise
    except InvalidTopology as exc:  # read_source's errors (size, encoding) are about the file
        raise InvalidJob(str(exc)) from None
    except Exception as exc:  # the safety net, as `guarded` is for the other readers
        raise InvalidJob(
            f"unexpected parse failure of a pod list ({type(exc).__name__}: {exc}); the input "
            "is not in the expected format"
        ) from exc


def _read_pods(source: Any, isolation_for_qos: dict[str, str]) -> list[SharedRequest]:
    try:
        name, rows = _rows(
            source, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"), InvalidJob
        )
    except InvalidTopology as exc:
        raise InvalidJob(str(exc)) from None
    out = []
    seen: set[str] = set()
    for line, row in rows:
        pod = row["name"]
        if not pod:
            raise InvalidJob(f"{name}:{line}: name: expected a pod name")
        if pod in seen:
            raise InvalidJob(f"{name}:{line}: pod {pod} is listed twice")
        seen.add(pod)
        gpus = _int(row, "num_gpu", name, line, InvalidJob)
        milli = _int(row, "gpu_milli", name, line, InvalidJob) if gpus else 0
        if gpus > 1 and milli != MILLI:
            raise InvalidJob(
                f"{name}:{line}: {gpus} GPUs of {milli} milli-GPUs each; several GPUs are whole ({MILLI})"
            )
        models = tuple(m.strip() for m in row.get("gpu_spec", "").split("|") if m.strip())
        shared = gpus == 1 and milli < MILLI
        isolation = isolation_for_qos.get(row.get("qos", ""), "any") if shared else "any"
        cpu = _int(row, "cpu_milli", name, line, InvalidJob)
        memory = _int(row, "memory_mib", name, line, InvalidJob)
        try:
            out.append(
                SharedRequest(
                    pod,
                    cpu,
                    memory,
                    gpus,
                    milli,
                    models,
                    isolation=isolation,
                )
            )
        except InvalidJob as exc:
            raise InvalidJob(f"{name}:{line}: {exc}") from None
    if not out:
        raise InvalidJob(f"{name}: no pods")
    out.sort(key=lambda r: r.name)
    return out
