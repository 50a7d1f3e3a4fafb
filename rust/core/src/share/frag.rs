//! GPU fragmentation as FGD measures it (Weng et al., "Beware of Fragmentation: Scheduling
//! GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23, section 4).
//!
//! The workload is a distribution of *typical pods* (the most frequent request shapes and their
//! frequencies). For one typical pod `m`, a node's free GPU capacity is *fragmented* when `m`
//! cannot use it:
//!
//! - all of it when `m` cannot run on the node at all: it needs no GPU, its GPU model is not the
//!   node's, the node lacks the CPU for it, or has fewer GPUs with room than it needs;
//! - otherwise the free milli-GPUs of the GPUs that cannot host it (on a fractional GPU: free <
//!   `m`'s milli-GPUs; on a MIG GPU: no instance of its profile fits at an allowed start, or
//!   `m` does not accept the GPU's mode).
//!
//! The node's fragmentation is the expectation over the distribution: `sum_m p_m * frag_m`, in
//! milli-GPUs. FGD places a pod where this grows least. The exact rules (pods without GPUs count
//! the whole free capacity; CPU, not memory, is checked) follow the authors' simulator,
//! `pkg/utils/frag.go` (`NodeGpuShareFragAmount`, `GetNodePodFrag`) in
//! hkust-adsl/kubernetes-scheduler-simulator.

use crate::error::{CoreError, Result};
use crate::share::cluster::{gpu_hosts, Isolation, NodeView, PodRequest};
use crate::share::mig::MigGpu;

#[derive(Debug, Clone, Copy)]
struct Typical {
    cpu_milli: u32,
    gpus: u32,
    gpu_milli: u16,
    gpu_memory_mib: u64,
    isolation: Isolation,
    freq: f64,
}

/// The typical pods that may run on one GPU model.
#[derive(Debug, Clone, Default)]
struct ModelTable {
    /// Frequency of the typical pods that never use this model's GPUs (no GPU, another model).
    blind: f64,
    gpu: Vec<Typical>,
}

/// A workload's distribution of typical pods.
#[derive(Debug, Clone)]
pub struct Distribution {
    entries: Vec<(PodRequest, f64)>,
    tables: Vec<ModelTable>,
}

impl Distribution {
    /// `entries` (a request and its weight, weights positive; normalised here) over a cluster
    /// of `num_models` GPU models.
    pub fn new(entries: Vec<(PodRequest, f64)>, num_models: usize) -> Result<Distribution> {
        let bad = |m: String| Err(CoreError::InvalidJob(m));
        if entries.is_empty() {
            return bad("the pod distribution is empty".into());
        }
        let total: f64 = entries.iter().map(|(_, w)| *w).sum();
        for (pod, w) in &entries {
            pod.check()?;
            if !(w.is_finite() && *w > 0.0) {
                return bad(format!("pod distribution: weight {w} (expected > 0)"));
            }
        }
        let entries: Vec<(PodRequest, f64)> =
            entries.into_iter().map(|(p, w)| (p, w / total)).collect();
        let mut tables = vec![ModelTable::default(); num_models];
        for (model, table) in tables.iter_mut().enumerate() {
            for (pod, freq) in &entries {
                if pod.gpus == 0 || !pod.accepts(Some(model as u8)) {
                    table.blind += freq;
                } else {
                    table.gpu.push(Typical {
                        cpu_milli: pod.cpu_milli,
                        gpus: pod.gpus,
                        gpu_milli: pod.gpu_milli,
                        gpu_memory_mib: pod.gpu_memory_mib,
                        isolation: pod.isolation,
                        freq: *freq,
                    });
                }
            }
        }
        Ok(Distribution { entries, tables })
    }

    /// Expected milli-CPU per milli-GPU of the GPU pods that may run on `model`
    /// (0 when none may).
    pub fn cpu_per_gpu_milli(&self, model: u8) -> f64 {
        let table = &self.tables[model as usize];
        let cpu: f64 = table.gpu.iter().map(|t| t.freq * t.cpu_milli as f64).sum();
        let gpu: f64 = table
            .gpu
            .iter()
            .map(|t| t.freq * t.gpus as f64 * t.gpu_milli as f64)
            .sum();
        if gpu > 0.0 {
            cpu / gpu
        } else {
            0.0
        }
    }

    /// The typical pods and their normalised frequencies.
    pub fn entries(&self) -> &[(PodRequest, f64)] {
        &self.entries
    }

    /// Expected fragmentation (milli-GPUs) of `node` were it to have `cpu_left` CPU, these
    /// free milli-GPUs per GPU and these MIG states (its GPU modes and model as they are).
    pub fn fragmentation(
        &self,
        node: &NodeView<'_>,
        cpu_left: u32,
        gpu_left: &[u16],
        mig: &[MigGpu],
    ) -> f64 {
        let Some(model) = node.spec.model else {
            return 0.0;
        };
        let total: u64 = gpu_left.iter().map(|&g| g as u64).sum();
        if total == 0 {
            return 0.0;
        }
        let table = &self.tables[model as usize];
        let total = total as f64;
        let mut frag = table.blind * total;
        for t in &table.gpu {
            if cpu_left >= t.cpu_milli {
                let mut room = 0u32;
                let mut small = 0u32;
                if !node.any_mig && t.isolation != Isolation::Mig {
                    for &g in gpu_left {
                        if g >= t.gpu_milli {
                            room += 1;
                        } else {
                            small += g as u32;
                        }
                    }
                } else {
                    for (k, &g) in gpu_left.iter().enumerate() {
                        let hosts = gpu_hosts(
                            node.mode[k],
                            g,
                            &mig[k],
                            node.rules,
                            t.gpu_milli,
                            t.gpu_memory_mib,
                            t.isolation,
                        );
                        if hosts {
                            room += 1;
                        } else {
                            small += g as u32;
                        }
                    }
                }
                if room >= t.gpus {
                    frag += t.freq * small as f64;
                    continue;
                }
            }
            frag += t.freq * total;
        }
        frag
    }

    /// [`Self::fragmentation`] of a node as it is.
    pub fn node_fragmentation(&self, node: &NodeView<'_>) -> f64 {
        self.fragmentation(node, node.cpu_left, node.gpu_left, node.mig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::cluster::tests::{pod, small};
    use crate::share::cluster::{GpuMode, Slot};
    use crate::share::mig::tests::a100;

    #[test]
    fn fragmentation_follows_the_definition() {
        // Half the pods want 500 milli-GPUs, half a whole GPU.
        let d = Distribution::new(vec![(pod(1000, 1, 500), 1.0), (pod(1000, 1, 1000), 1.0)], 2)
            .unwrap();
        let c = small();
        let t4 = c.node(2);
        let none = [MigGpu::default(); 2];
        let frag = |cpu, left: &[u16]| d.fragmentation(&t4, cpu, left, &none);
        // An idle 2-GPU node: nothing is fragmented.
        assert_eq!(frag(8000, &[1000, 1000]), 0.0);
        // 300 free on one GPU: a fragment for both kinds; the idle GPU serves both.
        assert_eq!(frag(8000, &[300, 1000]), 300.0);
        // 600 free: usable by the half-GPU pods only.
        assert_eq!(frag(8000, &[600, 0]), 0.5 * 600.0);
        // No CPU left: everything is fragmented.
        assert_eq!(frag(500, &[600, 1000]), 1600.0);
    }

    #[test]
    fn mig_gpus_count_what_their_profiles_cannot_use() {
        let mut c = small();
        c.set_mig_rules(1, a100()).unwrap();
        c.set_mode(2, 0, GpuMode::Mig).unwrap();
        // 4g at slice 0: 3 compute slices left, but no 4g or 7g fits; a 3g does (at 4).
        c.allocate(
            &pod(0, 1, 500),
            &Slot {
                node: 2,
                gpus: vec![0],
                starts: vec![0],
                reconfigure: vec![],
            },
        )
        .unwrap();
        let t4 = c.node(2);
        assert_eq!(t4.gpu_left[0], 1000 - 571);
        let half = Distribution::new(vec![(pod(0, 1, 500), 1.0)], 2).unwrap();
        let third = Distribution::new(vec![(pod(0, 1, 400), 1.0)], 2).unwrap();
        // A 500-milli pod needs a 4g: the MIG GPU's 429 free milli are fragmented.
        assert_eq!(half.node_fragmentation(&t4), 429.0);
        // A 400-milli pod gets a 3g, which fits at slice 4: nothing is fragmented.
        assert_eq!(third.node_fragmentation(&t4), 0.0);
        // A pod that must be time-sliced cannot use the MIG GPU at all.
        let mut sliced = pod(0, 1, 100);
        sliced.isolation = Isolation::Fractional;
        let only = Distribution::new(vec![(sliced, 1.0)], 2).unwrap();
        assert_eq!(only.node_fragmentation(&t4), 429.0);
    }

    #[test]
    fn model_constraints_and_cpu_pods_count_everything() {
        let mut t4_only = pod(1000, 1, 200);
        t4_only.models = 1 << 1;
        let d = Distribution::new(vec![(t4_only, 3.0), (pod(1000, 0, 0), 1.0)], 2).unwrap();
        let c = small();
        // On the G2 nodes neither kind uses the GPUs.
        assert_eq!(d.node_fragmentation(&c.node(0)), 8000.0);
        // On the T4 node the CPU-only quarter counts the free capacity.
        assert_eq!(d.node_fragmentation(&c.node(2)), 0.25 * 2000.0);
    }

    #[test]
    fn bad_distributions_are_refused() {
        assert!(Distribution::new(vec![], 1).is_err());
        assert!(Distribution::new(vec![(pod(0, 1, 100), 0.0)], 1).is_err());
        assert!(Distribution::new(vec![(pod(0, 2, 100), 1.0)], 1).is_err());
    }
}
