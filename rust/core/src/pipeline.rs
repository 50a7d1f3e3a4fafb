//! Pipeline schedules: the idle time (bubble) a pipeline-parallel step pays, by schedule.
//!
//! With `p` pipeline stages, `m` micro-batches per step and `v` model chunks (virtual stages)
//! per pipeline rank, the bubble is `(p − 1) / (v · m)` of the ideal (bubble-free) compute
//! time:
//!
//! * **1F1B** (PipeDream-Flush, Megatron-LM's default; `v = 1`): every rank idles for `p − 1`
//!   forward and backward micro-batch slots while the pipeline fills and drains, so the bubble
//!   is `(p − 1)(t_f + t_b)` against `m (t_f + t_b)` of work, a fraction `(p − 1)/m` of it
//!   (`(p − 1)/(m + p − 1)` of the step). Narayanan et al., "Efficient Large-Scale Language
//!   Model Training on GPU Clusters Using Megatron-LM", SC'21, section 2.2.1.
//! * **Interleaved 1F1B** (`v ≥ 2`, Megatron-LM's `--num-layers-per-virtual-pipeline-stage`):
//!   each rank holds `v` chunks of `L/(p v)` layers, so a fill or drain slot is `1/v` as long
//!   and the bubble falls to `(p − 1)/(v m)`; the price is `v` times the point-to-point sends
//!   (the same paper, section 2.2.2), which the job's model counts (`job.py`). Megatron-LM
//!   requires `m` to be a multiple of `p` for it (same section).
//! * **Llama 3's schedule** (Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.2):
//!   interleaved with `V` stages per rank and a tunable number `N` of consecutive micro-batches
//!   per stage, so any `m`, even `m < p`; "overall pipeline bubble ratio is (PP − 1)/(V · M)",
//!   the same formula.
//!
//! Not modelled: the imbalance of the first and last stages (embedding, output and loss;
//! Llama 3 moves one layer off each to balance them), and zero-bubble schedules.

/// Bubble time as a fraction of the bubble-free compute time of one step:
/// `(stages − 1) / (virtual_stages · micro_batches)` (0 for one stage). Every argument is
/// at least 1 (checked by [`crate::step::StepSpec`]).
pub fn bubble_fraction(stages: usize, micro_batches: usize, virtual_stages: usize) -> f64 {
    let (p, m, v) = (
        stages.max(1) as f64,
        micro_batches.max(1) as f64,
        virtual_stages.max(1) as f64,
    );
    (p - 1.0) / (v * m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_and_interleaved() {
        assert_eq!(bubble_fraction(1, 8, 1), 0.0);
        assert!((bubble_fraction(4, 8, 1) - 3.0 / 8.0).abs() < 1e-15);
        // Interleaving divides the bubble by the chunks per rank.
        assert!((bubble_fraction(16, 16, 4) - 15.0 / 64.0).abs() < 1e-15);
        for v in 1..8 {
            assert!(bubble_fraction(16, 32, v + 1) < bubble_fraction(16, 32, v));
        }
    }
}
