"""The core's enums, each defined once in Rust (``rust/py/src/enums.rs``) and used here as
they are: every member has a ``label`` (the word job files, state files and reports use) and
an integer code; ``Kind.members()`` lists them and ``Kind.from_label(word)`` looks one up.

* :class:`CollectiveKind`: how a collective moves data (``all-reduce`` ... ``p2p``).
* :class:`Health`: a GPU's effective health (``ClusterState.health()`` holds the codes).
* :class:`Condition`: a component's condition (``ok``, ``degraded``, ``failed``, ``drained``).
* :class:`ComponentKind`: the hardware whose health is tracked (``gpu``, ``host``, ``nic``,
  ``switch``).
* :class:`SparePolicy`: whether a repair may take reserved spares.
* :class:`MoveReason`: why a repair moved a rank.
* :class:`Isolation`: the sharing a shared-GPU request accepts (``any``, ``mig``,
  ``fractional``).
* :class:`GpuMode`: how a shared GPU is shared (``fractional``, ``mig``).
"""

from gpuplace._core import (
    CollectiveKind,
    ComponentKind,
    Condition,
    GpuMode,
    Health,
    Isolation,
    MoveReason,
    SparePolicy,
)

__all__ = [
    "CollectiveKind",
    "ComponentKind",
    "Condition",
    "GpuMode",
    "Health",
    "Isolation",
    "MoveReason",
    "SparePolicy",
]
