//! Step time, MFU and tokens per second of a placement, from the communication the cost
//! model prices ([`crate::cost::evaluate`]) and the compute the job declares.
//!
//! * **Compute per step** is the model FLOPs of one step divided over the job's GPUs, each
//!   running at its peak ([`crate::gpu`]) times an achievable efficiency:
//!   `compute = F / (gpus · peak · efficiency)`. For a dense transformer `F ≈ 6 · P · T`
//!   (P parameters, T tokens per step; Kaplan et al., "Scaling Laws for Neural Language
//!   Models", 2020, section 2.1), for a mixture of experts `6 · P_active · T`; a job may give F
//!   directly. The default efficiency, 0.6, is an assumption: Narayanan et al. (SC21, table 1)
//!   reach 44–52 % of A100 peak end to end *including* communication and the pipeline bubble,
//!   so the compute kernels alone run somewhat above that.
//! * **Pipeline bubble**: `compute · (pp − 1) / (v · m)` with `v` virtual stages per rank (1
//!   for 1F1B, Megatron's default: `(pp − 1) / (m + pp − 1)` of the pipelined time is idle;
//!   `v ≥ 2` for interleaved schedules); the schedules and their sources are in
//!   [`crate::pipeline`].
//! * **Overlap**, per collective class, by the dimension it belongs to:
//!   - dp gradient reduction runs bucketed during the backward pass (PyTorch DDP, Li et al.,
//!     VLDB 2020; Megatron's overlapped distributed optimizer), so only the part longer than
//!     the backward pass is exposed: `max(0, T_dp − overlap · backward)` with the backward pass
//!     `backward_fraction` (2/3: twice the forward FLOPs) of compute;
//!   - tp all-reduces sit on the critical path of every layer (SC21, section 3.2), ep all-to-all
//!     dispatch/combine likewise (GShard), cp all-gathers and pp point-to-point are counted as
//!     exposed too: overlap 0 by default;
//!   - any class may be given another overlap fraction `f` in [0, 1]: its exposed time is
//!     `max(0, T − f · window)`, the window being the backward pass for dp and the whole
//!     compute otherwise. Explicit traffic is always exposed.
//! * `step = compute + bubble + exposed comm`, plus storage when the job reads a dataset or
//!   writes checkpoints (input reads prefetched under the step, checkpoint writes a stall:
//!   [`crate::storage::step_with_io`]); `MFU = F / (step · gpus · peak)` (the PaLM
//!   definition, Chowdhery et al. 2022, appendix B: model FLOPs only, no recomputation);
//!   `tokens/s = T / step`. The Llama 3 report (Dubey et al. 2024, table 4) gives 38–43 % MFU
//!   at 8k–16k H100s as a sanity range for large, well-tuned jobs.

use crate::error::{CoreError, Result};
use crate::job::JobSpec;

/// What a job computes per step and how its communication overlaps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSpec {
    /// Model FLOPs of one step, whole job.
    pub flops_per_step: f64,
    /// Tokens of one step, whole job (0 when unknown).
    pub tokens_per_step: f64,
    /// Achievable fraction of peak for the compute, in (0, 1].
    pub efficiency: f64,
    /// Share of compute in the backward pass, in [0, 1].
    pub backward_fraction: f64,
    /// Pipeline stages and micro-batches per step (for the bubble).
    pub pipeline_stages: usize,
    pub micro_batches: usize,
    /// Model chunks per pipeline rank (1: 1F1B; see [`crate::pipeline`]).
    pub virtual_stages: usize,
    /// Overlap fractions by dimension name, overriding the defaults (dp 1, others 0).
    pub overlap: Vec<(String, f64)>,
}

pub const DEFAULT_EFFICIENCY: f64 = 0.6;
pub const DEFAULT_BACKWARD_FRACTION: f64 = 2.0 / 3.0;

impl StepSpec {
    /// A spec with the documented defaults.
    pub fn new(flops_per_step: f64, tokens_per_step: f64) -> StepSpec {
        StepSpec {
            flops_per_step,
            tokens_per_step,
            efficiency: DEFAULT_EFFICIENCY,
            backward_fraction: DEFAULT_BACKWARD_FRACTION,
            pipeline_stages: 1,
            micro_batches: 1,
            virtual_stages: 1,
            overlap: Vec::new(),
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        let bad = |what: &str, v: f64| {
            CoreError::InvalidJob(format!("step.{what}: expected {v} to be in range"))
        };
        if !(self.flops_per_step.is_finite() && self.flops_per_step > 0.0) {
            return Err(CoreError::InvalidJob(format!(
                "step.flops_per_step: expected a number > 0, got {}",
                self.flops_per_step
            )));
        }
        if !(self.tokens_per_step.is_finite() && self.tokens_per_step >= 0.0) {
            return Err(bad("tokens_per_step", self.tokens_per_step));
        }
        if !(self.efficiency > 0.0 && self.efficiency <= 1.0) {
            return Err(CoreError::InvalidJob(format!(
                "step.efficiency: expected a fraction in (0, 1], got {}",
                self.efficiency
            )));
        }
        if !(0.0..=1.0).contains(&self.backward_fraction) {
            return Err(CoreError::InvalidJob(format!(
                "step.backward_fraction: expected a fraction in [0, 1], got {}",
                self.backward_fraction
            )));
        }
        if self.pipeline_stages == 0 || self.micro_batches == 0 || self.virtual_stages == 0 {
            return Err(CoreError::InvalidJob(
                "step: pipeline stages, micro-batches and virtual stages must be >= 1".into(),
            ));
        }
        for (name, f) in &self.overlap {
            if !(0.0..=1.0).contains(f) {
                return Err(CoreError::InvalidJob(format!(
                    "step.overlap.{name}: expected a fraction in [0, 1], got {f}"
                )));
            }
        }
        Ok(())
    }

    /// The overlap fraction of a dimension (the override, or the documented default).
    pub fn overlap_of(&self, dim: &str) -> f64 {
        self.overlap
            .iter()
            .find(|(n, _)| n == dim)
            .map(|(_, f)| *f)
            .unwrap_or(if dim == "dp" { 1.0 } else { 0.0 })
    }
}

/// Step time and utilisation of one placement.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Compute per step, bubble excluded (s).
    pub compute_seconds: f64,
    /// Pipeline bubble per step (s).
    pub bubble_seconds: f64,
    /// Communication not hidden under compute (s).
    pub exposed_comm_seconds: f64,
    /// Exposed time of each collective class (s), in class order.
    pub exposed_class_seconds: Vec<f64>,
    pub step_seconds: f64,
    /// Model FLOPs utilisation, in (0, 1].
    pub mfu: f64,
    /// Tokens per second (0 when the tokens per step are unknown).
    pub tokens_per_second: f64,
    /// The per-GPU peak used (TFLOPS).
    pub peak_tflops: f64,
    /// Storage in the step ([`crate::storage::step_with_io`]; 0 until a request with storage
    /// traffic prices it): input reads per step, the part of them not hidden under the step,
    /// and checkpoint writes amortized per step (s). `step_seconds` includes the last two.
    pub input_seconds: f64,
    pub input_stall_seconds: f64,
    pub checkpoint_seconds: f64,
}

/// The dimension name of each collective class of `job` (None for a class without one).
pub fn class_dims(job: &JobSpec) -> Vec<Option<&str>> {
    let mut out = vec![None; job.num_classes];
    for c in &job.collectives {
        if let Some(d) = c.dim {
            out[c.class as usize] = job.dims.get(d as usize).map(|d| d.name.as_str());
        }
    }
    out
}

/// Step time of `job` from its priced communication (`class_seconds` and `traffic_seconds`
/// as [`crate::cost::CostReport`] gives them) on GPUs of `peak_tflops` each.
pub fn step_report(
    job: &JobSpec,
    class_seconds: &[f64],
    traffic_seconds: f64,
    spec: &StepSpec,
    peak_tflops: f64,
) -> Result<StepReport> {
    spec.check()?;
    if !(peak_tflops.is_finite() && peak_tflops > 0.0) {
        return Err(CoreError::InvalidTopology(format!(
            "the GPU peak must be a number of TFLOPS > 0, got {peak_tflops}"
        )));
    }
    if class_seconds.len() != job.num_classes {
        return Err(CoreError::InvalidJob(format!(
            "{} class times for a job of {} collective classes",
            class_seconds.len(),
            job.num_classes
        )));
    }
    let gpus = job.num_ranks as f64;
    let peak = peak_tflops * 1e12;
    let compute = spec.flops_per_step / (gpus * peak * spec.efficiency);
    let bubble = compute
        * crate::pipeline::bubble_fraction(
            spec.pipeline_stages,
            spec.micro_batches,
            spec.virtual_stages,
        );
    let backward = spec.backward_fraction * compute;
    let exposed_class_seconds: Vec<f64> = class_dims(job)
        .iter()
        .zip(class_seconds)
        .map(|(dim, &t)| {
            let dim = dim.unwrap_or("");
            let window = if dim == "dp" { backward } else { compute };
            (t - spec.overlap_of(dim) * window).max(0.0)
        })
        .collect();
    let exposed = exposed_class_seconds.iter().sum::<f64>() + traffic_seconds.max(0.0);
    let step = compute + bubble + exposed;
    Ok(StepReport {
        compute_seconds: compute,
        bubble_seconds: bubble,
        exposed_comm_seconds: exposed,
        exposed_class_seconds,
        step_seconds: step,
        mfu: spec.flops_per_step / (step * gpus * peak),
        tokens_per_second: spec.tokens_per_step / step,
        peak_tflops,
        input_seconds: 0.0,
        input_stall_seconds: 0.0,
        checkpoint_seconds: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Collective, CollectiveKind, Dim};
    use crate::topology::tests::tree;

    fn tp_dp_job() -> JobSpec {
        let topo = tree(4, 8, 2);
        // tp 2 x dp 2: tp groups {0,1},{2,3}; dp groups {0,2},{1,3}.
        JobSpec::new(
            4,
            vec![
                Dim {
                    name: "tp".into(),
                    size: 2,
                    confine: None,
                },
                Dim {
                    name: "dp".into(),
                    size: 2,
                    confine: None,
                },
            ],
            2,
            vec![0, 2, 4, 6, 8],
            vec![0, 1, 2, 3, 0, 2, 1, 3],
            (0..4)
                .map(|g| Collective {
                    group: g,
                    kind: CollectiveKind::AllReduce,
                    bytes: 1e6,
                    count: 1.0,
                    class: g / 2,
                    dim: Some(g / 2),
                })
                .collect(),
            vec![],
            &topo,
        )
        .unwrap()
    }

    #[test]
    fn dp_hides_under_backward_tp_does_not() {
        let job = tp_dp_job();
        // 4 GPUs at 100 TFLOPS, efficiency 0.5: 2e14 FLOPs take 1 s.
        let mut spec = StepSpec::new(2e14, 1000.0);
        spec.efficiency = 0.5;
        let r = step_report(&job, &[0.1, 0.5], 0.0, &spec, 100.0).unwrap();
        assert!((r.compute_seconds - 1.0).abs() < 1e-12);
        // tp exposed whole; dp 0.5 s hides under 2/3 s of backward.
        assert!((r.exposed_comm_seconds - 0.1).abs() < 1e-12);
        assert!((r.step_seconds - 1.1).abs() < 1e-12);
        assert!((r.mfu - 2e14 / (1.1 * 4.0 * 100e12)).abs() < 1e-12);
        assert!((r.tokens_per_second - 1000.0 / 1.1).abs() < 1e-9);
        // A dp reduction longer than backward shows its excess.
        let r = step_report(&job, &[0.1, 1.0], 0.0, &spec, 100.0).unwrap();
        assert!((r.exposed_comm_seconds - (0.1 + 1.0 - 2.0 / 3.0)).abs() < 1e-12);
        // Overridden: no dp overlap at all.
        spec.overlap = vec![("dp".into(), 0.0)];
        let r = step_report(&job, &[0.1, 0.5], 0.0, &spec, 100.0).unwrap();
        assert!((r.exposed_comm_seconds - 0.6).abs() < 1e-12);
    }

    #[test]
    fn pipeline_bubble_is_pp_minus_one_over_m() {
        let job = tp_dp_job();
        let mut spec = StepSpec::new(4e14, 0.0);
        spec.efficiency = 1.0;
        spec.pipeline_stages = 4;
        spec.micro_batches = 8;
        let r = step_report(&job, &[0.0, 0.0], 0.0, &spec, 100.0).unwrap();
        assert!((r.compute_seconds - 1.0).abs() < 1e-12);
        // Bubble share of the pipelined time: (pp-1)/(m+pp-1) = 3/11.
        assert!((r.bubble_seconds / r.step_seconds - 3.0 / 11.0).abs() < 1e-12);
        assert!((r.mfu - 8.0 / 11.0).abs() < 1e-12);
        // Interleaved, 2 chunks per rank: the bubble halves, (pp-1)/(v m) = 3/16 of compute.
        spec.virtual_stages = 2;
        let r = step_report(&job, &[0.0, 0.0], 0.0, &spec, 100.0).unwrap();
        assert!((r.bubble_seconds - 3.0 / 16.0).abs() < 1e-12);
        assert!((r.mfu - 16.0 / 19.0).abs() < 1e-12);
        spec.virtual_stages = 0;
        assert!(step_report(&job, &[0.0, 0.0], 0.0, &spec, 100.0).is_err());
    }

    #[test]
    fn rejects_bad_specs() {
        let job = tp_dp_job();
        let mut spec = StepSpec::new(1e12, 0.0);
        spec.efficiency = 1.5;
        assert!(step_report(&job, &[0.0, 0.0], 0.0, &spec, 100.0).is_err());
        let spec = StepSpec::new(1e12, 0.0);
        assert!(step_report(&job, &[0.0], 0.0, &spec, 100.0).is_err());
        assert!(step_report(&job, &[0.0, 0.0], 0.0, &spec, 0.0).is_err());
    }
}
