"""``gpuplace fgd``: the FGD paper's Figure 9a (and its workload variants) reproduced on the
openb cluster, with gpuplace's policy beside the paper's (``gpuplace.sim.fgd``)."""

from __future__ import annotations

import click
from rich.table import Table

from gpuplace.cli.common import emit, format_option, out
from gpuplace.placement.share import POLICIES
from gpuplace.sim import fgd

__all__ = ["fgd_cmd"]


@click.command("fgd")
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    help=f"openb workload ({', '.join(fgd.WORKLOADS)}, or 'all') or a pod list file in openb's "
    "format (repeatable; default: default).",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice(POLICIES),
    help="Policies to run (repeatable; default: all, the paper's and gpuplace).",
)
@click.option("--seeds", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--first-seed", type=int, default=42, show_default=True)
@click.option(
    "--inflation",
    type=click.FloatRange(0, 10),
    default=fgd.INFLATION,
    show_default=True,
    help="Inflate the workload to this multiple of the GPU capacity (0: as listed).",
)
@click.option(
    "--at",
    type=click.IntRange(0, fgd.TOP),
    default=100,
    show_default=True,
    help="Report the unallocated GPUs when this % of the capacity has arrived.",
)
@click.option(
    "--nodes",
    "nodes_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A node list in openb's format (default: openb's 1,213 GPU nodes).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the figure (PNG, PDF or SVG by suffix; needs matplotlib).",
)
@format_option
def fgd_cmd(
    workloads: tuple[str, ...],
    policies: tuple[str, ...],
    seeds: int,
    first_seed: int,
    inflation: float,
    at: int,
    nodes_path: str | None,
    plot_path: str | None,
    fmt: str,
) -> None:
    """Reproduce Figure 9a of the FGD paper (Weng et al., ATC'23): unallocated GPUs against
    the arrived workload on Alibaba's openb cluster, the paper's policies and gpuplace's, with
    the medians over seeds beside the paper's published ones. Uses no state file."""
    names = list(workloads) or ["default"]
    if "all" in names:
        names = [*fgd.WORKLOADS, *(n for n in names if n not in (*fgd.WORKLOADS, "all"))]
    names = list(dict.fromkeys(names))
    nodes = fgd.openb_nodes(nodes_path) if nodes_path else None
    # Every input is read (and refused) before the first run.
    loaded = {name: fgd.openb_workload(name) for name in names}
    chosen = policies or POLICIES
    figures = [
        fgd.run(
            name,
            chosen,
            range(first_seed, first_seed + seeds),
            inflation=inflation,
            nodes=nodes,
            requests=requests,
        )
        for name, requests in loaded.items()
    ]
    if plot_path is not None:
        fgd.plot(figures, plot_path, paper=nodes is None and inflation == fgd.INFLATION)
    if fmt == "json":
        emit(
            {
                "figures": [f.to_dict(at) for f in figures],
                **({"plot": plot_path} if plot_path else {}),
            }
        )
        return
    for figure in figures:
        _print(figure, at, comparable=nodes is None and inflation == fgd.INFLATION)
    if plot_path is not None:
        out.print(f"wrote {plot_path}")


def _print(figure: fgd.Figure, at: int, *, comparable: bool) -> None:
    doc = figure.to_dict(at)
    rows = doc["unallocated_percent"]
    fgd_median = rows.get("fgd", {}).get("median")
    table = Table(
        "policy",
        "unalloc %",
        "paper %",
        "diff",
        "seeds min-max",
        "vs FGD",
        "decision us med/p99",
        title=(
            f"openb {figure.workload}: unallocated GPUs at {at} % arrived, median of "
            f"{len(figure.seeds)} seeds ({figure.nodes} nodes, {figure.gpus} GPUs, "
            f"~{figure.arrivals} arrivals per run; {figure.seconds:.1f} s for "
            f"{len(figure.seeds) * len(figure.policies)} runs)"
        ),
    )
    for policy, row in rows.items():
        paper = row.get("paper") if comparable else None
        vs_fgd = ""
        if fgd_median and policy != "fgd":
            vs_fgd = f"{(row['median'] / fgd_median - 1) * 100:+.1f} %"
        timing = doc["decision_us"][policy]
        table.add_row(
            policy,
            f"{row['median']:.2f}",
            "-" if paper is None else f"{paper:.2f}",
            "-" if paper is None else f"{row['median'] - paper:+.2f}",
            f"{min(row['seeds']):.2f}-{max(row['seeds']):.2f}",
            vs_fgd,
            f"{timing['median']:.0f}/{timing['p99']:.0f}",
        )
    out.print(table)
    out.print("vs FGD: change of the unallocated GPUs against FGD's in this run (negative: fewer)")
    if not comparable:
        out.print("(the paper's figures apply to openb's nodes at 1.3x inflation only)")
