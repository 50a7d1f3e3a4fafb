"""Kubernetes objects that topology-aware schedulers read, written from a gpuplace topology.

From a :class:`~gpuplace.Topology`:

- :func:`node_labels`: per host, the node labels NVIDIA Topograph writes
  (``network.topology.nvidia.com/{accelerator,leaf,spine,core}``, and with ``topograph_run``
  the newer ``accelerator.topograph.run/domain`` and ``fabric.topograph.run/tier-N``);
  :func:`node_list` wraps them as ``kubectl get nodes -o json`` would show them, which
  ``gpuplace topo import --k8s`` reads back into the same tree.
- :func:`kueue_topology`: a Kueue ``Topology`` (kueue.x-k8s.io/v1beta2), levels top-down with
  ``kubernetes.io/hostname`` last.
- :func:`volcano_hypernodes`: Volcano ``HyperNode`` objects (topology.volcano.sh/v1alpha1),
  tier 1 holding nodes (by exact name or one regex), higher tiers holding HyperNodes.
- :func:`kai_topology`: a KAI Scheduler ``Topology`` (kai.scheduler/v1alpha1).

From a :class:`~gpuplace.placement.Placement`, :func:`pod_patches` gives one pod template patch
per rank (its node, and ``CUDA_VISIBLE_DEVICES``) for an indexed Job or a JobSet.

An NVLink domain that spans several hosts (a GB200 NVL72 rack) is the accelerator level. Label
values are Kubernetes label values (at most 63 characters of ``[A-Za-z0-9._-]``): a domain name
that is not one is rewritten, with a short hash where two names would otherwise collide.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from gpuplace.errors import InvalidJob, InvalidTopology

if TYPE_CHECKING:
    from gpuplace.model.topology import Topology
    from gpuplace.placement.result import Placement

__all__ = [
    "HOSTNAME_LABEL",
    "kai_topology",
    "kueue_topology",
    "node_labels",
    "node_list",
    "pod_patches",
    "volcano_hypernodes",
]

HOSTNAME_LABEL = "kubernetes.io/hostname"
_NVIDIA = "network.topology.nvidia.com"
#: Topograph's keys for the network tiers above the hosts, bottom-up.
_NVIDIA_TIERS = ("leaf", "spine", "core")
_ACCELERATOR_RUN = "accelerator.topograph.run/domain"
_GPU_RESOURCE = "nvidia.com/gpu"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# RFC 1123 subdomain: what a node name and an object name must be.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _label_value(name: str) -> str:
    """``name`` made a valid label value (<= 63 characters of [A-Za-z0-9._-], alphanumeric ends)."""
    if len(name) <= 63 and _LABEL_VALUE.match(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{cleaned[:54].rstrip('-._')}-{digest}".lstrip("-._")


def _dns_name(name: str) -> str:
    """``name`` made an object name (lowercase RFC 1123 subdomain, <= 253 characters)."""
    if len(name) <= 253 and _DNS_SUBDOMAIN.match(name):
        return name
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")
    cleaned = re.sub(r"\.[-.]*", ".", cleaned)
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{cleaned[:240].strip('-.')}-{digest}".lstrip("-.")


class _Levels:
    """The levels above the hosts, bottom-up, with each host's domain at each and their labels."""

    def __init__(self, topology: Topology, topograph_run: bool):
        for host in topology.hosts:
            if not (len(host) <= 253 and _DNS_SUBDOMAIN.match(host)):
                raise InvalidTopology(
                    f"{topology.name}: host {host!r} is not a valid Kubernetes node name "
                    "(lowercase letters, digits, '-' and '.', at most 253 characters)"
                )
        above = range(topology.node_level + 1, len(topology.levels))
        #: (level index, level name, {host index: label value}) bottom-up.
        self.names = [topology.levels[lv].name for lv in above]
        self.values: list[list[str]] = []
        for offset, lv in enumerate(above):
            mapping: dict[str, str] = {}
            for domains in topology.host_domains:
                raw = domains[offset]
                mapping.setdefault(raw, _label_value(raw))
            if len(set(mapping.values())) != len(mapping):
                raise InvalidTopology(
                    f"{topology.name}: level {topology.levels[lv].name!r} has domain names that "
                    "become the same label value"
                )
            self.values.append([mapping[d[offset]] for d in topology.host_domains])
        # The accelerator (NVLink) level, when NVLink spans hosts; the network tiers above it.
        accel = topology.nvlink_level - topology.node_level - 1
        self.accelerator = accel if accel >= 0 else None
        network = list(range(accel + 1 if accel >= 0 else 0, len(self.names)))
        # Levels between the host and the NVLink level (none in the presets) stay unlabelled.
        self.keys: dict[int, list[str]] = {}
        if self.accelerator is not None:
            self.keys[self.accelerator] = [f"{_NVIDIA}/accelerator"]
            if topograph_run:
                self.keys[self.accelerator].append(_ACCELERATOR_RUN)
        if len(network) > len(_NVIDIA_TIERS) and not topograph_run:
            raise InvalidTopology(
                f"{topology.name}: {len(network)} network levels above the hosts, but "
                f"{_NVIDIA}/ has keys for {len(_NVIDIA_TIERS)} ({', '.join(_NVIDIA_TIERS)}); "
                "use the fabric.topograph.run/tier-N keys (--topograph-run)"
            )
        for tier, offset in enumerate(network):
            keys = []
            if tier < len(_NVIDIA_TIERS):
                keys.append(f"{_NVIDIA}/{_NVIDIA_TIERS[tier]}")
            if topograph_run:
                keys.append(f"fabric.topograph.run/tier-{tier}")
            self.keys[offset] = keys
        if not self.keys:
            raise InvalidTopology(
                f"{topology.name}: no level above the hosts, so there is no topology to label"
            )

    def primary_keys_top_down(self) -> list[tuple[str, str]]:
        """(label key, level name) per labelled level, top level first; the first key of each
        (the ``network.topology.nvidia.com`` one where it exists)."""
        return [(self.keys[o][0], self.names[o]) for o in sorted(self.keys, reverse=True)]


def node_labels(topology: Topology, *, topograph_run: bool = False) -> dict[str, dict[str, str]]:
    """Per host (in topology order), its topology labels and ``kubernetes.io/hostname``."""
    levels = _Levels(topology, topograph_run)
    out: dict[str, dict[str, str]] = {}
    for h, host in enumerate(topology.hosts):
        labels = {HOSTNAME_LABEL: host}
        for offset, keys in sorted(levels.keys.items()):
            for key in keys:
                labels[key] = levels.values[offset][h]
        out[host] = labels
    return out


def node_list(topology: Topology, *, topograph_run: bool = False) -> dict[str, Any]:
    """The hosts as a ``v1`` ``List`` of ``Node`` objects with their labels and
    ``status.allocatable["nvidia.com/gpu"]``, as ``kubectl get nodes -o json`` shows them."""
    labels = node_labels(topology, topograph_run=topograph_run)
    items = []
    for host, host_type in zip(topology.hosts, topology.host_types, strict=True):
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": host, "labels": labels[host]},
                "status": {
                    "allocatable": {_GPU_RESOURCE: str(topology.node_types[host_type].gpus)}
                },
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items}


def kubectl_label_commands(topology: Topology, *, topograph_run: bool = False) -> str:
    """One ``kubectl label node HOST KEY=VALUE ... --overwrite`` line per host."""
    lines = []
    for host, labels in node_labels(topology, topograph_run=topograph_run).items():
        pairs = " ".join(f"{k}={v}" for k, v in labels.items() if k != HOSTNAME_LABEL)
        lines.append(f"kubectl label node {host} {pairs} --overwrite")
    return "\n".join(lines) + "\n"


def _object_name(topology: Topology, name: str | None) -> str:
    return _dns_name(name or topology.name)


def kueue_topology(
    topology: Topology, *, name: str | None = None, topograph_run: bool = False
) -> dict[str, Any]:
    """A Kueue ``Topology``: the labelled levels top-down, then ``kubernetes.io/hostname``
    (Kueue's TAS then places pods on single nodes). At most 16 levels."""
    levels = _Levels(topology, topograph_run).primary_keys_top_down()
    if len(levels) + 1 > 16:
        raise InvalidTopology(f"{topology.name}: Kueue allows 16 topology levels")
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": _object_name(topology, name)},
        "spec": {
            "levels": [{"nodeLabel": key} for key, _ in levels] + [{"nodeLabel": HOSTNAME_LABEL}]
        },
    }


def kai_topology(
    topology: Topology, *, name: str | None = None, topograph_run: bool = False
) -> dict[str, Any]:
    """A KAI Scheduler ``Topology``: the labelled levels top-down, each with the gpuplace level
    name as its alias, then ``kubernetes.io/hostname``."""
    levels = _Levels(topology, topograph_run).primary_keys_top_down()
    spec_levels: list[dict[str, str]] = []
    aliases: set[str] = set()
    for key, level_name in levels:
        entry = {"nodeLabel": key}
        alias = _label_value(level_name)
        # An alias must be unique and not equal any nodeLabel (KAI's webhook); skip it otherwise.
        if alias not in aliases and "/" not in alias:
            entry["alias"] = alias
            aliases.add(alias)
        spec_levels.append(entry)
    spec_levels.append({"nodeLabel": HOSTNAME_LABEL, "alias": "hostname"})
    return {
        "apiVersion": "kai.scheduler/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": _object_name(topology, name)},
        "spec": {"levels": spec_levels},
    }


def _hosts_regex(hosts: list[str]) -> str:
    """An RE2 pattern matching exactly these node names (anchored alternation)."""
    return "^(" + "|".join(h.replace(".", r"\.") for h in hosts) + ")$"


def volcano_hypernodes(
    topology: Topology, *, members: str = "exact", topograph_run: bool = False
) -> list[dict[str, Any]]:
    """Volcano ``HyperNode`` objects, one per domain of each labelled level, lowest tier first.

    Tier 1 is the lowest labelled level (the NVLink domain on an NVL72 cluster, else the leaf);
    its members are nodes, by exact name (``members="exact"``, one member per node) or by one
    anchored regex (``members="regex"``). Tier k+1 holds the tier-k HyperNodes below it. A
    HyperNode is named ``<level>-<domain>``."""
    if members not in ("exact", "regex"):
        raise InvalidTopology(f"members must be 'exact' or 'regex', got {members!r}")
    levels = _Levels(topology, topograph_run)
    offsets = sorted(levels.keys)
    out: list[dict[str, Any]] = []
    names: dict[tuple[int, str], str] = {}
    for tier, offset in enumerate(offsets, start=1):
        level_name = levels.names[offset]
        children: dict[str, list[str]] = {}
        for h, host in enumerate(topology.hosts):
            domain = levels.values[offset][h]
            if tier == 1:
                child = host
            else:
                below = offsets[tier - 2]
                child = names[(below, levels.values[below][h])]
            group = children.setdefault(domain, [])
            if child not in group:
                group.append(child)
        for domain, group in children.items():
            hn_name = _dns_name(f"{level_name}-{domain}")
            names[(offset, domain)] = hn_name
            if tier == 1 and members == "regex":
                member_list = [
                    {"type": "Node", "selector": {"regexMatch": {"pattern": _hosts_regex(group)}}}
                ]
            else:
                kind = "Node" if tier == 1 else "HyperNode"
                member_list = [
                    {"type": kind, "selector": {"exactMatch": {"name": child}}} for child in group
                ]
            out.append(
                {
                    "apiVersion": "topology.volcano.sh/v1alpha1",
                    "kind": "HyperNode",
                    "metadata": {"name": hn_name},
                    "spec": {"tier": tier, "tierName": level_name, "members": member_list},
                }
            )
    if len(set(names.values())) != len(names):
        raise InvalidTopology(f"{topology.name}: two domains give the same HyperNode name")
    return out


def pod_patches(
    placement: Placement,
    *,
    workload: str = "job",
    container: str = "main",
    pin: str = "nodeName",
) -> list[dict[str, Any]]:
    """One pod template patch per rank, for an indexed Job (``workload="job"``) or a JobSet
    (``workload="jobset"``) with one pod per rank: rank r is completion index r.

    Each entry is ``{"rank", "completionIndex", "host", "template"}`` where ``template`` is a
    strategic-merge patch of the pod template: the node (``spec.nodeName``, or with
    ``pin="affinity"`` a required node affinity on ``kubernetes.io/hostname``) and the
    container's ``CUDA_VISIBLE_DEVICES`` (the GPU gpuplace chose on that node, by its local
    index: the pod must see the node's GPUs in their usual order, e.g. by holding all of
    them). The JobSet form also gives the pod's ``jobIndex`` (0: one replicated job of one pod
    per rank); the pod with labels ``jobset.sigs.k8s.io/job-index`` = jobIndex and
    ``batch.kubernetes.io/job-completion-index`` = completionIndex takes that entry."""
    if workload not in ("job", "jobset"):
        raise InvalidJob(f"workload must be 'job' or 'jobset', got {workload!r}")
    if pin not in ("nodeName", "affinity"):
        raise InvalidJob(f"pin must be 'nodeName' or 'affinity', got {pin!r}")
    out = []
    for row in placement.rank_table():
        host = row["host"]
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": container,
                    "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": str(row["device"])}],
                }
            ]
        }
        if pin == "nodeName":
            spec["nodeName"] = host
        else:
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": HOSTNAME_LABEL, "operator": "In", "values": [host]}
                                ]
                            }
                        ]
                    }
                }
            }
        entry: dict[str, Any] = {"rank": row["rank"], "completionIndex": row["rank"]}
        if workload == "jobset":
            entry["jobIndex"] = 0
        entry.update(host=host, template={"spec": spec})
        out.append(entry)
    return out
