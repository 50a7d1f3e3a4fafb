"""``gpuplace topo``: import a real cluster from tool outputs, show a topology, export it.

``gpuplace topo import --nvidia-smi node.txt --slurm topology.conf -o cluster.yaml`` combines a
host description (nvidia-smi / rocm-smi) with a fabric (Slurm, ibnetdiscover, Kubernetes,
EC2); ``topo show`` summarises levels, bandwidths and domains (and draws the tree with
``--png``); ``topo export --slurm tree|block`` writes topology.conf back.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np

import gpuplace.io as gio
from gpuplace._util.documents import dump_document, write_atomically
from gpuplace.cli.common import cluster_params, emit, format_option, load_cluster, param_option
from gpuplace.errors import InvalidTopology
from gpuplace.io import write_slurm_topology
from gpuplace.io.select import select_hosts, unusual_hosts
from gpuplace.model.presets import PRESETS
from gpuplace.model.topology import Topology

__all__ = ["topo"]

#: Above this many domains at the lowest drawn level, ``--png`` draws one level higher.
MAX_BOXES = 48

_GENERATIONS = ["pascal", "volta", "ampere", "ampere-sm86", "ada", "hopper", "blackwell"]


def _warn(message: str) -> None:
    click.echo(f"gpuplace: warning: {message}", err=True)


def _pairs(values: tuple[str, ...], option: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in values:
        level, sep, number = item.partition("=")
        try:
            if not sep or not level:
                raise ValueError
            out[level] = float(number)
        except ValueError:
            raise click.BadParameter(
                f"expected LEVEL=NUMBER, got {item!r}", param_hint=option
            ) from None
    return out


def load_topology(spec: str) -> Topology:
    """A topology file (YAML/JSON) or a preset name, with the command's ``-p KEY=VALUE``."""

    if not Path(spec).exists() and spec not in PRESETS:
        raise InvalidTopology(f"{spec}: no such file (and not a preset: {', '.join(PRESETS)})")
    if Path(spec).exists() and spec not in PRESETS and not cluster_params():
        return Topology.load(spec)
    return load_cluster(spec)


@click.group("topo")
def topo() -> None:
    """Import, inspect and export cluster topologies."""


# ---------------------------------------------------------------------------------- import
_file = click.Path(exists=True, dir_okay=False)


@topo.command("import")
@click.option("--nvidia-smi", "nvidia_smi", type=_file, help="`nvidia-smi topo -m` of one host.")
@click.option("--rocm-smi", "rocm_smi", type=_file, help="`rocm-smi --showtopo` of one host.")
@click.option("--slurm", type=_file, help="Slurm topology.conf or topology.yaml.")
@click.option("--slurm-topology", default=None, help="Entry of a topology.yaml to read.")
@click.option("--ibnetdiscover", type=_file, help="`ibnetdiscover` output of the fabric.")
@click.option("--k8s", type=_file, help="`kubectl get nodes -o json`.")
@click.option("--ec2", type=_file, help="`aws ec2 describe-instance-topology` JSON.")
@click.option("--name", default=None, help="Cluster name (default: the output file's stem).")
@click.option("--gpu-model", default=None, help="GPU model of the host, e.g. 'H100 80GB HBM3'.")
@click.option(
    "--gpu-generation",
    type=click.Choice(_GENERATIONS),
    default=None,
    help="Sets the NVLink per-link rate when the GPU model does not say.",
)
@click.option(
    "--nvlink-domain-gpus",
    type=click.IntRange(1, 100_000),
    default=None,
    help="GPUs per NVLink domain when it spans hosts (72 for GB200 NVL72).",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(1, 64),
    default=None,
    help="GPUs per host when no host file and no fabric source says (default 8).",
)
@click.option(
    "--bandwidth",
    "bandwidths",
    multiple=True,
    metavar="LEVEL=GBPS",
    help="Override a level's per-GPU bandwidth (GB/s); repeatable.",
)
@click.option(
    "--latency",
    "latencies",
    multiple=True,
    metavar="LEVEL=US",
    help="Override a level's latency (µs); repeatable.",
)
@click.option(
    "--include",
    "include",
    multiple=True,
    metavar="PATTERN",
    help="Keep only fabric hosts matching this glob (dgx*); repeatable.",
)
@click.option(
    "--exclude",
    "exclude",
    multiple=True,
    metavar="PATTERN",
    help="Leave out fabric hosts matching this glob (storage*, login*); repeatable.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    default=None,
    help="Topology file to write (.json: JSON, else YAML); default: YAML on stdout.",
)
@format_option
def import_cmd(
    nvidia_smi: str | None,
    rocm_smi: str | None,
    slurm: str | None,
    slurm_topology: str | None,
    ibnetdiscover: str | None,
    k8s: str | None,
    ec2: str | None,
    name: str | None,
    gpu_model: str | None,
    gpu_generation: str | None,
    nvlink_domain_gpus: int | None,
    gpus_per_node: int | None,
    bandwidths: tuple[str, ...],
    latencies: tuple[str, ...],
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    output: str | None,
    fmt: str,
) -> None:
    """Build a topology from a host description and/or a fabric description.

    One host source (--nvidia-smi or --rocm-smi) gives every host's GPUs and links; one fabric
    source (--slurm, --ibnetdiscover, --k8s or --ec2) gives the hosts and the switches above
    them. Reader warnings go to stderr and are kept in the file's `provenance`.
    """

    hosts = [(k, v) for k, v in (("--nvidia-smi", nvidia_smi), ("--rocm-smi", rocm_smi)) if v]
    fabrics = [
        (k, v)
        for k, v in (
            ("--slurm", slurm),
            ("--ibnetdiscover", ibnetdiscover),
            ("--k8s", k8s),
            ("--ec2", ec2),
        )
        if v
    ]
    if len(hosts) > 1:
        raise click.UsageError("give one host source: --nvidia-smi or --rocm-smi")
    if len(fabrics) > 1:
        raise click.UsageError(f"give one fabric source, not {' and '.join(k for k, _ in fabrics)}")
    if not hosts and not fabrics:
        raise click.UsageError(
            "nothing to import: give --nvidia-smi/--rocm-smi and/or "
            "--slurm/--ibnetdiscover/--k8s/--ec2"
        )
    if slurm_topology and not slurm:
        raise click.UsageError("--slurm-topology applies to --slurm topology.yaml")
    if (gpu_generation or nvlink_domain_gpus) and not nvidia_smi:
        raise click.UsageError("--gpu-generation and --nvlink-domain-gpus apply to --nvidia-smi")
    if gpus_per_node and hosts:
        raise click.UsageError("--gpus-per-node applies without a host source")
    bw = _pairs(bandwidths, "--bandwidth")
    lat = _pairs(latencies, "--latency")

    node = None
    if nvidia_smi:
        node = gio.read_nvidia_smi_topo(
            nvidia_smi,
            gpu_model=gpu_model,
            gpu_generation=gpu_generation,
            nvlink_domain_gpus=nvlink_domain_gpus,
        )
    elif rocm_smi:
        node = gio.read_rocm_smi_topo(rocm_smi, gpu_model=gpu_model)
    fabric = None
    if slurm:
        fabric = gio.read_slurm_topology(slurm, topology=slurm_topology)
    elif ibnetdiscover:
        fabric = gio.read_ibnetdiscover(ibnetdiscover)
    elif k8s:
        fabric = gio.read_k8s_nodes(k8s)
    elif ec2:
        fabric = gio.read_ec2_topology(ec2)
    if (include or exclude) and fabric is None:
        raise click.UsageError("--include and --exclude select the hosts of a fabric source")
    if fabric is not None:
        dropped = select_hosts(fabric, include, exclude) if include or exclude else []
        if dropped:
            _warn(f"left out {len(dropped)} hosts: {', '.join(dropped[:8])}")
        fabric.warnings.extend(unusual_hosts(fabric))
    cluster = name or (Path(output).stem if output else "cluster")
    topology = Topology.from_parts(
        node,
        fabric,
        name=cluster,
        gpus_per_node=gpus_per_node,
        bandwidths=bw or None,
        latencies=lat or None,
        sources=[Path(v).name for _, v in hosts + fabrics],
    )
    for warning in topology.warnings:
        _warn(warning)
    if output:
        topology.save(output)
    if fmt == "json":
        emit(
            {
                "output": output,
                "summary": describe(topology),
                "topology": None if output else topology.to_dict(),
            }
        )
    elif output:
        click.echo(f"wrote {output}: {_summary(topology)}")
    else:
        sys.stdout.write(dump_document("-.yaml", topology.to_dict()))
        click.echo(_summary(topology), err=True)


def _hosts(n: int) -> str:
    return f"{n} host" if n == 1 else f"{n} hosts"


def _summary(t: Topology) -> str:
    levels = " ".join(f"{lv.name}[{t.domain_count(i)}]" for i, lv in enumerate(t.levels))
    return (
        f"{t.name}: {_hosts(len(t.hosts))}, {t.num_gpus} GPUs; levels {levels}; "
        f"NVLink domain: {t.levels[t.nvlink_level].name}"
    )


# ---------------------------------------------------------------------------------- show
def describe(t: Topology) -> dict[str, Any]:
    """What ``topo show`` prints, as a JSON-able dictionary (bandwidths in GB/s per GPU and
    direction, latencies in µs, domain sizes in GPUs)."""
    path = t.path
    levels = []
    for i, lv in enumerate(t.levels):
        sizes = np.bincount(path[:, i], minlength=t.domain_count(i))
        levels.append(
            {
                "name": lv.name,
                "bandwidth_gbps": lv.bandwidth_gbps,
                "latency_us": lv.latency_us,
                "domains": int(t.domain_count(i)),
                "gpus_per_domain": {"min": int(sizes.min()), "max": int(sizes.max())},
                "role": "node"
                if i == t.node_level
                else ("below node" if i < t.node_level else "above node"),
                "nvlink_domain": i == t.nvlink_level,
            }
        )
    hosts_of_type: dict[str, int] = {}
    for ht in t.host_types:
        hosts_of_type[ht] = hosts_of_type.get(ht, 0) + 1
    out: dict[str, Any] = {
        "name": t.name,
        "gpus": int(t.num_gpus),
        "hosts": len(t.hosts),
        "node_level": t.levels[t.node_level].name,
        "nvlink_domain": t.levels[t.nvlink_level].name,
        "node_types": {
            name: {"gpus": nt.gpus, "gpu_model": nt.gpu_model, "hosts": hosts_of_type.get(name, 0)}
            for name, nt in t.node_types.items()
        },
        "levels": levels,
        "degraded_links": list(t.provenance.get("degraded_links", [])),
        "warnings": t.warnings,
    }
    if "sources" in t.provenance:
        out["sources"] = list(t.provenance["sources"])
    return out


@topo.command("show")
@click.argument("file")
@param_option
@format_option
@click.option(
    "--png",
    type=click.Path(dir_okay=False),
    default=None,
    help="Draw the domain tree to this PNG (needs matplotlib); hosts are collapsed into counts.",
)
def show_cmd(file: str, fmt: str, png: str | None) -> None:
    """Summarise a topology file (or preset): GPUs, levels with bandwidths, domain counts and
    sizes, degraded links when the import found some."""
    t = load_topology(file)
    info = describe(t)
    if png:
        draw_tree(t, png)
    if fmt == "json":
        emit(info)
    else:
        _print_table(info)
    if png:
        click.echo(f"drew {png}", err=True)


def _print_table(info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Console(highlight=False, soft_wrap=True)
    out.print(
        f"[bold]{info['name']}[/bold]: {_hosts(info['hosts'])}, {info['gpus']} GPUs, "
        f"NVLink domain = {info['nvlink_domain']}"
    )
    for name, nt in info["node_types"].items():
        model = f" x {nt['gpu_model']}" if nt["gpu_model"] else " GPUs"
        out.print(f"  node type {name}: {nt['gpus']}{model}, {_hosts(nt['hosts'])}")
    if info.get("sources"):
        out.print(f"  imported from {', '.join(info['sources'])}")
    table = Table("level", "GB/s/GPU", "µs", "domains", "GPUs each", "role")
    for lv in info["levels"]:
        size = lv["gpus_per_domain"]
        sizes = str(size["min"]) if size["min"] == size["max"] else f"{size['min']}-{size['max']}"
        notes = []
        if lv["role"] == "node":
            notes.append("hosts")
        if lv["nvlink_domain"]:
            notes.append("NVLink")
        table.add_row(
            lv["name"],
            f"{lv['bandwidth_gbps']:g}",
            f"{lv['latency_us']:g}",
            str(lv["domains"]),
            sizes,
            ", ".join(notes),
        )
    out.print(table)
    if info["degraded_links"]:
        out.print(f"degraded links ({len(info['degraded_links'])}):")
        for link in info["degraded_links"]:
            out.print(f"  {link['a']} - {link['b']}: {link['rate']}")
    if info["warnings"]:
        out.print(f"import warnings ({len(info['warnings'])}):")
        for w in info["warnings"]:
            out.print(f"  {w}")


def draw_tree(t: Topology, png: str) -> None:
    """Draw the domains above the hosts as a tree, each lowest box labelled with its host and
    GPU counts. When the lowest level above the node has more than :data:`MAX_BOXES` domains
    the drawing starts one level higher (and so on), so big clusters stay readable."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise click.ClickException(
            "--png needs matplotlib (pip install 'gpuplace[plot]')"
        ) from None
    path = t.path
    nl = len(t.levels)
    host_of_gpu = t.host_of_gpu
    first = t.node_level + 1
    if first >= nl:  # one host, nothing above it
        first = t.node_level
    bottom = first
    while bottom < nl - 1 and t.domain_count(bottom) > MAX_BOXES:
        bottom += 1
    drawn = list(range(bottom, nl))
    # Parent of each domain, per drawn level (from any GPU of the domain).
    parents: dict[int, dict[int, int]] = {}
    for lo, hi in itertools.pairwise(drawn):
        parents[lo] = dict(zip(path[:, lo].tolist(), path[:, hi].tolist(), strict=True))
    # Leaves in tree order: sort bottom domains by their chain of ancestors (top first).
    bottom_ids = sorted(set(path[:, bottom].tolist()))

    def chain(d: int) -> tuple[int, ...]:
        out = [d]
        for lo in drawn[:-1]:
            out.append(parents[lo][out[-1]])
        return tuple(reversed(out))

    bottom_ids.sort(key=chain)
    x: dict[tuple[int, int], float] = {(bottom, d): float(k) for k, d in enumerate(bottom_ids)}
    for lo, hi in itertools.pairwise(drawn):
        kids: dict[int, list[float]] = {}
        for d in sorted({d for (lv, d) in x if lv == lo}):
            kids.setdefault(parents[lo][d], []).append(x[(lo, d)])
        for p, xs in kids.items():
            x[(hi, p)] = sum(xs) / len(xs)
    hosts = {d: len(set(host_of_gpu[path[:, bottom] == d].tolist())) for d in bottom_ids}
    gpus = {d: int((path[:, bottom] == d).sum()) for d in bottom_ids}

    n = len(bottom_ids)
    width = min(60.0, max(6.0, 2.1 * n))
    fig = Figure(figsize=(width, 1.6 + 1.3 * len(drawn)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    font = max(5.0, min(8.0, 400.0 / max(n, 1)))
    for lo, hi in itertools.pairwise(drawn):
        for (lv, d), xv in x.items():
            if lv == lo:
                p = parents[lo][d]
                ax.plot([xv, x[(hi, p)]], [drawn.index(lo), drawn.index(hi)], color="0.6", lw=0.8)
    for (lv, d), xv in x.items():
        label = _short(t.domain_names[lv][d])
        if lv == bottom:
            label += f"\n{hosts[d]} hosts\n{gpus[d]} GPUs"
        color = "#cfe8cf" if lv <= t.nvlink_level else "#dde6f5"
        ax.text(
            xv,
            drawn.index(lv),
            label,
            ha="center",
            va="center",
            fontsize=font,
            bbox={"boxstyle": "round,pad=0.3", "fc": color, "ec": "0.4", "lw": 0.6},
        )
    for lv in drawn:
        level = t.levels[lv]
        ax.text(
            -0.9,
            drawn.index(lv),
            f"{level.name}\n{level.bandwidth_gbps:g} GB/s",
            ha="right",
            va="center",
            fontsize=8,
            color="0.25",
        )
    ax.set_xlim(-1.6 - 0.02 * n, n - 0.4)
    ax.set_ylim(-0.8, len(drawn) - 0.4)
    collapsed = t.levels[bottom - 1].name if bottom - 1 > t.node_level else "host"
    note = f"hosts counted per {t.levels[bottom].name}"
    if collapsed != "host":
        note += f" ({t.domain_count(bottom - 1)} {collapsed} domains not drawn)"
    if t.nvlink_level >= bottom:
        note += f"; green: NVLink domains ({t.levels[t.nvlink_level].name})"
    fig.suptitle(f"{t.name}: {len(t.hosts)} hosts, {t.num_gpus} GPUs\n{note}", fontsize=10)
    try:
        fig.savefig(png, format="png", bbox_inches="tight")
    except OSError as exc:
        raise click.ClickException(f"cannot write {png}: {exc.strerror or exc}") from None


def _short(name: str, limit: int = 15) -> str:
    """Shorten a long domain name in the middle, keeping its distinctive tail."""
    if len(name) <= limit:
        return name
    tail = (limit - 1) // 2
    return name[: limit - 1 - tail] + "…" + name[-tail:]


# ---------------------------------------------------------------------------------- export
@topo.command("export")
@click.argument("file")
@click.option(
    "--slurm",
    "mode",
    type=click.Choice(["tree", "block"]),
    required=True,
    help="Write Slurm topology.conf for topology/tree or topology/block.",
)
@click.option("--level", default=None, help="Block mode: the level whose domains are blocks.")
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), default=None, help="Default: stdout."
)
@param_option
@format_option
def export_cmd(file: str, mode: str, level: str | None, output: str | None, fmt: str) -> None:
    """Write a topology file (or preset) as Slurm topology.conf."""

    if level is not None and mode != "block":
        raise click.UsageError("--level applies to --slurm block")
    text = write_slurm_topology(load_topology(file), mode, level=level)
    if output:
        write_atomically(output, text)
    if fmt == "json":
        emit({"output": output, "mode": mode, "text": None if output else text})
    elif output:
        click.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)
