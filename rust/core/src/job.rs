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
    /// Every kind, in code order.
    pub const ALL: [CollectiveKind; 5] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllToAll,
        CollectiveKind::PointToPoint,
    ];

    /// The kind's name in job files and reports.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all-reduce",
            CollectiveKind::AllGather => "all-gather",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::AllToAll => "all-to-all",
            CollectiveKind::PointToPoint => "p2p",
        }
    }

    pub fn from_name(name: &str) -> Option<CollectiveKind> {
        CollectiveKind::ALL.into_iter().find(|k| k.name() == name)
    }

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
    /// Name of every collective class (`"tp all-reduce"`), in class order: what reports
    /// label `CostReport::class_seconds` with.
    pub class_names: Vec<String>,
    /// What one step computes and how communication overlaps it, when the job declares it:
    /// the cost report then carries step time and MFU ([`crate::step`]).
    pub step: Option<crate::step::StepSpec>,
    /// A dimension greedy lays out innermost among the unconfined ones, overriding the order
    /// by bytes per step ([`crate::greedy::layout_order`]); set by greedy itself on the
    /// candidates it prices, None otherwise.
    pub inner_dim: Option<usize>,
}

fn invalid(msg: impl Into<String>) -> CoreError {
    CoreError::InvalidJob(msg.into())
}

impl JobSpec {
    /// Which collectives hold a rank whose GPU differs between `gpus` and `before` (the
    /// collectives a move re-prices and re-routes; the others keep their time and flows).
    pub fn collectives_moved(&self, gpus: &[u32], before: &[u32]) -> Vec<bool> {
        let moved: Vec<bool> = gpus.iter().zip(before).map(|(a, b)| a != b).collect();
        self.collectives
            .iter()
            .map(|c| {
                self.groups
                    .row(c.group as usize)
                    .iter()
                    .any(|&r| moved[r as usize])
            })
            .collect()
    }

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
        let class_names = (0..num_classes).map(|c| format!("class {c}")).collect();
        Ok(JobSpec {
            num_ranks,
            dims,
            max_span,
            groups,
            collectives,
            num_classes,
            traffic,
            class_names,
            step: None,
            inner_dim: None,
        })
    }

    /// The rank layout of the job's dimensions.
    pub fn layout(&self) -> RankLayout {
        RankLayout::new(self.dims.iter().map(|d| d.size).collect())
    }

    /// Stride of each dimension in rank order.
    pub fn dim_strides(&self) -> Vec<usize> {
        self.layout().strides
    }

    /// Every group of dimension `d` (all ranks that differ only in their `d` coordinate).
    pub fn dim_groups(&self, d: usize) -> impl Iterator<Item = Vec<u32>> + '_ {
        self.layout().groups(d)
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

/// Where every rank sits along the parallel dimensions: rank order, the first dimension
/// fastest (Megatron's `r = tp + TP * (cp + CP * (...))`). The one definition of the layout:
/// groups, coordinates and everything built on them come from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankLayout {
    pub sizes: Vec<usize>,
    pub strides: Vec<usize>,
    pub num_ranks: usize,
}

impl RankLayout {
    pub fn new(sizes: Vec<usize>) -> RankLayout {
        let mut stride = 1;
        let strides = sizes
            .iter()
            .map(|&size| {
                let s = stride;
                stride *= size;
                s
            })
            .collect();
        RankLayout {
            sizes,
            strides,
            num_ranks: stride,
        }
    }

    /// Coordinate of `rank` along dimension `d`.
    #[inline]
    pub fn coordinate(&self, rank: usize, d: usize) -> usize {
        (rank / self.strides[d]) % self.sizes[d]
    }

    /// Every group of dimension `d` (the ranks that differ only in their `d` coordinate), in
    /// order of their first rank; members by `d` coordinate.
    pub fn groups(&self, d: usize) -> impl Iterator<Item = Vec<u32>> {
        let (size, stride) = (self.sizes[d], self.strides[d]);
        (0..self.num_ranks)
            .filter(move |&r| (r / stride) % size == 0)
            .map(move |base| (0..size).map(|k| (base + k * stride) as u32).collect())
    }
}

/// One dimension's traffic per step: `count` calls of `kind`, `bytes` per rank per call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Communication {
    pub kind: CollectiveKind,
    pub bytes: f64,
    pub count: f64,
}

/// A parallel dimension as declared: its degree, confinement and communication.
#[derive(Debug, Clone, PartialEq)]
pub struct DimDecl {
    pub dim: Dim,
    pub communication: Option<Communication>,
}

/// A job as its user declares it; [`JobSpec::compile`] turns it into groups and collectives.
#[derive(Debug, Clone, PartialEq)]
pub struct JobDecl {
    /// For messages.
    pub name: String,
    /// Ranks of a traffic-only job (no dimensions); otherwise the product of the degrees.
    pub num_ranks: usize,
    /// Dimensions in rank order, fastest first.
    pub dims: Vec<DimDecl>,
    /// The highest level the job may span.
    pub max_span: usize,
    /// Explicit traffic: (src rank, dst rank, bytes per step).
    pub traffic: Vec<(u32, u32, f64)>,
}

/// The collective classes of declared dimensions: (dimension index, communication) of every
/// dimension of degree above 1 that communicates, in order of dimension name.
pub fn collective_classes(dims: &[DimDecl]) -> Vec<(usize, Communication)> {
    let mut classes: Vec<(usize, Communication)> = dims
        .iter()
        .enumerate()
        .filter(|(_, d)| d.dim.size > 1)
        .filter_map(|(i, d)| d.communication.map(|c| (i, c)))
        .collect();
    classes.sort_by(|a, b| dims[a.0].dim.name.cmp(&dims[b.0].dim.name));
    classes
}

/// Names of the collective classes (`"tp all-reduce"`), in class order.
pub fn class_names(dims: &[DimDecl]) -> Vec<String> {
    collective_classes(dims)
        .into_iter()
        .map(|(d, c)| format!("{} {}", dims[d].dim.name, c.kind.name()))
        .collect()
}

impl JobSpec {
    /// Compile a declared job: one class per communicating dimension (classes in order of
    /// dimension name), one collective per group of that dimension; a point-to-point
    /// dimension's groups are the neighbouring pairs of each group (pipeline stage i to
    /// i + 1). Explicit traffic passes through. Refuses a job larger than the cluster
    /// (Infeasible) before building anything the size of the job.
    pub fn compile(decl: JobDecl, topo: &Topology) -> Result<JobSpec> {
        let num_ranks = if decl.dims.is_empty() {
            decl.num_ranks
        } else {
            decl.dims
                .iter()
                .try_fold(1usize, |acc, d| acc.checked_mul(d.dim.size))
                .ok_or_else(|| invalid(format!("{}: too many ranks", decl.name)))?
        };
        if num_ranks != decl.num_ranks {
            return Err(invalid(format!(
                "{}: the parallel degrees multiply to {num_ranks}, not to the job's {} ranks",
                decl.name, decl.num_ranks
            )));
        }
        if num_ranks > topo.num_gpus() {
            return Err(CoreError::Infeasible(format!(
                "{} needs {num_ranks} GPUs but the cluster has only {}",
                decl.name,
                topo.num_gpus()
            )));
        }
        if !decl.traffic.is_empty() && !decl.dims.is_empty() {
            return Err(invalid(format!(
                "{}: give either parallel degrees or a traffic matrix, not both",
                decl.name
            )));
        }
        let layout = RankLayout::new(decl.dims.iter().map(|d| d.dim.size).collect());
        let classes = collective_classes(&decl.dims);
        let class_names = class_names(&decl.dims);
        let mut offsets = vec![0usize];
        let mut ranks: Vec<u32> = Vec::new();
        let mut collectives = Vec::new();
        for (class, &(d, comm)) in classes.iter().enumerate() {
            let mut add = |members: &[u32]| {
                ranks.extend_from_slice(members);
                offsets.push(ranks.len());
                collectives.push(Collective {
                    group: (offsets.len() - 2) as u32,
                    kind: comm.kind,
                    bytes: comm.bytes,
                    count: comm.count,
                    class: class as u32,
                    dim: Some(d as u32),
                });
            };
            for group in layout.groups(d) {
                if comm.kind == CollectiveKind::PointToPoint {
                    group.windows(2).for_each(&mut add);
                } else {
                    add(&group);
                }
            }
        }
        let dims = decl.dims.into_iter().map(|d| d.dim).collect();
        let mut spec = JobSpec::new(
            num_ranks,
            dims,
            decl.max_span,
            offsets,
            ranks,
            collectives,
            decl.traffic,
            topo,
        )?;
        spec.class_names = class_names;
        Ok(spec)
    }
}

/// Jobs for the unit tests of several modules.
impl JobSpec {
    /// The same job with what one step computes (checked), so that its cost reports carry
    /// step time, MFU and tokens/s.
    pub fn with_step(mut self, step: crate::step::StepSpec) -> Result<JobSpec> {
        step.check()?;
        self.step = Some(step);
        Ok(self)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::tests::tree;

    fn dim(name: &str, size: usize, comm: Option<CollectiveKind>) -> DimDecl {
        DimDecl {
            dim: Dim {
                name: name.into(),
                size,
                confine: None,
            },
            communication: comm.map(|kind| Communication {
                kind,
                bytes: 1e6,
                count: 2.0,
            }),
        }
    }

    #[test]
    fn compile_builds_groups_classes_and_pipeline_pairs_from_the_declaration() {
        let topo = tree(4, 8, 2);
        let decl = JobDecl {
            name: "j".into(),
            num_ranks: 16,
            dims: vec![
                dim("tp", 2, Some(CollectiveKind::AllReduce)),
                dim("dp", 2, None),
                dim("pp", 4, Some(CollectiveKind::PointToPoint)),
            ],
            max_span: 2,
            traffic: vec![],
        };
        let spec = JobSpec::compile(decl, &topo).unwrap();
        // Classes in order of dimension name: pp before tp; dp has no communication.
        assert_eq!(spec.class_names, ["pp p2p", "tp all-reduce"]);
        let pp: Vec<&[u32]> = spec
            .collectives
            .iter()
            .filter(|c| c.class == 0)
            .map(|c| spec.groups.row(c.group as usize))
            .collect();
        // Every pipeline (stride 4) as neighbouring pairs: 4 pipelines x 3 pairs.
        assert_eq!(pp.len(), 12);
        assert_eq!(pp[..3], [&[0, 4][..], &[4, 8], &[8, 12]]);
        let layout = spec.layout();
        assert_eq!(layout.coordinate(13, 2), 3);
        assert_eq!(layout.coordinate(13, 1), 0);
        assert_eq!(layout.coordinate(13, 0), 1);
    }

    #[test]
    fn compile_refuses_a_job_larger_than_the_cluster_and_a_wrong_rank_count() {
        let topo = tree(1, 8, 1);
        let big = JobDecl {
            name: "big".into(),
            num_ranks: 16,
            dims: vec![dim("dp", 16, None)],
            max_span: 2,
            traffic: vec![],
        };
        let err = JobSpec::compile(big, &topo).unwrap_err();
        assert!(matches!(err, CoreError::Infeasible(_)), "{err}");
        let wrong = JobDecl {
            name: "w".into(),
            num_ranks: 3,
            dims: vec![dim("dp", 4, None)],
            max_span: 2,
            traffic: vec![],
        };
        assert!(JobSpec::compile(wrong, &topo).is_err());
    }
}
