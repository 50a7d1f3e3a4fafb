//! gpuplace-core: topology-aware placement of distributed GPU jobs, without Python.
//!
//! The data flows one way: a caller compiles its cluster into a [`Topology`] (flat arrays of
//! domain ids per level), its job into a [`JobSpec`] (communication groups and collectives),
//! keeps a [`ClusterState`], and asks a solver for a placement (GPU id per rank). There is one
//! cost model, [`cost::evaluate`]; every reported cost comes from it.

pub mod cost;
pub mod error;
pub mod fabric;
pub mod gate;
pub mod gpu;
pub mod greedy;
pub mod interrupt;
pub mod job;
pub mod nccl;
pub mod pipeline;
pub mod power;
pub mod pricing;
pub mod qap;
pub mod refine;
pub mod repair;
pub mod request;
pub mod share;
pub mod solvers;
pub mod state;
pub mod step;
pub mod storage;
pub mod topology;

pub use cost::{evaluate, CostReport};
pub use error::{CoreError, Result};
pub use job::{Collective, CollectiveKind, JobSpec};
pub use state::{ClusterState, Component, ComponentHealth, Condition, GpuStatus};
pub use topology::{Level, NodeType, Routing, Topology};
