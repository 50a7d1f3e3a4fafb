"""Choosing which hosts of an imported fabric are GPU hosts.

A fabric dump lists every host on the network: the storage servers, the controller and the
login nodes carry an HCA like the compute hosts and would otherwise become GPU hosts.
:func:`select_hosts` keeps the hosts matching ``include`` patterns and drops those matching
``exclude`` (shell-style globs, ``dgx*``); :func:`unusual_hosts` warns about hosts whose name
has another shape than the majority's (``login01`` among ``dgx001``...).
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Sequence

from gpuplace.errors import InvalidTopology
from gpuplace.model.inventory import Fabric

__all__ = ["name_shape", "select_hosts", "unusual_hosts"]


def name_shape(host: str) -> str:
    """A host name with its digit runs replaced by ``#`` (``dgx017`` -> ``dgx#``)."""
    return re.sub(r"\d+", "#", host)


def select_hosts(
    fabric: Fabric, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> list[str]:
    """Drop from ``fabric`` the hosts not matching any ``include`` pattern (when given) or
    matching an ``exclude`` pattern; returns the dropped names. Raises InvalidTopology when
    no host is left."""

    def keep(host: str) -> bool:
        if include and not any(fnmatch.fnmatchcase(host, p) for p in include):
            return False
        return not any(fnmatch.fnmatchcase(host, p) for p in exclude)

    dropped = [h for h in fabric.hosts if not keep(h)]
    for host in dropped:
        del fabric.hosts[host]
    for switch in fabric.switches.values():
        switch.hosts -= set(dropped)
    if not fabric.hosts:
        raise InvalidTopology(
            f"no host left after --include {list(include)} / --exclude {list(exclude)}"
        )
    return dropped


def unusual_hosts(fabric: Fabric) -> list[str]:
    """Warnings about hosts whose name shape differs from the majority's."""
    shapes = Counter(name_shape(h) for h in fabric.hosts)
    if len(shapes) < 2:
        return []
    usual, count = shapes.most_common(1)[0]
    odd = sorted(h for h in fabric.hosts if name_shape(h) != usual)
    return [
        f"{len(odd)} hosts are not named like the other {count} ({usual}): "
        + ", ".join(odd[:8])
        + (" ..." if len(odd) > 8 else "")
        + "; storage servers, controllers or login nodes? leave them out with --exclude"
    ]
