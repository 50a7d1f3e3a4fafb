//! GPU fragmentation as FGD measures it (Weng et al., "Beware of Fragmentation: Scheduling
//! GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23, section 4).
//!
//! The workload is a distribution of *typical pods* (the most frequent request shapes and their
//! frequencies). For one typical pod `m`, a node's free GPU capacity is *fragmented* when `m`
//! cannot use it:
//!
//! - all of it when `m` cannot run on the node at all: it needs no GPU, its GPU model is not the
//!   node's, the node lacks the CPU for it, or has fewer GPUs with room than it needs;
//! - otherwise the free milli-GPUs of the GPUs too small for it (free < `m`'s milli-GPUs).
//!
//! The node's fragmentation is the expectation over the distribution: `sum_m p_m * frag_m`, in
//! milli-GPUs. FGD places a pod where this grows least. The exact rules (pods without GPUs count
//! the whole free capacity; CPU, not memory, is checked) follow the authors' simulator,
//! `pkg/utils/frag.go` (`NodeGpuShareFragAmount`, `GetNodePodFrag`) in
//! hkust-adsl/kubernetes-scheduler-simulator.

use crate::error::{CoreError, Result};
use crate::share::cluster::{NodeView, PodRequest};

#[derive(Debug, Clone, Copy)]
struct Typical {
    cpu_milli: u32,
    gpus: u32,
    gpu_milli: u16,
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

    /// Expected fragmentation (milli-GPUs) of a node of `model` with `cpu_left` and these free
    /// milli-GPUs per GPU.
    pub fn fragmentation(&self, model: Option<u8>, cpu_left: u32, gpu_left: &[u16]) -> f64 {
        let Some(model) = model else {
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
                for &g in gpu_left {
                    if g >= t.gpu_milli {
                        room += 1;
                    } else {
                        small += g as u32;
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
        self.fragmentation(node.spec.model, node.cpu_left, node.gpu_left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::cluster::tests::{pod, small};

    #[test]
    fn fragmentation_follows_the_definition() {
        // Half the pods want 500 milli-GPUs, half a whole GPU.
        let d = Distribution::new(vec![(pod(1000, 1, 500), 1.0), (pod(1000, 1, 1000), 1.0)], 2)
            .unwrap();
        // An idle 2-GPU node: nothing is fragmented.
        assert_eq!(d.fragmentation(Some(0), 8000, &[1000, 1000]), 0.0);
        // 300 free on one GPU: a fragment for both kinds; the idle GPU serves both.
        assert_eq!(d.fragmentation(Some(0), 8000, &[300, 1000]), 300.0);
        // 600 free: usable by the half-GPU pods only.
        assert_eq!(d.fragmentation(Some(0), 8000, &[600, 0]), 0.5 * 600.0);
        // No CPU left: everything is fragmented.
        assert_eq!(d.fragmentation(Some(0), 500, &[600, 1000]), 1600.0);
        // No GPUs: nothing to fragment.
        assert_eq!(d.fragmentation(None, 8000, &[]), 0.0);
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
