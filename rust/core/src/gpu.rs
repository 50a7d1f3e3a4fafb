//! Peak dense tensor throughput per GPU model, for compute time and MFU ([`crate::step`]).
//!
//! One row per model family: the dense (no structured sparsity) BF16 tensor-core figure, or
//! FP16 where the part has no BF16, in TFLOPS, from the vendor's datasheet named beside it.
//! A model name matches the first row whose every token occurs in the upper-cased name, so
//! `"NVIDIA H100 80GB HBM3"`, `"H100-SXM5-80GB"` and `"h100"` all find the H100 SXM row and
//! `"H100-PCIe-80GB"` the PCIe row above it. A topology may give `peak_tflops` per host type
//! instead (for parts not listed here).

/// One row of the peak table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuPeak {
    /// Tokens that must all occur in the upper-cased model name.
    pub tokens: &'static [&'static str],
    /// Dense BF16 (or FP16) tensor TFLOPS.
    pub tflops: f64,
    pub source: &'static str,
}

/// The table, most specific rows first.
pub const PEAKS: &[GpuPeak] = &[
    GpuPeak {
        tokens: &["GB300"],
        tflops: 2500.0,
        source: "NVIDIA GB300 NVL72 datasheet: 360 PFLOPS FP16/BF16 with sparsity per 72 GPUs, half dense",
    },
    GpuPeak {
        tokens: &["GB200"],
        tflops: 2500.0,
        source: "NVIDIA GB200 NVL72 datasheet: 360 PFLOPS FP16/BF16 with sparsity per 72 GPUs (5 per GPU), half dense",
    },
    GpuPeak {
        tokens: &["B200"],
        tflops: 2250.0,
        source: "NVIDIA HGX B200 datasheet: 36 PFLOPS FP16/BF16 with sparsity per 8 GPUs (4.5 per GPU), half dense",
    },
    GpuPeak {
        tokens: &["H100", "PCIE"],
        tflops: 756.0,
        source: "NVIDIA H100 datasheet: H100 PCIe 1,513 TFLOPS BF16 with sparsity, 756 dense",
    },
    GpuPeak {
        tokens: &["H100", "NVL"],
        tflops: 835.0,
        source: "NVIDIA H100 datasheet: H100 NVL 1,671 TFLOPS BF16 with sparsity, 835 dense",
    },
    GpuPeak {
        tokens: &["GH200"],
        tflops: 989.0,
        source: "NVIDIA GH200 datasheet: 1,979 TFLOPS BF16 with sparsity, 989 dense (the H100 SXM die)",
    },
    GpuPeak {
        tokens: &["H200"],
        tflops: 989.0,
        source: "NVIDIA H200 datasheet: H200 SXM 1,979 TFLOPS BF16 with sparsity, 989 dense",
    },
    GpuPeak {
        tokens: &["H800"],
        tflops: 989.0,
        source: "NVIDIA H800 SXM5: the H100 SXM compute die (1,979 TFLOPS BF16 with sparsity, 989 dense)",
    },
    GpuPeak {
        tokens: &["H100"],
        tflops: 989.0,
        source: "NVIDIA H100 datasheet: H100 SXM 1,979 TFLOPS BF16 with sparsity, 989 dense",
    },
    GpuPeak {
        tokens: &["A100"],
        tflops: 312.0,
        source: "NVIDIA A100 datasheet: 312 TFLOPS BF16 dense (624 with sparsity), SXM and PCIe",
    },
    GpuPeak {
        tokens: &["A800"],
        tflops: 312.0,
        source: "NVIDIA A800 datasheet: 312 TFLOPS BF16 dense, as the A100",
    },
    GpuPeak {
        tokens: &["L40S"],
        tflops: 362.0,
        source: "NVIDIA L40S datasheet: 733 TFLOPS BF16 with sparsity, 362 dense",
    },
    GpuPeak {
        tokens: &["A10G"],
        tflops: 70.0,
        source: "AWS G5 instance page: A10G 70 TFLOPS FP16/BF16 tensor dense (assumed from AWS's figure)",
    },
    GpuPeak {
        tokens: &["A10"],
        tflops: 125.0,
        source: "NVIDIA A10 datasheet: 125 TFLOPS BF16 dense (250 with sparsity)",
    },
    GpuPeak {
        tokens: &["L4"],
        tflops: 121.0,
        source: "NVIDIA L4 datasheet: 242 TFLOPS BF16 with sparsity, 121 dense",
    },
    GpuPeak {
        tokens: &["4090"],
        tflops: 165.2,
        source: "NVIDIA Ada Lovelace architecture whitepaper: RTX 4090 165.2 TFLOPS BF16 tensor dense (FP32 accumulate)",
    },
    GpuPeak {
        tokens: &["V100"],
        tflops: 125.0,
        source: "NVIDIA V100 datasheet: V100 SXM2 125 TFLOPS FP16 tensor (no BF16)",
    },
    GpuPeak {
        tokens: &["T4"],
        tflops: 65.0,
        source: "NVIDIA T4 datasheet: 65 TFLOPS FP16 mixed precision (no BF16)",
    },
    GpuPeak {
        tokens: &["P100"],
        tflops: 21.2,
        source: "NVIDIA P100 datasheet: P100 SXM2 21.2 TFLOPS FP16 (no tensor cores)",
    },
    GpuPeak {
        tokens: &["MI355X"],
        tflops: 2500.0,
        source: "AMD Instinct MI355X datasheet: 2.5 PFLOPS FP16/BF16 dense",
    },
    GpuPeak {
        tokens: &["MI325X"],
        tflops: 1307.4,
        source: "AMD Instinct MI325X datasheet: 1,307.4 TFLOPS FP16/BF16 dense",
    },
    GpuPeak {
        tokens: &["MI300X"],
        tflops: 1307.4,
        source: "AMD Instinct MI300X datasheet: 1,307.4 TFLOPS FP16/BF16 dense",
    },
    GpuPeak {
        tokens: &["MI250X"],
        tflops: 383.0,
        source: "AMD Instinct MI250X datasheet: 383 TFLOPS FP16/BF16",
    },
    GpuPeak {
        tokens: &["MI250"],
        tflops: 362.1,
        source: "AMD Instinct MI250 datasheet: 362.1 TFLOPS FP16/BF16",
    },
    GpuPeak {
        tokens: &["MI210"],
        tflops: 181.0,
        source: "AMD Instinct MI210 datasheet: 181 TFLOPS FP16/BF16",
    },
];

/// The table row of a GPU model name (see the module docs), if any.
pub fn peak_of(model: &str) -> Option<&'static GpuPeak> {
    let upper = model.to_uppercase();
    PEAKS.iter().find(|row| {
        row.tokens.iter().all(|t| {
            // A token must not be a piece of a longer model number ("A10" inside "A100").
            upper.match_indices(t).any(|(i, _)| {
                let after = upper[i + t.len()..].chars().next();
                !after.is_some_and(|c| c.is_ascii_digit())
            })
        })
    })
}

/// Peak dense TFLOPS of a GPU model name, if the table knows it.
pub fn peak_tflops(model: &str) -> Option<f64> {
    peak_of(model).map(|p| p.tflops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_readers_and_presets_write_them() {
        assert_eq!(peak_tflops("H100-SXM5-80GB"), Some(989.0));
        assert_eq!(peak_tflops("NVIDIA H100 80GB HBM3"), Some(989.0));
        assert_eq!(peak_tflops("H100-PCIe-80GB"), Some(756.0));
        assert_eq!(peak_tflops("A100-SXM4-40GB"), Some(312.0));
        assert_eq!(peak_tflops("NVIDIA A10G"), Some(70.0));
        assert_eq!(peak_tflops("NVIDIA A10"), Some(125.0));
        assert_eq!(peak_tflops("B200 (GB200 superchip)"), Some(2500.0));
        assert_eq!(peak_tflops("NVIDIA B200"), Some(2250.0));
        assert_eq!(peak_tflops("Tesla T4"), Some(65.0));
        assert_eq!(peak_tflops("NVIDIA GeForce RTX 4090"), Some(165.2));
        assert_eq!(peak_tflops("NVIDIA L40S"), Some(362.0));
        assert_eq!(peak_tflops("NVIDIA L4"), Some(121.0));
        assert_eq!(peak_tflops("AMD Instinct MI300X"), Some(1307.4));
        assert_eq!(peak_tflops("mystery accelerator"), None);
    }
}
