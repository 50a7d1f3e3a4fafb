//! `gpuplace._core`: thin PyO3 bindings over gpuplace-core, one module per concept (as
//! polars and rustworkx organise theirs):
//!
//! - [`errors`]: core errors as `gpuplace.errors` classes, and [`errors::enter`], the one way
//!   into the core (GIL released, errors mapped, long searches stoppable with Ctrl-C);
//! - [`convert`]: numpy arrays and Python values to and from the core's owned data;
//! - [`topology`], [`job`], [`state`]: the compiled topology, job and cluster state;
//! - [`enums`]: the core's enums as Python enums (collective kind, health, condition,
//!   component kind, spare policy, move reason), each defined once;
//! - [`solve`]: the cost model, the Rust solvers behind the placement gate, refine and
//!   rank mapping;
//! - [`fabric`]: uplink capacities, the running jobs' load on them, contention reports and
//!   storage traffic;
//! - [`policy`]: the fence confining one job's placement or repair to the GPUs its pool and
//!   hardware rules allow;
//! - [`power`]: the compiled power domains and the ledger of a state's draw per domain
//!   and phase slot (budget checks and the GPUs a job may take);
//! - [`pricing`]: the pricing view every solver prices on (usable and degraded GPUs, side
//!   factors, path bandwidths) and the collective terms exact models use;
//! - [`nccl`]: the NCCL side of the topology (NVLS, NICs, SHARP, host-count factors,
//!   algorithm efficiencies, GPU peaks) and the ring's hops;
//! - [`step`]: the GPU peak table and the step-time model;
//! - [`share`]: shared GPUs (milli-GPU requests with CPU and memory), the FGD paper's
//!   policies and gpuplace's, and the arrival-only replay.
//!
//! New bindings go in a new file with a small registration call below.

mod convert;
mod enums;
mod errors;
mod fabric;
mod job;
mod nccl;
mod policy;
mod power;
mod pricing;
mod share;
mod solve;
mod state;
mod step;
mod topology;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<topology::PyTopology>()?;
    m.add_class::<job::PyJobSpec>()?;
    m.add_class::<state::PyClusterState>()?;
    m.add_class::<state::PyRepairPlan>()?;
    m.add_class::<state::PyRankMove>()?;
    m.add_class::<solve::PyCostReport>()?;
    m.add_class::<solve::PyPlaceResult>()?;
    m.add_class::<solve::PyRefineResult>()?;
    m.add_class::<solve::PyRankMapping>()?;
    enums::register(m)?;
    m.add_function(wrap_pyfunction!(solve::evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(solve::place, m)?)?;
    m.add_function(wrap_pyfunction!(solve::solve, m)?)?;
    m.add_function(wrap_pyfunction!(solve::admit, m)?)?;
    m.add_function(wrap_pyfunction!(solve::lower_bound, m)?)?;
    m.add_function(wrap_pyfunction!(solve::refine, m)?)?;
    m.add_function(wrap_pyfunction!(solve::map_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(solve::rust_solvers, m)?)?;
    m.add_function(wrap_pyfunction!(solve::loss_factor, m)?)?;
    m.add_function(wrap_pyfunction!(job::rank_groups, m)?)?;
    m.add_function(wrap_pyfunction!(job::class_names, m)?)?;
    fabric::register(m)?;
    policy::register(m)?;
    power::register(m)?;
    pricing::register(m)?;
    nccl::register(m)?;
    step::register(m)?;
    share::register(m)?;
    m.add("MIN_FACTOR", gpuplace_core::cost::MIN_FACTOR)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
