"""Readers of cloud and Kubernetes topology descriptions: ``kubectl get nodes -o json`` with
topology labels, and AWS ``ec2 describe-instance-topology`` JSON."""

from __future__ import annotations

import json
import re
from typing import Any

from gpuplace._util.documents import JsonLimitError, loads_json
from gpuplace.io._common import MAX_NAMES, Source, fail, guarded, read_source
from gpuplace.model.inventory import Fabric, Host

__all__ = ["EC2_GPUS", "read_ec2_topology", "read_k8s_nodes"]

_BOTTOM_UP = ["leaf", "spine", "core"]

#: GPUs (accelerators) and model per EC2 instance type that describe-instance-topology
#: supports. Trainium instances count Trainium chips.
EC2_GPUS: dict[str, tuple[int, str]] = {
    "p3dn.24xlarge": (8, "V100-SXM2-32GB"),
    "p4d.24xlarge": (8, "A100-SXM4-40GB"),
    "p4de.24xlarge": (8, "A100-SXM4-80GB"),
    "p5.48xlarge": (8, "H100-SXM5-80GB"),
    "p5e.48xlarge": (8, "H200-SXM-141GB"),
    "p5en.48xlarge": (8, "H200-SXM-141GB"),
    "p6-b200.48xlarge": (8, "B200"),
    "trn1.2xlarge": (1, "Trainium"),
    "trn1.32xlarge": (16, "Trainium"),
    "trn1n.32xlarge": (16, "Trainium"),
    "trn2.48xlarge": (16, "Trainium2"),
    "trn2u.48xlarge": (16, "Trainium2"),
}


def _level_names(n: int) -> list[str]:
    return [_BOTTOM_UP[i] if i < len(_BOTTOM_UP) else f"tier{i}" for i in range(n)]


def _load_json(source: Source) -> tuple[str, Any]:
    fname, text = read_source(source)
    try:
        return fname, loads_json(text)
    except JsonLimitError as exc:
        raise fail(fname, exc.line, f"invalid JSON: {exc.msg}") from None
    except json.JSONDecodeError as exc:
        raise fail(fname, exc.lineno, f"invalid JSON: {exc.msg}") from None


# -- Kubernetes ------------------------------------------------------------------------------

# Label schemes, most specific first; each maps label keys to bottom-up ranks (rank 0 is the
# level just above the node). The NVLink ("nvl") rank sits below the network levels.
_TOPOGRAPH_TIER = re.compile(r"^fabric\.topograph\.run/tier-(\d+)$")
_EKS_LAYER = re.compile(r"^topology\.k8s\.aws/network-node-layer-(\d+)$")
_NVIDIA_OLD = {
    "network.topology.nvidia.com/leaf": "leaf",
    "network.topology.nvidia.com/spine": "spine",
    "network.topology.nvidia.com/core": "core",
}
_NVL_KEYS = (
    "accelerator.topograph.run/domain",
    "network.topology.nvidia.com/accelerator",
    "nvidia.com/gpu.clique",
)
_GKE = [
    ("cloud.google.com/gce-topology-subblock", "subblock"),
    ("cloud.google.com/gce-topology-block", "block"),
]
_GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


@guarded
def read_k8s_nodes(source: Source) -> Fabric:
    """Read ``kubectl get nodes -o json`` into a :class:`Fabric`.

    Network levels come from, in order of preference: Topograph ``fabric.topograph.run/tier-N``
    (N ascending = bottom-up), the older ``network.topology.nvidia.com/{leaf,spine,core}``,
    EKS ``topology.k8s.aws/network-node-layer-N`` (N descending = bottom-up, layer 1 is the
    top), GKE ``cloud.google.com/gce-topology-{subblock,block}``. An NVLink level ``nvl`` comes
    from ``accelerator.topograph.run/domain``, ``network.topology.nvidia.com/accelerator`` or
    ``nvidia.com/gpu.clique`` and is kept when it nests inside the lowest network level. GPU
    counts come from ``status.allocatable["nvidia.com/gpu"]`` (or amd.com/gpu); nodes without
    GPUs are left out when some nodes have them."""
    fname, doc = _load_json(source)
    if isinstance(doc, dict) and doc.get("kind") == "Node":
        items = [doc]
    elif isinstance(doc, dict) and isinstance(doc.get("items"), list):
        items = doc["items"]
    else:
        raise fail(
            fname,
            None,
            'expected a Node or a List with "items" (kubectl get nodes -o json)',
        )
    if len(items) > MAX_NAMES:
        raise fail(fname, None, f"more than {MAX_NAMES} nodes")
    parsed: list[tuple[str, dict[str, str], int | None, str | None]] = []
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise fail(fname, None, f"items[{i}]: expected metadata.name")
        labels = meta.get("labels") or {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise fail(
                fname,
                None,
                f"items[{i}] ({meta['name']}): labels must map strings to strings",
            )
        status = item.get("status") or {}
        alloc = status.get("allocatable") if isinstance(status, dict) else None
        alloc = alloc if isinstance(alloc, dict) else {}
        gpus = None
        for res in _GPU_RESOURCES:
            if res in alloc:
                value = str(alloc[res])
                if not value.isdigit() or int(value) > 4096:
                    raise fail(
                        fname,
                        None,
                        f"items[{i}] ({meta['name']}): {res}={value!r} is not a GPU count",
                    )
                gpus = int(value)
                break
        model = labels.get("nvidia.com/gpu.product")
        parsed.append((meta["name"], labels, gpus, model))

    fabric = Fabric()
    if any(g for _, _, g, _ in parsed):
        dropped = [n for n, _, g, _ in parsed if not g]
        parsed = [p for p in parsed if p[2]]
        if dropped:
            fabric.warnings.append(
                f"{len(dropped)} nodes without GPUs left out: {', '.join(dropped[:5])}"
            )
    else:
        fabric.warnings.append("no node reports nvidia.com/gpu; GPU counts unknown")

    keys = {k for _, labels, _, _ in parsed for k in labels}
    tiers = sorted({int(m.group(1)) for k in keys if (m := _TOPOGRAPH_TIER.match(k))})
    layers = sorted({int(m.group(1)) for k in keys if (m := _EKS_LAYER.match(k))}, reverse=True)
    # The label keys of the network levels, bottom-up, and the levels' names.
    scheme: list[str]
    if tiers:
        scheme = [f"fabric.topograph.run/tier-{t}" for t in tiers]
    elif keys & set(_NVIDIA_OLD):
        scheme = [k for k in _NVIDIA_OLD if k in keys]
    elif layers:
        scheme = [f"topology.k8s.aws/network-node-layer-{n}" for n in layers]
    else:
        scheme = [k for k, _ in _GKE if k in keys]
    net_names = _level_names(len(scheme))
    if not tiers and not layers and not keys & set(_NVIDIA_OLD):
        net_names = [name for k, name in _GKE if k in keys]
    nvl_key = next((k for k in _NVL_KEYS if k in keys), None)

    for name, labels, gpus, model in parsed:
        domains = {lv: labels[k] for k, lv in zip(scheme, net_names, strict=False) if labels.get(k)}
        if nvl_key and labels.get(nvl_key):
            domains["nvl"] = labels[nvl_key]
        fabric.hosts[name] = Host(name, gpus=gpus, domains=domains, gpu_model=model)
    levels = list(net_names)
    if nvl_key:
        ok = True
        if levels:
            parent: dict[str, str] = {}
            for h in fabric.hosts.values():
                if "nvl" not in h.domains or levels[0] not in h.domains:
                    continue
                up = h.domains[levels[0]]
                if parent.setdefault(h.domains["nvl"], up) != up:
                    ok = False
        if ok:
            levels.insert(0, "nvl")
            fabric.nvlink_level = "nvl"
        else:
            fabric.warnings.append(
                f"NVLink domains ({nvl_key}) span several {levels[0]} domains; not used as a level"
            )
            for h in fabric.hosts.values():
                h.domains.pop("nvl", None)
    fabric.levels = levels
    if not fabric.hosts:
        raise fail(fname, None, "no nodes")
    if not levels:
        fabric.warnings.append("no topology labels found; hosts are flat under one root")
    return fabric


# -- EC2 -------------------------------------------------------------------------------------


@guarded
def read_ec2_topology(source: Source, *, gpus_per_instance: dict[str, int] | None = None) -> Fabric:
    """Read ``aws ec2 describe-instance-topology`` JSON (one response, or a list of pages).

    ``NetworkNodes`` lists the node set top layer first, the last entry being the node the
    instance connects to (AWS EC2 User Guide, "How Amazon EC2 topology works"); levels are
    named bottom-up leaf, spine, core (tier3 for the 4-layer p6-b200). Instances are hosts
    named by InstanceId; their GPU count comes from the instance type (EC2_GPUS, or
    ``gpus_per_instance``)."""
    fname, doc = _load_json(source)
    pages = doc if isinstance(doc, list) else [doc]
    instances = []
    for p, page in enumerate(pages):
        if not isinstance(page, dict) or not isinstance(page.get("Instances"), list):
            raise fail(
                fname,
                None,
                f'page {p}: expected an object with "Instances" (describe-instance-topology)',
            )
        instances.extend(page["Instances"])
    if len(instances) > MAX_NAMES:
        raise fail(fname, None, f"more than {MAX_NAMES} instances")
    fabric = Fabric()
    table = {k: v[0] for k, v in EC2_GPUS.items()}
    table.update(gpus_per_instance or {})
    depth = 0
    sets: list[tuple[str, list[str], int | None, str | None]] = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict) or not isinstance(inst.get("InstanceId"), str):
            raise fail(fname, None, f"Instances[{i}]: expected an InstanceId")
        iid = inst["InstanceId"]
        nn = inst.get("NetworkNodes")
        if not nn:
            fabric.warnings.append(
                f"{iid}: no NetworkNodes (not running, or unsupported type); left out"
            )
            continue
        if (
            not isinstance(nn, list)
            or not all(isinstance(x, str) and x for x in nn)
            or len(nn) > 16
        ):
            raise fail(
                fname,
                None,
                f"Instances[{i}] ({iid}): NetworkNodes must be a list of ids",
            )
        itype = inst.get("InstanceType")
        itype = itype if isinstance(itype, str) else None
        gpus = table.get(itype or "")
        if gpus is None:
            fabric.warnings.append(f"{iid}: GPU count of instance type {itype!r} unknown")
        if iid in {s[0] for s in sets}:
            raise fail(fname, None, f"instance {iid} listed twice")
        sets.append((iid, nn, gpus, EC2_GPUS.get(itype or "", (0, None))[1]))
        depth = max(depth, len(nn))
    if not sets:
        raise fail(fname, None, "no instance has a network node set")
    levels = _level_names(depth)
    fabric.levels = levels
    for iid, nn, gpus, model in sets:
        # Align from the top (layer 1 is common to all instance types); an instance with
        # fewer layers takes its lowest node for the missing bottom ones.
        padded = list(nn) + [nn[-1]] * (depth - len(nn))
        domains = {levels[depth - 1 - k]: padded[k] for k in range(depth)}
        fabric.hosts[iid] = Host(iid, gpus=gpus, domains=domains, gpu_model=model)
    return fabric
