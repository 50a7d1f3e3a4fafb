//! A job compiled to arrays: its parallel layout (for confinement and rank layout), the
//! communication groups and collectives it runs every step, and an optional explicit traffic
//! list (the quadratic-assignment form).

use crate::error::{CoreError, Result};
use crate::topology::{Csr, Topology};

/// How a collective moves data (the cost model prices each kind differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CollectiveKind {
    AllReduce = 0,
    AllGather = 1,
    ReduceScatter = 2,
    AllToAll = 3,
    /// The first rank of the group sends to the second.
    PointToPoint = 4,
}

impl CollectiveKind {
    pub fn from_code(code: u8) -> Option<CollectiveKind> {
        Some(match code {
            0 => CollectiveKind::AllReduce,
            1 => CollectiveKind::AllGather,
            2 => CollectiveKind::ReduceScatter,
            3 => CollectiveKind::AllToAll,
            4 => CollectiveKind::PointToPoint,
            _ => return None,
        })
    }
}

/// One collective run `count` times per step over one communication group.
#[derive(Debug, Clone, PartialEq)]
pub struct Collective {
    pub group: u32,
    pub kind: CollectiveKind,
    /// Bytes per rank per call (the full buffer: for all-gather, the gathered size).
    pub bytes: f64,
    /// Calls per step.
    pub count: f64,
    /// Collectives of one class run concurrently (e.g. all tp groups); the step waits for the
    /// slowest of each class, and classes run one after another.
    pub class: u32,
    /// The parallel dimension this collective belongs to (index into `dims`), if any.
    pub dim: Option<u32>,
}

/// One parallel dimension, in rank order (fastest first).
#[derive(Debug, Clone, PartialEq)]
pub struct Dim {
    pub name: String,
    pub size: usize,
    /// The level every group of this dimension must stay inside, if confined.
    pub confine: Option<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub num_ranks: usize,
    /// Parallel dimensions, fastest first; their sizes multiply to `num_ranks`. Empty for a
    /// job that only gives a traffic matrix.
    pub dims: Vec<Dim>,
    /// The highest level the job may span.
    pub max_span: usize,
    pub groups: Csr,
    pub collectives: Vec<Collective>,
    pub num_classes: usize,
    /// Explicit point-to-point traffic (bytes per step from rank i to rank j).
    pub traffic: Vec<(u32, u32, f64)>,
}

fn invalid(msg: impl Into<String>) -> CoreError {
    CoreError::InvalidJob(msg.into())
}

impl JobSpec {
    /// Build and validate a job against a topology.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        num_ranks: usize,
        dims: Vec<Dim>,
        max_span: usize,
        group_offsets: Vec<usize>,
        group_ranks: Vec<u32>,
        collectives: Vec<Collective>,
        traffic: Vec<(u32, u32, f64)>,
        topo: &Topology,
    ) -> Result<JobSpec> {
        if num_ranks == 0 {
            return Err(invalid("a job needs at least one rank"));
        }
        if !dims.is_empty() {
            let product: usize = dims.iter().map(|d| d.size).product();
            if product != num_ranks || dims.iter().any(|d| d.size == 0) {
                return Err(invalid(format!(
                    "the parallel degrees multiply to {product}, not to the job's {num_ranks} ranks"
                )));
            }
        }
        let nl = topo.num_levels();
        if max_span >= nl {
            return Err(invalid(format!("max_span level {max_span} does not exist")));
        }
        for d in &dims {
            if let Some(l) = d.confine {
                if l >= nl {
                    return Err(invalid(format!(
                        "{}: confinement level {l} does not exist",
                        d.name
                    )));
                }
            }
        }
        if group_offsets.first() != Some(&0)
            || group_offsets.last() != Some(&group_ranks.len())
            || group_offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(invalid(
                "communication groups: offsets are not a valid partition",
            ));
        }
        let groups = Csr {
            offsets: group_offsets,
            items: group_ranks,
        };
        let mut seen = vec![u32::MAX; num_ranks];
        for g in 0..groups.rows() {
            for &r in groups.row(g) {
                if r as usize >= num_ranks {
                    return Err(invalid(format!(
                        "group {g} names rank {r}; the job has {num_ranks}"
                    )));
                }
                if seen[r as usize] == g as u32 {
                    return Err(invalid(format!("group {g} names rank {r} twice")));
                }
                seen[r as usize] = g as u32;
            }
        }
        let mut num_classes = 0usize;
        for (i, c) in collectives.iter().enumerate() {
            if c.group as usize >= groups.rows() {
                return Err(invalid(format!("collective {i} refers to a missing group")));
            }
            if !(c.bytes.is_finite() && c.bytes >= 0.0 && c.count.is_finite() && c.count >= 0.0) {
                return Err(invalid(format!(
                    "collective {i}: bytes and count must be finite and >= 0"
                )));
            }
            if c.kind == CollectiveKind::PointToPoint && groups.row(c.group as usize).len() != 2 {
                return Err(invalid(format!(
                    "collective {i}: a point-to-point transfer needs a group of exactly 2 ranks"
                )));
            }
            if let Some(d) = c.dim {
                if d as usize >= dims.len() {
                    return Err(invalid(format!("collective {i}: unknown dimension {d}")));
                }
            }
            num_classes = num_classes.max(c.class as usize + 1);
        }
        for (i, &(a, b, bytes)) in traffic.iter().enumerate() {
            if a as usize >= num_ranks || b as usize >= num_ranks {
                return Err(invalid(format!(
                    "traffic entry {i} ({a} -> {b}) names a rank outside 0..{num_ranks}"
                )));
            }
            if !(bytes.is_finite() && bytes >= 0.0) {
                return Err(invalid(format!(
                    "traffic entry {i}: bytes must be finite and >= 0"
                )));
            }
        }
        Ok(JobSpec {
            num_ranks,
            dims,
            max_span,
            groups,
            collectives,
            num_classes,
            traffic,
        })
    }

    /// Stride of each dimension in rank order.
    pub fn dim_strides(&self) -> Vec<usize> {
        let mut stride = 1;
        self.dims
            .iter()
            .map(|d| {
                let s = stride;
                stride *= d.size;
                s
            })
            .collect()
    }

    /// Every group of dimension `d` (all ranks that differ only in their `d` coordinate).
    pub fn dim_groups(&self, d: usize) -> impl Iterator<Item = Vec<u32>> + '_ {
        let strides = self.dim_strides();
        let (size, stride) = (self.dims[d].size, strides[d]);
        (0..self.num_ranks)
            .filter(move |&r| (r / stride) % size == 0)
            .map(move |base| (0..size).map(|k| (base + k * stride) as u32).collect())
    }

    /// Bytes per step each dimension moves (summed over its collectives); the greedy placer
    /// lays the heaviest dimensions innermost.
    pub fn dim_weights(&self) -> Vec<f64> {
        let mut weight = vec![0.0; self.dims.len()];
        for c in &self.collectives {
            if let Some(d) = c.dim {
                let factor = if c.kind == CollectiveKind::AllReduce {
                    2.0
                } else {
                    1.0
                };
                weight[d as usize] += factor * c.bytes * c.count;
            }
        }
        weight
    }
}

/// Jobs for the unit tests of several modules.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A tp x dp job in Megatron order: every tp group all-reduces 100 MB (confined to the
    /// NVLink domain), every dp group 1 GB.
    pub(crate) fn tp_dp_job(topo: &Topology, tp: usize, dp: usize) -> JobSpec {
        let mut offsets = vec![0];
        let mut ranks = vec![];
        let mut collectives = vec![];
        let mut add = |members: Vec<u32>, bytes: f64, dim: u32| {
            ranks.extend(members);
            offsets.push(ranks.len());
            collectives.push(Collective {
                group: (offsets.len() - 2) as u32,
                kind: CollectiveKind::AllReduce,
                bytes,
                count: 1.0,
                class: dim,
                dim: Some(dim),
            });
        };
        for d in 0..dp {
            add((0..tp).map(|t| (d * tp + t) as u32).collect(), 1e8, 0);
        }
        for t in 0..tp {
            add((0..dp).map(|d| (d * tp + t) as u32).collect(), 1e9, 1);
        }
        let dims = vec![
            Dim {
                name: "tp".into(),
                size: tp,
                confine: Some(topo.nvlink_level()),
            },
            Dim {
                name: "dp".into(),
                size: dp,
                confine: None,
            },
        ];
        JobSpec::new(
            tp * dp,
            dims,
            topo.num_levels() - 1,
            offsets,
            ranks,
            collectives,
            vec![],
            topo,
        )
        .unwrap()
    }
}
