//! MIG as a sharing mode: a GPU partitioned into GPU instances under its model's profile rules
//! (NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"; the rules are read from
//! `nvidia-smi mig -lgip` / `-lgipp` or the guide's tables by the caller).
//!
//! A GPU has `memory_slices` memory slices and `compute_slices` compute slices. An instance of a
//! profile occupies `size` consecutive memory slices from one of its allowed `starts`, and
//! `compute` compute slices; instances never overlap, the compute in use never exceeds the
//! GPU's, and a profile has at most `max_instances` instances. A request for `m` milli-GPUs gets
//! the smallest profile whose compute share is at least `m / 1000` (and whose memory covers
//! the request's GPU memory, when it states one); a whole-GPU request gets the full profile.
//! The GPU's free milli-GPUs are its free compute share, so fragmentation and the unallocated
//! share count MIG GPUs as they count time-sliced ones.

use crate::error::{CoreError, Result};
use crate::share::cluster::MILLI;

/// The most profiles one GPU model may have.
pub const MAX_PROFILES: usize = 16;

/// One GPU-instance profile (`3g.40gb`: 3 compute slices, 4 memory slices, ~40 GB).
#[derive(Debug, Clone, PartialEq)]
pub struct MigProfile {
    pub name: String,
    pub compute: u8,
    /// Memory slices.
    pub size: u8,
    /// Allowed first memory slices.
    pub starts: Vec<u8>,
    pub max_instances: u8,
    pub memory_mib: u64,
}

/// The MIG rules of one GPU model (media profiles left out by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct MigRules {
    pub model: String,
    pub memory_slices: u8,
    pub compute_slices: u8,
    pub profiles: Vec<MigProfile>,
}

/// What a MIG-mode GPU holds: its occupied memory slices (bit per slice), compute slices in
/// use and instances per profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MigGpu {
    pub occupied: u64,
    pub compute: u8,
    pub counts: [u8; MAX_PROFILES],
}

impl MigGpu {
    pub fn is_empty(&self) -> bool {
        self.occupied == 0
    }
}

impl MigRules {
    /// The rules hold together: every placement inside the GPU, every profile's compute within
    /// the GPU's (InvalidTopology naming the profile otherwise).
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(CoreError::InvalidTopology(format!("{}: {m}", self.model)));
        if self.memory_slices == 0 || self.memory_slices > 64 || self.compute_slices == 0 {
            return bad(format!(
                "{} memory slices and {} compute slices (expected 1-64 and at least 1)",
                self.memory_slices, self.compute_slices
            ));
        }
        if self.profiles.is_empty() || self.profiles.len() > MAX_PROFILES {
            return bad(format!(
                "{} profiles (expected 1 to {MAX_PROFILES})",
                self.profiles.len()
            ));
        }
        for p in &self.profiles {
            if p.compute == 0 || p.compute > self.compute_slices {
                return bad(format!(
                    "profile {} has {} compute slices; the GPU has {}",
                    p.name, p.compute, self.compute_slices
                ));
            }
            if p.size == 0 || p.starts.is_empty() || p.max_instances == 0 {
                return bad(format!(
                    "profile {} needs a size, a start and an instance",
                    p.name
                ));
            }
            if let Some(s) = p
                .starts
                .iter()
                .find(|&&s| s as u16 + p.size as u16 > self.memory_slices as u16)
            {
                return bad(format!(
                    "profile {} placement {s}:{} exceeds the {} memory slices",
                    p.name, p.size, self.memory_slices
                ));
            }
        }
        Ok(())
    }

    /// The milli-GPUs a profile's compute share is worth (rounded down).
    #[inline]
    pub fn milli_of(&self, compute: u8) -> u16 {
        (compute as u32 * MILLI as u32 / self.compute_slices as u32) as u16
    }

    /// Free milli-GPUs of a GPU: its free compute share.
    #[inline]
    pub fn free_milli(&self, gpu: &MigGpu) -> u16 {
        MILLI - self.milli_of(gpu.compute)
    }

    /// The profile a request of `milli` milli-GPUs per GPU and `memory_mib` of GPU memory (0:
    /// not stated) gets: the smallest (compute, then memory slices) that covers both; None
    /// when none does.
    pub fn profile_for(&self, milli: u16, memory_mib: u64) -> Option<usize> {
        self.profiles
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                (p.compute as u32) * (MILLI as u32) >= milli as u32 * self.compute_slices as u32
                    && p.memory_mib >= memory_mib
            })
            .min_by_key(|(i, p)| (p.compute, p.size, *i))
            .map(|(i, _)| i)
    }

    /// Can an instance of profile `p` start at `start` on a GPU holding `gpu`?
    #[inline]
    pub fn fits_at(&self, gpu: &MigGpu, p: usize, start: u8) -> bool {
        let prof = &self.profiles[p];
        let window = ((1u64 << prof.size) - 1) << start;
        gpu.compute + prof.compute <= self.compute_slices
            && gpu.counts[p] < prof.max_instances
            && gpu.occupied & window == 0
            && prof.starts.contains(&start)
    }

    /// The allowed starts where profile `p` fits now.
    pub fn starts(&self, gpu: &MigGpu, p: usize) -> impl Iterator<Item = u8> + '_ {
        let gpu = *gpu;
        self.profiles[p]
            .starts
            .iter()
            .copied()
            .filter(move |&s| self.fits_at(&gpu, p, s))
    }

    /// Can the GPU host `milli` (per GPU) now?
    pub fn hosts(&self, gpu: &MigGpu, milli: u16, memory_mib: u64) -> bool {
        self.profile_for(milli, memory_mib)
            .is_some_and(|p| self.starts(gpu, p).next().is_some())
    }

    /// The GPU with an instance of `p` added at `start` (the caller checked [`Self::fits_at`]).
    pub fn with(&self, gpu: &MigGpu, p: usize, start: u8) -> MigGpu {
        let prof = &self.profiles[p];
        let mut out = *gpu;
        out.occupied |= ((1u64 << prof.size) - 1) << start;
        out.compute += prof.compute;
        out.counts[p] += 1;
        out
    }

    /// The GPU with an instance of `p` at `start` removed; None when it holds none there.
    pub fn without(&self, gpu: &MigGpu, p: usize, start: u8) -> Option<MigGpu> {
        let prof = &self.profiles[p];
        let window = ((1u64 << prof.size) - 1) << start;
        if gpu.counts[p] == 0 || gpu.occupied & window != window || gpu.compute < prof.compute {
            return None;
        }
        let mut out = *gpu;
        out.occupied &= !window;
        out.compute -= prof.compute;
        out.counts[p] -= 1;
        Some(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A100/H100 80 GB (the guide's table, without the media profile).
    pub(crate) fn a100() -> MigRules {
        let p = |name: &str, compute, size, starts: &[u8], max, gb: u64| MigProfile {
            name: name.into(),
            compute,
            size,
            starts: starts.to_vec(),
            max_instances: max,
            memory_mib: gb * 1024,
        };
        MigRules {
            model: "A100-80GB".into(),
            memory_slices: 8,
            compute_slices: 7,
            profiles: vec![
                p("1g.10gb", 1, 1, &[0, 1, 2, 3, 4, 5, 6], 7, 10),
                p("1g.20gb", 1, 2, &[0, 2, 4, 6], 4, 20),
                p("2g.20gb", 2, 2, &[0, 2, 4], 3, 20),
                p("3g.40gb", 3, 4, &[0, 4], 2, 40),
                p("4g.40gb", 4, 4, &[0], 1, 40),
                p("7g.80gb", 7, 8, &[0], 1, 80),
            ],
        }
    }

    #[test]
    fn profiles_cover_the_share_asked() {
        let r = a100();
        r.check().unwrap();
        let name = |milli, mem| r.profiles[r.profile_for(milli, mem).unwrap()].name.clone();
        assert_eq!(name(100, 0), "1g.10gb");
        assert_eq!(name(143, 0), "2g.20gb"); // 1/7 = 142.9 milli is not enough
        assert_eq!(name(460, 0), "4g.40gb");
        assert_eq!(name(1000, 0), "7g.80gb");
        assert_eq!(name(100, 15 * 1024), "1g.20gb");
        assert_eq!(r.profile_for(100, 100 * 1024), None);
    }

    #[test]
    fn start_rules_hold() {
        let r = a100();
        let gpu = r.with(&MigGpu::default(), 3, 4); // 3g at slices 4-7
                                                    // 4g + 3g is a valid geometry; after it, all 7 compute slices are taken.
        assert!(r.fits_at(&gpu, 4, 0));
        assert!(!r.hosts(&r.with(&gpu, 4, 0), 100, 0));
        assert_eq!(r.starts(&gpu, 3).collect::<Vec<_>>(), vec![0]);
        assert_eq!(r.starts(&gpu, 2).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(r.free_milli(&gpu), 1000 - 428);
        let back = r.without(&gpu, 3, 4).unwrap();
        assert_eq!(back, MigGpu::default());
        assert!(r.without(&gpu, 3, 0).is_none());
        let full = r.with(&MigGpu::default(), 5, 0);
        assert_eq!(r.free_milli(&full), 0);
        assert!(!r.hosts(&full, 100, 0));
    }

    #[test]
    fn broken_rules_are_refused() {
        let mut r = a100();
        r.profiles[3].starts.push(6);
        assert!(r.check().is_err());
        let mut r = a100();
        r.profiles[0].compute = 9;
        assert!(r.check().is_err());
    }
}
