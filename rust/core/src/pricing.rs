//! The one view of a cluster state that every solver prices on.
//!
//! A solver needs two things from a state: which GPUs it may use, and how fast every path
//! between two of them is. Both follow from the health rules of [`crate::state`] (a GPU is
//! usable when it is unallocated, not a reserved spare and nothing on its path failed or is
//! drained; a path runs at the healthy bandwidth times the smallest factor of the components
//! it crosses). [`PricingView`] derives them in one place, from the same side factors the cost
//! model ([`crate::cost::evaluate_in`]) applies, so a solver written anywhere (Rust or
//! Python, through the bindings) prices exactly what the evaluator charges and never restates
//! a health rule:
//!
//! - [`PricingView::usable`]: per GPU, may a normal placement take it;
//! - [`PricingView::degraded`]: per GPU, some degraded component slows a path from it (its
//!   side factor is below 1 at some level); a placement on GPUs that are not degraded is
//!   priced at the healthy level bandwidths;
//! - [`PricingView::side_factors`]: per GPU and level, the smallest factor on its half of a
//!   path whose lowest common level is that level (`num_gpus x levels`, GPU-major, all 1 on a
//!   healthy state);
//! - [`PricingView::bandwidth_matrix`]: the bandwidth (GB/s) of every path among a set of
//!   GPUs, host bandwidth matrices and degradation included: the number the cost model
//!   divides by.

use crate::cost::Health;
use crate::error::{CoreError, Result};
use crate::state::ClusterState;
use crate::topology::Topology;

/// What a solver may use and what each path costs, derived from one [`ClusterState`].
#[derive(Clone, Copy)]
pub struct PricingView<'a> {
    state: &'a ClusterState,
    health: Health<'a>,
}

impl<'a> PricingView<'a> {
    pub fn of(state: &'a ClusterState) -> PricingView<'a> {
        PricingView {
            state,
            health: Health::of(state),
        }
    }

    fn topology(&self) -> &'a Topology {
        self.state.topology().as_ref()
    }

    /// Per GPU: a normal placement may take it (unallocated, usable, not a reserved spare).
    pub fn usable(&self) -> Vec<bool> {
        (0..self.topology().num_gpus())
            .map(|g| self.state.is_free(g))
            .collect()
    }

    /// Per GPU: some degraded component slows a path leaving it.
    pub fn degraded(&self) -> Vec<bool> {
        (0..self.topology().num_gpus())
            .map(|g| self.state.is_degraded(g))
            .collect()
    }

    /// Side factors (`num_gpus x levels`, GPU-major): 1 everywhere on a healthy state.
    pub fn side_factors(&self) -> Vec<f32> {
        match self.state.path_factors() {
            Some(f) => f.to_vec(),
            None => vec![1.0; self.topology().num_gpus() * self.topology().num_levels()],
        }
    }

    /// Bandwidth (GB/s) of the path between two distinct GPUs, as the cost model prices it.
    pub fn pair_bandwidth(&self, a: usize, b: usize) -> f64 {
        let topo = self.topology();
        self.health.bandwidth(topo, a, b, topo.lca(a, b))
    }

    /// Bandwidth (GB/s) between every two of `gpus` (`k x k`, row-major; the diagonal is
    /// infinite: a GPU does not talk to itself over the fabric).
    pub fn bandwidth_matrix(&self, gpus: &[u32]) -> Result<Vec<f64>> {
        let n = self.topology().num_gpus();
        if let Some(&g) = gpus.iter().find(|&&g| g as usize >= n) {
            return Err(CoreError::InvalidState(format!(
                "GPU {g} does not exist (the cluster has {n})"
            )));
        }
        let k = gpus.len();
        let mut out = vec![f64::INFINITY; k * k];
        for i in 0..k {
            for j in (i + 1)..k {
                let bw = self.pair_bandwidth(gpus[i] as usize, gpus[j] as usize);
                out[i * k + j] = bw;
                out[j * k + i] = bw;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::evaluate_in;
    use crate::job::{Collective, CollectiveKind, Dim, JobSpec};
    use crate::state::{Component, ComponentHealth, Condition};
    use crate::topology::tests::tree;
    use std::sync::Arc;

    #[test]
    fn view_prices_what_the_evaluator_charges() {
        let topo = Arc::new(tree(4, 8, 2));
        let mut s = ClusterState::with_nics(topo.clone(), (0..32).collect()).unwrap();
        s.allocate("bg", &[0, 1]).unwrap();
        s.set_condition(
            &[Component::Nic(9)],
            Some(ComponentHealth {
                condition: Condition::Degraded,
                factor: 0.5,
                reason: "loss".into(),
            }),
        )
        .unwrap();
        let view = PricingView::of(&s);
        let usable = view.usable();
        assert!(!usable[0] && usable[2]);
        let degraded = view.degraded();
        assert_eq!(degraded.iter().filter(|&&d| d).count(), 1);
        assert!(degraded[9]);
        // GPU 9 talks to its own node at full speed, through its slow NIC to anyone else.
        let m = view.bandwidth_matrix(&[8, 9, 16]).unwrap();
        assert_eq!(m[1], topo.pair_bandwidth(8, 9));
        assert_eq!(m[5], topo.pair_bandwidth(9, 16) * 0.5);
        assert_eq!(m[2], topo.pair_bandwidth(8, 16));
        let job = JobSpec::new(
            2,
            vec![Dim {
                name: "dp".into(),
                size: 2,
                confine: None,
            }],
            topo.num_levels() - 1,
            vec![0, 2],
            vec![0, 1],
            vec![Collective {
                group: 0,
                kind: CollectiveKind::AllReduce,
                bytes: 1e9,
                count: 1.0,
                class: 0,
                dim: Some(0),
            }],
            vec![],
            &topo,
        )
        .unwrap();
        let priced = evaluate_in(&s, &job, &[9, 16]).unwrap().comm_seconds;
        let latency = 2.0 * topo.levels()[2].latency_us * 1e-6;
        assert!((priced - latency - 1e9 / (m[5] * 1e9)).abs() < 1e-12);
        assert!(view.bandwidth_matrix(&[99]).is_err());
    }
}
