"""The ``gpuplace`` command line: the command group and the entry point. Every command lives
in its own module under ``gpuplace.cli`` and is registered below with one line.

Every user error prints one line, ``gpuplace: error: ...``, on stderr and exits with status 2;
no traceback reaches the user. State files are written atomically.
"""

from __future__ import annotations

import sys

import click

from gpuplace.cli import health, health_ingest, k8s, mig, policy, share, slurm
from gpuplace.cli.bench import bench
from gpuplace.cli.calibrate import calibrate_cmd
from gpuplace.cli.catalog import presets_cmd, solvers_cmd
from gpuplace.cli.common import load_cluster
from gpuplace.cli.fgd import fgd_cmd
from gpuplace.cli.place import place_cmd
from gpuplace.cli.simulate import simulate_cmd
from gpuplace.cli.topo import topo
from gpuplace.errors import GpuplaceError

__all__ = ["cli", "load_cluster", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpuplace")
def cli() -> None:
    """Topology-aware placement of distributed GPU jobs."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning every user error into one line on stderr."""
    try:
        cli.main(args=argv, prog_name="gpuplace", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("gpuplace: error: aborted", err=True)
        return 130
    except click.ClickException as exc:
        click.echo(f"gpuplace: error: {exc.format_message()}", err=True)
        return 2
    except GpuplaceError as exc:
        message = " ".join(str(exc).split("\n"))
        click.echo(f"gpuplace: error: {message}", err=True)
        return 2
    except KeyboardInterrupt:
        click.echo("gpuplace: error: interrupted", err=True)
        return 130
    except OSError as exc:
        click.echo(
            f"gpuplace: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True
        )
        return 2
    return 0


cli.add_command(presets_cmd)
cli.add_command(solvers_cmd)
cli.add_command(place_cmd)
cli.add_command(bench)
cli.add_command(topo)
cli.add_command(health.fail)
cli.add_command(health.degrade)
cli.add_command(health.recover)
cli.add_command(health.drain)
cli.add_command(health.repair_cmd)
cli.add_command(health.status)
cli.add_command(health_ingest.health)
cli.add_command(policy.policy)
cli.add_command(policy.explain_cmd)
cli.add_command(mig.mig_group)
cli.add_command(share.share_group)
cli.add_command(k8s.k8s)
cli.add_command(slurm.slurm)
cli.add_command(simulate_cmd)
cli.add_command(calibrate_cmd)
cli.add_command(fgd_cmd)

if __name__ == "__main__":
    sys.exit(main())
