"""Hardware and software failures for the cluster simulator, drawn per component from rates.

The default model, :func:`llama3`, is the Llama 3 report's: 419 unexpected interruptions in a
54-day snapshot of pre-training on 16,384 H100 GPUs (Llama Team, AI @ Meta, "The Llama 3 Herd
of Models", arXiv:2407.21783, section 3.3.4 and table 5). Table 5's counts are used as given:

* GPU (268, each fails one GPU): faulty GPU 148, GPU HBM3 memory 72, GPU SRAM memory 19, GPU
  system processor 17, silent data corruption 6, GPU thermal interface + sensor 6;
* software (63, each restarts the job on one GPU): software bug 54, NCCL watchdog timeouts 7,
  dependency 2;
* network (35, each fails one host's links): network switch / cable 35;
* host (53, each fails one host): host maintenance 32, NIC 7, SSD 3, power supply 3, server
  chassis 2, IO expansion board 2, CPU 2, system memory 2.

(table 5's GPU rows are 268 of 419 interruptions; the report's own "58.7 % GPU issues" sums its
percentage column, whose 30.1 % for faulty GPUs does not match 148 / 419.) Each cause's rate is
its count over 54 days and over the components of its kind on that cluster (16,384 GPUs, 2,048
hosts), so it scales with the simulated cluster. A software failure hits the GPU it is drawn on
and restarts the job there, if any (idle GPUs have no software to fail).

Times to repair are not in the report; the defaults are assumptions, stated here: a GPU or host
is swapped in 24 h, a network link in 4 h. Degraded links (packet loss on a NIC, which the
cost model prices) are drawn at :data:`DEGRADED_LINK_RATE` per NIC-day with 1 % loss for
12 h -- also an assumption, written as one so a file can replace it.

A failures file (YAML) gives the same fields::

    causes:
      - {name: gpu, component: gpu, per_component_per_day: 1.1e-4, repair_hours: 24}
      - {name: link-loss, component: nic, per_component_per_day: 1e-4, repair_hours: 12, loss: 0.01}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuplace._util.documents import describe, read_yaml
from gpuplace.errors import InvalidJob

__all__ = ["COMPONENTS", "Cause", "FailureModel", "llama3", "load_failures"]

#: Components a cause can hit: a GPU, a host, a host's NIC link (fails it), a NIC degraded by
#: packet loss (slows the paths through it), or the software of the job on a GPU.
COMPONENTS = ("gpu", "host", "network", "nic", "software")

_LLAMA3_DAYS = 54.0
_LLAMA3_GPUS = 16_384
_LLAMA3_HOSTS = 2_048
#: Degraded-link events per NIC per day (assumed; see the module docstring).
DEGRADED_LINK_RATE = 1e-4


@dataclass(frozen=True)
class Cause:
    """A failure cause: ``rate`` events per component per second; ``repair_s`` until the
    component is back; ``loss`` the packet loss of a degraded link (component ``nic``)."""

    name: str
    component: str
    rate: float
    repair_s: float
    loss: float = 0.0


@dataclass(frozen=True)
class FailureModel:
    name: str
    causes: tuple[Cause, ...]

    def draw(
        self, counts: dict[str, int], horizon_s: float, seed: int
    ) -> list[tuple[float, Cause, int]]:
        """Events up to ``horizon_s``: (time, cause, index of the component hit), given the
        number of components of each kind. Poisson per cause; deterministic for a seed."""
        rng = np.random.default_rng(seed)
        events: list[tuple[float, Cause, int]] = []
        for cause in self.causes:
            count = counts.get("host" if cause.component == "network" else cause.component, 0)
            if cause.component == "software":
                count = counts.get("gpu", 0)
            total_rate = cause.rate * count
            if total_rate <= 0 or count == 0:
                continue
            n = rng.poisson(total_rate * horizon_s)
            times = np.sort(rng.uniform(0.0, horizon_s, size=n))
            targets = rng.integers(0, count, size=n)
            events.extend((float(t), cause, int(i)) for t, i in zip(times, targets, strict=True))
        events.sort(key=lambda e: (e[0], e[1].name, e[2]))
        return events


_DAY = 86_400.0


def llama3() -> FailureModel:
    """The Llama 3 report's interruption rates (see the module docstring)."""
    per_gpu = 1.0 / (_LLAMA3_DAYS * _DAY * _LLAMA3_GPUS)
    per_host = 1.0 / (_LLAMA3_DAYS * _DAY * _LLAMA3_HOSTS)
    return FailureModel(
        "llama3",
        (
            Cause("gpu", "gpu", 268 * per_gpu, 24 * 3600.0),
            Cause("software", "software", 63 * per_gpu, 0.0),
            Cause("network", "network", 35 * per_host, 4 * 3600.0),
            Cause("host", "host", 53 * per_host, 24 * 3600.0),
            Cause("link-degraded", "nic", DEGRADED_LINK_RATE / _DAY, 12 * 3600.0, loss=0.01),
        ),
    )


def _name(value: Any, component: str, where: str) -> str:
    if value is None or value == "":
        return component
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidJob(f"{where}: name: expected a string, got {describe(value)}")
    return str(value)


def load_failures(spec: str) -> FailureModel | None:
    """``llama3``, ``none`` or a failures YAML file (see the module docstring)."""
    if spec == "none":
        return None
    if spec == "llama3":
        return llama3()
    path = Path(spec)
    if not path.exists():
        raise InvalidJob(
            f"unknown failure model {spec!r}: neither llama3, none nor an existing file"
        )
    document: Any = read_yaml(path, InvalidJob)
    if not isinstance(document, dict) or not isinstance(document.get("causes"), list):
        raise InvalidJob(f"{path}: expected a mapping with a list 'causes'")
    causes = []
    for i, raw in enumerate(document["causes"]):
        where = f"{path}: causes[{i}]"
        if not isinstance(raw, dict):
            raise InvalidJob(f"{where}: expected a mapping")
        component = raw.get("component")
        if not isinstance(component, str) or component not in COMPONENTS:
            raise InvalidJob(
                f"{where}: component: expected one of {', '.join(COMPONENTS)}, "
                f"got {describe(component)}"
            )
        values = {}
        for key in ("per_component_per_day", "repair_hours", "loss"):
            value = raw.get(key, 0.0 if key != "per_component_per_day" else None)
            try:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError
                number = float(value)
            except (TypeError, OverflowError):
                number = float("nan")
            if not 0 <= number < float("inf"):
                raise InvalidJob(
                    f"{where}: {key}: expected a finite number >= 0, got {describe(value)}"
                )
            values[key] = number
        if component == "nic" and not 0 < values["loss"] < 1:
            raise InvalidJob(f"{where}: loss: a degraded link needs a packet loss in (0, 1)")
        causes.append(
            Cause(
                _name(raw.get("name"), component, where),
                component,
                values["per_component_per_day"] / _DAY,
                values["repair_hours"] * 3600.0,
                values["loss"],
            )
        )
    return FailureModel(path.stem, tuple(causes))
