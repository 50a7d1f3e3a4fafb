//! Internal problem representation: ranks padded to `size = m` with zero-traffic dummies.

use std::borrow::Cow;
use std::time::Instant;

use rand_chacha::ChaCha8Rng;

use super::sparse::Near;
use super::Traffic;

/// Traffic as compressed sparse rows, both directions, duplicates merged, zeros dropped.
pub(super) struct FlowCsr {
    pub size: usize,
    pub out_ptr: Vec<usize>,
    pub out: Vec<(u32, f64)>,
    pub in_ptr: Vec<usize>,
    pub inn: Vec<(u32, f64)>,
}

impl FlowCsr {
    pub fn from_traffic(traffic: &Traffic, size: usize) -> FlowCsr {
        let mut edges: Vec<(u32, u32, f64)> = match traffic {
            Traffic::Dense { n, values } => {
                let n = *n;
                let mut e = Vec::new();
                for i in 0..n {
                    for j in 0..n {
                        let w = values[i * n + j];
                        if w != 0.0 {
                            e.push((i as u32, j as u32, w));
                        }
                    }
                }
                e
            }
            Traffic::Sparse { edges, .. } => {
                let mut e: Vec<(u32, u32, f64)> =
                    edges.iter().copied().filter(|e| e.2 != 0.0).collect();
                e.sort_by_key(|a| (a.0, a.1));
                let mut merged: Vec<(u32, u32, f64)> = Vec::with_capacity(e.len());
                for (a, b, w) in e {
                    match merged.last_mut() {
                        Some(last) if last.0 == a && last.1 == b => last.2 += w,
                        _ => merged.push((a, b, w)),
                    }
                }
                merged.retain(|e| e.2 != 0.0);
                merged
            }
        };
        // edges are sorted by (src, dst) here.
        let mut out_ptr = vec![0usize; size + 1];
        let mut in_ptr = vec![0usize; size + 1];
        for &(a, b, _) in &edges {
            out_ptr[a as usize + 1] += 1;
            in_ptr[b as usize + 1] += 1;
        }
        for i in 0..size {
            out_ptr[i + 1] += out_ptr[i];
            in_ptr[i + 1] += in_ptr[i];
        }
        let out: Vec<(u32, f64)> = edges.iter().map(|&(_, b, w)| (b, w)).collect();
        let mut inn = vec![(0u32, 0.0f64); edges.len()];
        let mut fill = in_ptr.clone();
        for &(a, b, w) in &edges {
            inn[fill[b as usize]] = (a, w);
            fill[b as usize] += 1;
        }
        edges.clear();
        FlowCsr {
            size,
            out_ptr,
            out,
            in_ptr,
            inn,
        }
    }

    #[inline]
    pub fn out_of(&self, i: usize) -> &[(u32, f64)] {
        &self.out[self.out_ptr[i]..self.out_ptr[i + 1]]
    }

    #[inline]
    pub fn in_of(&self, i: usize) -> &[(u32, f64)] {
        &self.inn[self.in_ptr[i]..self.in_ptr[i + 1]]
    }

    pub fn nnz(&self) -> usize {
        self.out.len()
    }

    /// Total traffic of rank `i` in both directions (self-loops excluded).
    pub fn degree_weight(&self, i: usize) -> f64 {
        let o: f64 = self
            .out_of(i)
            .iter()
            .filter(|e| e.0 as usize != i)
            .map(|e| e.1)
            .sum();
        let n: f64 = self
            .in_of(i)
            .iter()
            .filter(|e| e.0 as usize != i)
            .map(|e| e.1)
            .sum();
        o + n
    }
}

/// Dense flow and distance for the robust tabu search.
pub(super) struct DenseModel<'a> {
    pub size: usize,
    /// Row-major `size * size` flow (padded with zero rows/columns).
    pub f: Vec<f64>,
    /// Row-major `size * size` distance.
    pub d: Cow<'a, [f64]>,
    /// Both matrices symmetric (after symmetrising one when the other is symmetric).
    pub sym: bool,
    /// Transpose of `f` (asymmetric case only; empty otherwise).
    pub ft: Vec<f64>,
}

pub(super) struct Problem<'a> {
    /// Real ranks.
    pub n: usize,
    /// Locations = padded ranks.
    pub size: usize,
    pub dist: &'a [f64],
    pub csr: FlowCsr,
    pub dense: Option<DenseModel<'a>>,
    /// All inputs are integers small enough for exact f64 arithmetic of every cost and delta.
    pub integral: bool,
    /// Candidate locations near each location (sparse engine and large greedy only).
    pub near: Option<Near>,
}

/// Largest size for the dense delta-matrix tabu search.
const DENSE_MAX: usize = 1024;

fn transpose(a: &[f64], s: usize) -> Vec<f64> {
    let mut t = vec![0.0; s * s];
    for i in 0..s {
        for j in 0..s {
            t[j * s + i] = a[i * s + j];
        }
    }
    t
}

fn is_symmetric(a: &[f64], s: usize) -> bool {
    for i in 0..s {
        for j in i + 1..s {
            if a[i * s + j] != a[j * s + i] {
                return false;
            }
        }
    }
    true
}

impl<'a> Problem<'a> {
    pub fn new(n: usize, size: usize, dist: &'a [f64], csr: FlowCsr) -> Problem<'a> {
        let nnz = csr.nnz();
        let dense_engine =
            size <= DENSE_MAX && (size <= 256 || nnz as f64 >= 0.05 * (size * size) as f64);

        let fmax: f64 = csr.out.iter().map(|e| e.1.abs()).sum();
        let dmax: f64 = dist.iter().fold(0.0f64, |a, &b| a.max(b.abs()));
        let integral = csr.out.iter().all(|e| e.1.fract() == 0.0)
            && dist.iter().all(|v| v.fract() == 0.0)
            && 4.0 * fmax * dmax < (1u64 << 52) as f64;

        let dense = if dense_engine {
            let mut f = vec![0.0; size * size];
            for i in 0..size {
                for &(j, w) in csr.out_of(i) {
                    f[i * size + j as usize] += w;
                }
            }
            let fsym = is_symmetric(&f, size);
            let dsym = is_symmetric(dist, size);
            let mut d: Cow<'a, [f64]> = Cow::Borrowed(dist);
            let sym = if fsym && dsym {
                true
            } else if dsym {
                // sum_ij f_ij d_pipj is unchanged when f is replaced by (f + f^T) / 2.
                for i in 0..size {
                    for j in i + 1..size {
                        let v = 0.5 * (f[i * size + j] + f[j * size + i]);
                        f[i * size + j] = v;
                        f[j * size + i] = v;
                    }
                }
                true
            } else if fsym {
                let mut dd = dist.to_vec();
                for i in 0..size {
                    for j in i + 1..size {
                        let v = 0.5 * (dd[i * size + j] + dd[j * size + i]);
                        dd[i * size + j] = v;
                        dd[j * size + i] = v;
                    }
                }
                d = Cow::Owned(dd);
                true
            } else {
                false
            };
            let ft = if sym { Vec::new() } else { transpose(&f, size) };
            Some(DenseModel {
                size,
                f,
                d,
                sym,
                ft,
            })
        } else {
            None
        };
        // Halving may create .5 values: still exact in f64, but keep the flag conservative.
        let integral = integral
            && dense
                .as_ref()
                .is_none_or(|dm| dm.f.iter().all(|v| v.fract() == 0.0));
        Problem {
            n,
            size,
            dist,
            csr,
            dense,
            integral,
            near: None,
        }
    }

    /// Cost of a full (padded) permutation, from the sparse flow.
    pub fn cost(&self, p: &[usize]) -> f64 {
        let s = self.size;
        let mut total = 0.0;
        for i in 0..self.n {
            let row = &self.dist[p[i] * s..(p[i] + 1) * s];
            for &(j, w) in self.csr.out_of(i) {
                total += w * row[p[j as usize]];
            }
        }
        total
    }

    /// Change of cost when ranks `r` and `s` swap locations, in O(degree).
    #[inline]
    pub fn sparse_delta(&self, p: &[usize], r: usize, s: usize) -> f64 {
        let m = self.size;
        let d = self.dist;
        let (a, b) = (p[r], p[s]);
        let newp = |k: usize| {
            if k == r {
                b
            } else if k == s {
                a
            } else {
                p[k]
            }
        };
        let mut delta = 0.0;
        if r < self.n {
            for &(j, w) in self.csr.out_of(r) {
                let j = j as usize;
                delta += w * (d[b * m + newp(j)] - d[a * m + p[j]]);
            }
            for &(i, w) in self.csr.in_of(r) {
                let i = i as usize;
                if i != r && i != s {
                    delta += w * (d[p[i] * m + b] - d[p[i] * m + a]);
                }
            }
        }
        if s < self.n {
            for &(j, w) in self.csr.out_of(s) {
                let j = j as usize;
                delta += w * (d[a * m + newp(j)] - d[b * m + p[j]]);
            }
            for &(i, w) in self.csr.in_of(s) {
                let i = i as usize;
                if i != r && i != s {
                    delta += w * (d[p[i] * m + a] - d[p[i] * m + b]);
                }
            }
        }
        delta
    }

    /// Improve a full (padded) permutation; returns the best found and the iteration count.
    pub fn improve(
        &self,
        start: Vec<usize>,
        rng: &mut ChaCha8Rng,
        deadline: Option<Instant>,
        max_iter: u64,
    ) -> (Vec<usize>, u64) {
        match &self.dense {
            Some(dm) => super::rots::run(self, dm, start, rng, deadline, max_iter),
            None => super::sparse::run(self, start, rng, deadline, max_iter),
        }
    }
}

/// True when the deadline has passed or the caller asked to stop (see [`crate::interrupt`]).
#[inline]
pub(super) fn expired(deadline: Option<Instant>) -> bool {
    crate::interrupt::interrupted()
        || match deadline {
            Some(t) => Instant::now() >= t,
            None => false,
        }
}
