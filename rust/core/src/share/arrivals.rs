//! The FGD experiment's arrival-only packing: pods arrive one after another on an empty
//! cluster, each is placed by the policy or fails (and is dropped), nothing ever leaves. After
//! every arrival the run records the milli-GPUs that have arrived so far (placed or not) and
//! the milli-GPUs allocated; the unallocated share at a given arrived share is the paper's
//! Figure 9a (Weng et al., ATC'23). Many runs (policies x seeds) go in parallel.

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{CoreError, Result};
use crate::share::cluster::{PodRequest, SharedCluster};
use crate::share::frag::Distribution;
use crate::share::policy::{NodePrice, Scheduler, SharePolicy};

/// One run: the arrival order (indexes into the pod list), the policy and its seed.
#[derive(Debug, Clone)]
pub struct Run {
    pub order: Vec<u32>,
    pub policy: SharePolicy,
    pub seed: u64,
}

/// What one run recorded, one entry per arrival.
#[derive(Debug, Clone, Default)]
pub struct Arrivals {
    pub arrived_gpu_milli: Vec<u64>,
    pub used_gpu_milli: Vec<u64>,
    pub placed: Vec<bool>,
    /// Nanoseconds the policy took to decide (the filter, scores and choice; not the
    /// bookkeeping of the allocation).
    pub decision_ns: Vec<u64>,
    /// Idle GPUs switched between fractional and MIG mode.
    pub reconfigurations: u64,
}

fn check(pods: &[PodRequest], run: &Run) -> Result<()> {
    for pod in pods {
        pod.check()?;
    }
    if let Some(&bad) = run.order.iter().find(|&&i| i as usize >= pods.len()) {
        return Err(CoreError::InvalidJob(format!(
            "arrival order names pod {bad}; there are {}",
            pods.len()
        )));
    }
    Ok(())
}

fn check_prices(cluster: &SharedCluster, prices: &Option<Arc<Vec<NodePrice>>>) -> Result<()> {
    match prices {
        Some(p) if p.len() != cluster.num_nodes() => Err(CoreError::InvalidJob(format!(
            "{} node prices for {} nodes",
            p.len(),
            cluster.num_nodes()
        ))),
        _ => Ok(()),
    }
}

/// Replay one run on a copy of `cluster` (left unchanged).
pub fn replay(
    cluster: &SharedCluster,
    pods: &[PodRequest],
    run: &Run,
    distribution: Option<Arc<Distribution>>,
    prices: Option<Arc<Vec<NodePrice>>>,
    reconfigure: bool,
) -> Result<Arrivals> {
    check(pods, run)?;
    check_prices(cluster, &prices)?;
    let mut cluster = cluster.clone();
    let before = cluster.reconfigurations();
    let mut scheduler = Scheduler::new(run.policy, run.seed, distribution)?
        .with_prices(prices)
        .with_reconfiguration(reconfigure);
    let n = run.order.len();
    let mut out = Arrivals {
        arrived_gpu_milli: Vec::with_capacity(n),
        used_gpu_milli: Vec::with_capacity(n),
        placed: Vec::with_capacity(n),
        decision_ns: Vec::with_capacity(n),
        reconfigurations: 0,
    };
    let mut arrived = 0u64;
    for (k, &i) in run.order.iter().enumerate() {
        if k % 256 == 0 && crate::interrupt::interrupted() {
            break;
        }
        let pod = &pods[i as usize];
        arrived += pod.total_gpu_milli();
        let start = Instant::now();
        let slot = scheduler.choose(&cluster, pod);
        out.decision_ns.push(start.elapsed().as_nanos() as u64);
        if let Some(slot) = &slot {
            cluster.allocate_chosen(pod, slot);
        }
        out.placed.push(slot.is_some());
        out.arrived_gpu_milli.push(arrived);
        out.used_gpu_milli.push(cluster.used_gpu_milli());
    }
    out.reconfigurations = cluster.reconfigurations() - before;
    Ok(out)
}

/// [`replay`] every run, in parallel (rayon's pool); results in the order of `runs`.
pub fn replay_all(
    cluster: &SharedCluster,
    pods: &[PodRequest],
    runs: &[Run],
    distribution: Option<Arc<Distribution>>,
    prices: Option<Arc<Vec<NodePrice>>>,
    reconfigure: bool,
) -> Result<Vec<Arrivals>> {
    check_prices(cluster, &prices)?;
    for run in runs {
        check(pods, run)?;
        if run.policy.needs_distribution() && distribution.is_none() {
            Scheduler::new(run.policy, run.seed, None)?;
        }
    }
    runs.par_iter()
        .map(|run| {
            replay(
                cluster,
                pods,
                run,
                distribution.clone(),
                prices.clone(),
                reconfigure,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::cluster::tests::{pod, small};

    #[test]
    fn arrivals_account_for_every_pod() {
        let c = small();
        let pods = vec![pod(1000, 1, 400), pod(1000, 8, 1000), pod(1000, 2, 1000)];
        let order: Vec<u32> = (0..30).map(|k| k % 3).collect();
        let dist =
            Arc::new(Distribution::new(pods.iter().map(|p| (*p, 1.0)).collect(), 2).unwrap());
        let runs: Vec<Run> = SharePolicy::ALL
            .iter()
            .map(|&policy| Run {
                order: order.clone(),
                policy,
                seed: 5,
            })
            .collect();
        let out = replay_all(&c, &pods, &runs, Some(dist), None, false).unwrap();
        for (run, a) in runs.iter().zip(&out) {
            assert_eq!(a.placed.len(), 30);
            let placed: u64 = run
                .order
                .iter()
                .zip(&a.placed)
                .filter(|(_, &ok)| ok)
                .map(|(&i, _)| pods[i as usize].total_gpu_milli())
                .sum();
            assert_eq!(*a.used_gpu_milli.last().unwrap(), placed);
            assert_eq!(
                *a.arrived_gpu_milli.last().unwrap(),
                10 * (400 + 8000 + 2000)
            );
            assert!(a.used_gpu_milli.windows(2).all(|w| w[0] <= w[1]));
            assert!(placed <= c.total_gpu_milli());
        }
        // The cluster the runs started from is untouched.
        assert_eq!(c.used_gpu_milli(), 0);
    }

    #[test]
    fn pods_that_need_mig_get_idle_gpus_reconfigured() {
        let mut c = small();
        c.set_mig_rules(1, crate::share::mig::tests::a100())
            .unwrap();
        let mut isolated = pod(1000, 1, 300);
        isolated.isolation = crate::share::cluster::Isolation::Mig;
        let pods = vec![isolated, pod(1000, 1, 500)];
        let run = Run {
            order: vec![0, 0, 1, 0],
            policy: SharePolicy::BestFit,
            seed: 1,
        };
        // Without reconfiguration no GPU is in MIG mode: the isolated pods fail.
        let fixed = replay(&c, &pods, &run, None, None, false).unwrap();
        assert_eq!(fixed.placed, vec![false, false, true, false]);
        // With it, one T4 GPU turns MIG and holds two 3g instances (300 milli-GPUs need 3 of
        // 7 slices); best fit puts the share on the other T4 GPU, so the third isolated pod
        // finds no idle GPU of a model with MIG rules left.
        let switched = replay(&c, &pods, &run, None, None, true).unwrap();
        assert_eq!(switched.placed, vec![true, true, true, false]);
        assert_eq!(switched.reconfigurations, 1);
    }

    #[test]
    fn a_bad_order_is_refused() {
        let run = Run {
            order: vec![3],
            policy: SharePolicy::BestFit,
            seed: 0,
        };
        assert!(replay(&small(), &[pod(0, 0, 0)], &run, None, None, false).is_err());
    }
}
