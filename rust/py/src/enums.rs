//! The core's enums as Python enums, each defined once here: Python reads the members, their
//! labels (the words job files, state files and reports use) and their codes from these
//! classes instead of keeping its own tables.

use gpuplace_core::job::CollectiveKind as CoreKind;
use gpuplace_core::repair::SparePolicy as CorePolicy;
use gpuplace_core::share::{GpuMode as CoreGpuMode, Isolation as CoreIsolation};
use gpuplace_core::state::{Condition as CoreCondition, GpuStatus};
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::errors::{invalid_job, invalid_state};

/// A Python enum over a core enum: members with a label each, `members()` and
/// `from_label()`, conversions to and from the core type, and the Python methods given in an
/// optional `methods { ... }` block.
macro_rules! labelled_enum {
    (
        $(#[$doc:meta])* $name:ident as $py:literal, $err:ident, $what:literal,
        core $core:ty { $($member:ident = $code:literal => $label:expr, $core_v:expr);+ $(;)? }
        $(methods { $($method:item)* })?
    ) => {
        $(#[$doc])*
        #[pyclass(eq, eq_int, frozen, hash, from_py_object, module = "gpuplace._core", name = $py)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        pub(crate) enum $name {
            $($member = $code),+
        }

        impl $name {
            pub(crate) const MEMBERS: &'static [$name] = &[$($name::$member),+];

            pub(crate) fn label_str(self) -> &'static str {
                match self {
                    $($name::$member => $label),+
                }
            }

            #[allow(dead_code)]
            pub(crate) fn to_core(self) -> $core {
                match self {
                    $($name::$member => $core_v),+
                }
            }

            #[allow(dead_code, unreachable_patterns)]
            pub(crate) fn from_core(value: $core) -> $name {
                $(if value == $core_v {
                    return $name::$member;
                })+
                unreachable!("every core value has a member")
            }
        }

        #[pymethods]
        impl $name {
            /// The word job files, state files and reports use for this member.
            #[getter]
            fn label(&self) -> &'static str {
                self.label_str()
            }

            /// Every member, in code order.
            #[classmethod]
            fn members(_cls: &Bound<'_, PyType>) -> Vec<$name> {
                $name::MEMBERS.to_vec()
            }

            /// The member with this label.
            #[classmethod]
            fn from_label(_cls: &Bound<'_, PyType>, label: &str) -> PyResult<$name> {
                $name::MEMBERS
                    .iter()
                    .copied()
                    .find(|m| m.label_str() == label)
                    .ok_or_else(|| {
                        let labels: Vec<&str> =
                            $name::MEMBERS.iter().map(|m| m.label_str()).collect();
                        $err(format!(
                            "{}: expected one of {}, got {label:?}",
                            $what,
                            labels.join(", ")
                        ))
                    })
            }

            $($($method)*)?
        }
    };
}

labelled_enum! {
    /// How a collective moves data.
    CollectiveKind as "CollectiveKind", invalid_job, "collective kind",
    core CoreKind {
        AllReduce = 0 => CoreKind::AllReduce.name(), CoreKind::AllReduce;
        AllGather = 1 => CoreKind::AllGather.name(), CoreKind::AllGather;
        ReduceScatter = 2 => CoreKind::ReduceScatter.name(), CoreKind::ReduceScatter;
        AllToAll = 3 => CoreKind::AllToAll.name(), CoreKind::AllToAll;
        PointToPoint = 4 => CoreKind::PointToPoint.name(), CoreKind::PointToPoint;
    }
}

labelled_enum! {
    /// The effective health of a GPU (`ClusterState.health()` holds these codes).
    Health as "Health", invalid_state, "health",
    core GpuStatus {
        Ok = 0 => "ok", GpuStatus::Ok;
        Failed = 1 => "failed", GpuStatus::Failed;
        Drained = 2 => "drained", GpuStatus::Drained;
    }
}

labelled_enum! {
    /// The condition of a component (`ok` recovers it).
    Condition as "Condition", invalid_state, "condition",
    core Option<CoreCondition> {
        Ok = 0 => "ok", None;
        Degraded = 1 => "degraded", Some(CoreCondition::Degraded);
        Failed = 2 => "failed", Some(CoreCondition::Failed);
        Drained = 3 => "drained", Some(CoreCondition::Drained);
    }
    methods {
        /// How far the condition takes hardware out of service: 0 ok, then degraded,
        /// drained, failed (the core's order; a milder condition never replaces a worse one).
        #[getter]
        fn severity(&self) -> u8 {
            self.to_core().map_or(0, CoreCondition::severity)
        }
    }
}

labelled_enum! {
    /// A piece of hardware whose health is tracked.
    ComponentKind as "ComponentKind", invalid_state, "component kind",
    core u8 {
        Gpu = 0 => "gpu", 0;
        Host = 1 => "host", 1;
        Nic = 2 => "nic", 2;
        Switch = 3 => "switch", 3;
    }
}

labelled_enum! {
    /// Whether a repair may take reserved spares.
    SparePolicy as "SparePolicy", invalid_job, "spares",
    core CorePolicy {
        Allow = 0 => "allow", CorePolicy::Allow;
        Forbid = 1 => "forbid", CorePolicy::Forbid;
        Only = 2 => "only", CorePolicy::Only;
    }
}

labelled_enum! {
    /// The sharing a request accepts on its GPUs.
    Isolation as "Isolation", invalid_job, "isolation",
    core CoreIsolation {
        Any = 0 => "any", CoreIsolation::Any;
        Mig = 1 => "mig", CoreIsolation::Mig;
        Fractional = 2 => "fractional", CoreIsolation::Fractional;
    }
}

labelled_enum! {
    /// How a GPU is shared: by the milli-GPU (time-sliced) or as MIG instances.
    GpuMode as "GpuMode", invalid_state, "GPU mode",
    core CoreGpuMode {
        Fractional = 0 => "fractional", CoreGpuMode::Fractional;
        Mig = 1 => "mig", CoreGpuMode::Mig;
    }
}

/// Why a repair moved a rank.
#[pyclass(
    eq,
    eq_int,
    frozen,
    hash,
    module = "gpuplace._core",
    name = "MoveReason"
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum MoveReason {
    /// Its GPU failed or was drained.
    Lost = 0,
    /// Its confined group could not stay inside its domain, so the whole group moved.
    GroupMoved = 1,
    /// Moved under `max_moves` because the cost went down.
    Improvement = 2,
    /// Moved under `max_moves`, whole with its confined group, off a degraded GPU, host,
    /// NIC or switch (the move's `component`) because that lowered the cost.
    Evacuated = 3,
}

#[pymethods]
impl MoveReason {
    /// The words reports use.
    #[getter]
    fn label(&self) -> &'static str {
        match self {
            MoveReason::Lost => "lost",
            MoveReason::GroupMoved => "group moved",
            MoveReason::Improvement => "improvement",
            MoveReason::Evacuated => "evacuated",
        }
    }
}

/// Register the enums.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CollectiveKind>()?;
    m.add_class::<Health>()?;
    m.add_class::<Condition>()?;
    m.add_class::<ComponentKind>()?;
    m.add_class::<SparePolicy>()?;
    m.add_class::<MoveReason>()?;
    m.add_class::<Isolation>()?;
    m.add_class::<GpuMode>()?;
    Ok(())
}
