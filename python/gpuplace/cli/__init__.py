"""The ``gpuplace`` command line: the command group and the entry point. Every command lives
in its own module under ``gpuplace.cli`` and is registered below with one line.

Every user error prints one line, ``gpuplace: error: ...``, on stderr and exits with status 2
(with ``--format json``, also a JSON error object on stdout); no traceback reaches the user
unless asked for (``gpuplace --debug ...`` or ``GPUPLACE_DEBUG=1``). Anything else that goes
wrong is a bug in gpuplace: one line asking to report it, exit status 1.
Every command takes ``--format table|json``; the schema of each JSON output is in
:mod:`gpuplace.cli.schemas` (``gpuplace schema``). State files are written atomically.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from gpuplace.cli import health, health_ingest, k8s, lifecycle, mig, policy, share, slurm
from gpuplace.cli.bench import bench
from gpuplace.cli.calibrate import calibrate_cmd
from gpuplace.cli.catalog import presets_cmd, schema_cmd, solvers_cmd
from gpuplace.cli.common import json_requested, load_cluster, report_bug, report_error
from gpuplace.cli.fabric import fabric_cmd
from gpuplace.cli.fgd import fgd_cmd
from gpuplace.cli.lazy import LazyGroup
from gpuplace.cli.place import place_cmd
from gpuplace.cli.simulate import simulate_cmd
from gpuplace.cli.topo import topo
from gpuplace.errors import GpuplaceError

__all__ = ["cli", "load_cluster", "main"]


@click.group(
    cls=LazyGroup,
    lazy={
        "serve": ("gpuplace.cli.serve", "serve_cmd"),
        "service": ("gpuplace.cli.serve", "service_group"),
    },
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="gpuplace")
@click.option(
    "--debug",
    is_flag=True,
    help="On an error, print the Python traceback too (also GPUPLACE_DEBUG=1).",
)
def cli(debug: bool) -> None:
    """Topology-aware placement of distributed GPU jobs."""


def debug_requested(argv: list[str]) -> bool:
    """``--debug`` among the options before the command, or ``GPUPLACE_DEBUG`` set (not 0)."""
    if os.environ.get("GPUPLACE_DEBUG", "").strip() not in ("", "0"):
        return True
    for arg in argv:
        if arg == "--debug":
            return True
        if not arg.startswith("-"):
            return False
    return False


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; every user error is reported by
    :func:`gpuplace.cli.common.report_error` (one line on stderr, exit status 2, and a JSON
    error object on stdout when ``--format json`` was asked)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(args)
    try:
        cli.main(args=args, prog_name="gpuplace", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (
        click.exceptions.Abort,
        click.ClickException,
        GpuplaceError,
        KeyboardInterrupt,
        OSError,
    ) as exc:
        if debug:
            traceback.print_exc()
        return report_error(exc, json_output=json_requested(args))
    except Exception as exc:
        # Not an error of the user's input: a bug. One line, exit status 1.
        if debug:
            traceback.print_exc()
        return report_bug(exc, json_output=json_requested(args))
    return 0


cli.add_command(presets_cmd)
cli.add_command(solvers_cmd)
cli.add_command(place_cmd)
cli.add_command(lifecycle.release_cmd)
cli.add_command(lifecycle.cancel_cmd)
cli.add_command(lifecycle.requeue_cmd)
cli.add_command(bench)
cli.add_command(topo)
cli.add_command(health.fail)
cli.add_command(health.degrade)
cli.add_command(health.recover)
cli.add_command(health.drain)
cli.add_command(health.repair_cmd)
cli.add_command(health.status)
cli.add_command(fabric_cmd)
cli.add_command(health_ingest.health)
cli.add_command(policy.policy)
cli.add_command(policy.explain_cmd)
cli.add_command(mig.mig_group)
cli.add_command(share.share_group)
cli.add_command(k8s.k8s)
cli.add_command(slurm.slurm)
cli.add_command(simulate_cmd)
cli.add_command(calibrate_cmd)
cli.add_command(schema_cmd)
cli.add_command(fgd_cmd)

if __name__ == "__main__":
    sys.exit(main())
