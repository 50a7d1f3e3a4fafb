//! Shared GPUs: pods that ask for a share of one GPU (milli-GPUs), whole GPUs, CPU and memory,
//! on nodes of several GPU models; the fragmentation of shared GPUs as FGD measures it; the
//! placement policies of the FGD paper and gpuplace's own; and the paper's arrival-only
//! packing experiment.
//!
//! - [`cluster`]: nodes, free resources per node and per GPU, requests and their slots;
//! - [`frag`]: the expected fragmentation of a node under a distribution of typical pods;
//! - [`mig`]: MIG as a sharing mode, the profile rules and a MIG GPU's instances;
//! - [`policy`]: the policies (Random, DotProd, Clustering, Packing, BestFit, FGD, gpuplace);
//! - [`arrivals`]: the arrival-only replay of Figure 9a, many runs in parallel.

pub mod arrivals;
pub mod cluster;
pub mod frag;
pub mod mig;
pub mod policy;

pub use arrivals::{replay, replay_all, Arrivals, Run};
pub use cluster::{
    Affinity, GpuMode, Isolation, ModelSet, NodeSpec, NodeView, PodRequest, SharedCluster, Slot,
    MILLI,
};
pub use frag::Distribution;
pub use mig::{MigGpu, MigProfile, MigRules};
pub use policy::{NodePrice, Scheduler, SharePolicy, STRANDED_WEIGHT};
