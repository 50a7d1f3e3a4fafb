//! Robust tabu search (E. Taillard, "Robust taboo search for the quadratic assignment problem",
//! Parallel Computing 17, 1991) on a dense delta matrix.
//!
//! `delta[i*N + j]` (i < j) holds the cost change of swapping the locations of ranks i and j.
//! After a swap of (r, s), every pair disjoint from {r, s} is updated in O(1) with Taillard's
//! formula; pairs touching r or s are recomputed in O(N). The distance matrix is kept permuted
//! into rank space (`dp[i][j] = d[p[i]][p[j]]`) so that every inner loop is contiguous.
//!
//! Taillard's parameters: tenure `cube(U(0,1)) * 8N`, aspiration by age after `5 N^2`
//! iterations, aspiration by cost. Additions: ties between equally good authorised moves are
//! broken at random, and after `STALL * N` iterations without a new best the search restarts
//! from the best solution perturbed by `PERTURB_PERCENT`% of N random swaps (an iterated tabu
//! search; it measurably helps the irregular chr and tai*b instances).

use std::time::Instant;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::model::{expired, DenseModel, Problem};

#[cfg(test)]
pub(super) fn dense_cost(dm: &DenseModel, p: &[usize]) -> f64 {
    let n = dm.size;
    let mut total = 0.0;
    for i in 0..n {
        let frow = &dm.f[i * n..(i + 1) * n];
        let drow = &dm.d[p[i] * n..(p[i] + 1) * n];
        let mut s = 0.0;
        for j in 0..n {
            s += frow[j] * drow[p[j]];
        }
        total += s;
    }
    total
}

/// Cost change of swapping the locations of ranks r and s (r != s), from scratch (tests).
#[cfg(test)]
pub(super) fn full_delta(dm: &DenseModel, p: &[usize], r: usize, s: usize) -> f64 {
    Perm::new(dm, p.to_vec()).delta(dm, r, s)
}

/// sum_k (a_k - b_k) * (c_k - e_k) with four accumulators (vectorisable; fixed order).
#[inline]
fn dot_diff(a: &[f64], b: &[f64], c: &[f64], e: &[f64]) -> f64 {
    let len = a.len().min(b.len()).min(c.len()).min(e.len());
    let (a, b, c, e) = (&a[..len], &b[..len], &c[..len], &e[..len]);
    let mut acc = [0.0f64; 4];
    let chunks = a
        .chunks_exact(4)
        .zip(b.chunks_exact(4))
        .zip(c.chunks_exact(4).zip(e.chunks_exact(4)));
    for ((ca, cb), (cc, ce)) in chunks {
        for l in 0..4 {
            acc[l] += (ca[l] - cb[l]) * (cc[l] - ce[l]);
        }
    }
    let q = len / 4 * 4;
    let mut tail = 0.0;
    for k in q..len {
        tail += (a[k] - b[k]) * (c[k] - e[k]);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// Permutation with the distance matrix permuted into rank space.
struct Perm {
    n: usize,
    p: Vec<usize>,
    /// dp[i*n + j] = d[p[i]][p[j]]
    dp: Vec<f64>,
    /// dpt[i*n + j] = d[p[j]][p[i]] (asymmetric case only)
    dpt: Vec<f64>,
}

impl Perm {
    fn new(dm: &DenseModel, p: Vec<usize>) -> Perm {
        let n = dm.size;
        let mut st = Perm {
            n,
            p,
            dp: vec![0.0; n * n],
            dpt: Vec::new(),
        };
        if !dm.sym {
            st.dpt = vec![0.0; n * n];
        }
        st.rebuild(dm);
        st
    }

    fn rebuild(&mut self, dm: &DenseModel) {
        let n = self.n;
        for i in 0..n {
            let drow = &dm.d[self.p[i] * n..(self.p[i] + 1) * n];
            for j in 0..n {
                self.dp[i * n + j] = drow[self.p[j]];
            }
        }
        if !dm.sym {
            for i in 0..n {
                for j in 0..n {
                    self.dpt[j * n + i] = self.dp[i * n + j];
                }
            }
        }
    }

    fn swap(&mut self, r: usize, s: usize) {
        let n = self.n;
        self.p.swap(r, s);
        for m in [&mut self.dp, &mut self.dpt] {
            if m.is_empty() {
                continue;
            }
            for k in 0..n {
                m.swap(r * n + k, s * n + k);
            }
            for k in 0..n {
                m.swap(k * n + r, k * n + s);
            }
        }
    }

    fn cost(&self, dm: &DenseModel) -> f64 {
        let mut total = 0.0;
        let n = self.n;
        for i in 0..n {
            let f = &dm.f[i * n..(i + 1) * n];
            let d = &self.dp[i * n..(i + 1) * n];
            total += f.iter().zip(d).map(|(a, b)| a * b).sum::<f64>();
        }
        total
    }

    /// Cost change of swapping ranks r and s.
    #[inline]
    fn delta(&self, dm: &DenseModel, r: usize, s: usize) -> f64 {
        let n = self.n;
        let f = &dm.f;
        let fr = &f[r * n..(r + 1) * n];
        let fs = &f[s * n..(s + 1) * n];
        let dr = &self.dp[r * n..(r + 1) * n];
        let ds = &self.dp[s * n..(s + 1) * n];
        let diag = (fr[r] - fs[s]) * (ds[s] - dr[r]);
        if dm.sym {
            // 2 * sum_{k != r,s} (f_rk - f_sk)(d_{ps,pk} - d_{pr,pk})
            let sum = dot_diff(fr, fs, ds, dr);
            let tr = (fr[r] - fs[r]) * (ds[r] - dr[r]);
            let ts = (fr[s] - fs[s]) * (ds[s] - dr[s]);
            diag + 2.0 * (sum - tr - ts)
        } else {
            // sum_{k != r,s} (f_kr - f_ks)(d_{pk,ps} - d_{pk,pr}) + (f_rk - f_sk)(d_{ps,pk} - d_{pr,pk})
            let ftr = &dm.ft[r * n..(r + 1) * n];
            let fts = &dm.ft[s * n..(s + 1) * n];
            let dtr = &self.dpt[r * n..(r + 1) * n];
            let dts = &self.dpt[s * n..(s + 1) * n];
            let mut sum = dot_diff(fr, fs, ds, dr) + dot_diff(ftr, fts, dts, dtr);
            let term = |k: usize| {
                (ftr[k] - fts[k]) * (dts[k] - dtr[k]) + (fr[k] - fs[k]) * (ds[k] - dr[k])
            };
            sum -= term(r) + term(s);
            diag + (fr[s] - fs[r]) * (ds[r] - dr[s]) + sum
        }
    }
}

fn fill_delta(dm: &DenseModel, st: &Perm, nr: usize, delta: &mut [f64]) {
    let n = dm.size;
    for i in 0..nr {
        for j in i + 1..n {
            delta[i * n + j] = st.delta(dm, i, j);
        }
    }
}

/// Stagnation limit of the tabu search, in multiples of n iterations without a new best.
const STALL: u64 = 20;
/// Strength of the restart perturbation, in percent of n random swaps.
const PERTURB_PERCENT: usize = 30;

#[inline]
fn cube(x: f64) -> f64 {
    x * x * x
}

/// Tabu bookkeeping per pair i < j: the smaller and larger of tabu[i][p[j]], tabu[j][p[i]].
#[inline]
fn pair_tabu(tabu: &[i64], p: &[usize], n: usize, i: usize, j: usize) -> (i64, i64) {
    let a = tabu[i * n + p[j]];
    let b = tabu[j * n + p[i]];
    (a.min(b), a.max(b))
}

/// Run RoTS from `p` (a full padded permutation). Returns the best permutation and iterations.
pub(super) fn run(
    pb: &Problem,
    dm: &DenseModel,
    p: Vec<usize>,
    rng: &mut ChaCha8Rng,
    deadline: Option<Instant>,
    max_iter: u64,
) -> (Vec<usize>, u64) {
    let n = dm.size;
    let nr = pb.n.min(n.saturating_sub(1));
    if n < 2 || max_iter == 0 || nr == 0 {
        return (p, 0);
    }
    let mut st = Perm::new(dm, p);
    let mut delta = vec![0.0f64; n * n];
    fill_delta(dm, &st, nr, &mut delta);
    let mut cur = st.cost(dm);
    let mut best = cur;
    let mut best_p = st.p.clone();

    // tabu[i*n + loc]: iteration until which rank i may not return to loc.
    let mut tabu: Vec<i64> = (0..n * n).map(|k| -(k as i64)).collect();
    let mut tlo = vec![0i64; n * n];
    let mut thi = vec![0i64; n * n];
    for i in 0..nr {
        for j in i + 1..n {
            let (lo, hi) = pair_tabu(&tabu, &st.p, n, i, j);
            tlo[i * n + j] = lo;
            thi[i * n + j] = hi;
        }
    }
    let tabu_duration = (8 * n) as f64;
    let aspiration = (n as i64) * (n as i64) * 5;
    let eps = if pb.integral { 0.0 } else { 1e-9 };
    let refresh = if pb.integral {
        u64::MAX
    } else {
        (4 * n as u64).max(64)
    };
    let check_every = (1 + 65536 / (n * n)) as u64;

    let mut a = vec![0.0f64; n];
    let mut b = vec![0.0f64; n];
    let mut a2 = vec![0.0f64; n];
    let mut b2 = vec![0.0f64; n];

    // Restart from a perturbed best solution after STALL * n iterations without a new best.
    let stall_limit = STALL * n as u64;
    let mut last_imp: u64 = 0;
    let mut iter: u64 = 0;
    loop {
        if iter >= max_iter {
            break;
        }
        if iter % check_every == 0 && expired(deadline) {
            break;
        }
        iter += 1;
        let it = iter as i64;
        let thr = best - eps * best.abs().max(1.0);

        // --- choose the move: the best aspired move if any, else the best authorized one ---
        let cost_thr = thr - cur;
        let age_thr = it - aspiration;
        let mut best_asp = (f64::INFINITY, usize::MAX);
        let mut best_auth = (f64::INFINITY, usize::MAX);
        let mut ties = 0u32;
        for i in 0..nr {
            let row = i * n + i + 1..(i + 1) * n;
            let drow = &delta[row.clone()];
            let lrow = &tlo[row.clone()];
            let hrow = &thi[row];
            for (k, ((&dl, &lo), &hi)) in drow.iter().zip(lrow).zip(hrow).enumerate() {
                if hi < age_thr || dl < cost_thr {
                    if dl < best_asp.0 {
                        best_asp = (dl, i * n + i + 1 + k);
                    }
                } else if lo < it && dl <= best_auth.0 {
                    // Ties broken uniformly at random (reservoir sampling).
                    if dl < best_auth.0 {
                        best_auth = (dl, i * n + i + 1 + k);
                        ties = 1;
                    } else {
                        ties += 1;
                        if rng.gen_range(0..ties) == 0 {
                            best_auth.1 = i * n + i + 1 + k;
                        }
                    }
                }
            }
        }
        let chosen = if best_asp.1 != usize::MAX {
            best_asp.1
        } else {
            best_auth.1
        };
        let (r, s) = if chosen == usize::MAX {
            let r = rng.gen_range(0..nr);
            (r, rng.gen_range(r + 1..n))
        } else {
            (chosen / n, chosen % n)
        };

        // --- apply ---
        cur += delta[r * n + s];
        st.swap(r, s);
        tabu[r * n + st.p[s]] = it + (cube(rng.gen::<f64>()) * tabu_duration) as i64;
        tabu[s * n + st.p[r]] = it + (cube(rng.gen::<f64>()) * tabu_duration) as i64;
        for u in [r, s] {
            for k in 0..n {
                if k != u {
                    let (i, j) = if k < u { (k, u) } else { (u, k) };
                    if i < nr {
                        let (lo, hi) = pair_tabu(&tabu, &st.p, n, i, j);
                        tlo[i * n + j] = lo;
                        thi[i * n + j] = hi;
                    }
                }
            }
        }

        if iter % refresh == 0 {
            fill_delta(dm, &st, nr, &mut delta);
            cur = st.cost(dm);
        } else {
            update_delta(
                dm, &st, nr, r, s, &mut delta, &mut a, &mut b, &mut a2, &mut b2,
            );
        }
        #[cfg(debug_assertions)]
        if pb.integral && iter % 64 == 0 {
            debug_assert_eq!(cur, st.cost(dm), "incremental cost drifted");
            let (i, j) = (r.min(s), r.max(s));
            if i < nr {
                debug_assert_eq!(delta[i * n + j], st.delta(dm, i, j), "delta matrix drifted");
            }
            if nr >= 2 {
                debug_assert_eq!(delta[1], st.delta(dm, 0, 1), "delta matrix drifted");
            }
        }
        if cur < thr {
            best = cur;
            best_p.copy_from_slice(&st.p);
            last_imp = iter;
        } else if iter - last_imp > stall_limit {
            // Restart from the best solution with PERTURB_PERCENT % of n random swaps.
            st.p.copy_from_slice(&best_p);
            let k = (n * PERTURB_PERCENT / 100).max(2);
            for _ in 0..k {
                let i = rng.gen_range(0..nr);
                let j = rng.gen_range(0..n);
                st.p.swap(i, j);
            }
            st.rebuild(dm);
            fill_delta(dm, &st, nr, &mut delta);
            cur = st.cost(dm);
            for i in 0..nr {
                for j in i + 1..n {
                    let (lo, hi) = pair_tabu(&tabu, &st.p, n, i, j);
                    tlo[i * n + j] = lo;
                    thi[i * n + j] = hi;
                }
            }
            last_imp = iter;
        }
    }
    (best_p, iter)
}

#[allow(clippy::too_many_arguments)]
fn update_delta(
    dm: &DenseModel,
    st: &Perm,
    nr: usize,
    r: usize,
    s: usize,
    delta: &mut [f64],
    a: &mut [f64],
    b: &mut [f64],
    a2: &mut [f64],
    b2: &mut [f64],
) {
    let n = dm.size;
    let f = &dm.f;
    let fr = &f[r * n..(r + 1) * n];
    let fs = &f[s * n..(s + 1) * n];
    let dr = &st.dp[r * n..(r + 1) * n];
    let ds = &st.dp[s * n..(s + 1) * n];
    let scale = if dm.sym { 2.0 } else { 1.0 };
    for k in 0..n {
        a[k] = scale * (fr[k] - fs[k]);
        b[k] = ds[k] - dr[k];
    }
    if dm.sym {
        for i in 0..nr {
            let (ai, bi) = (a[i], b[i]);
            let row = &mut delta[i * n + i + 1..(i + 1) * n];
            for ((x, &av), &bv) in row.iter_mut().zip(&a[i + 1..n]).zip(&b[i + 1..n]) {
                *x += (ai - av) * (bi - bv);
            }
        }
    } else {
        let ftr = &dm.ft[r * n..(r + 1) * n];
        let fts = &dm.ft[s * n..(s + 1) * n];
        let dtr = &st.dpt[r * n..(r + 1) * n];
        let dts = &st.dpt[s * n..(s + 1) * n];
        for k in 0..n {
            a2[k] = ftr[k] - fts[k];
            b2[k] = dts[k] - dtr[k];
        }
        for i in 0..nr {
            let (ai, bi, a2i, b2i) = (a[i], b[i], a2[i], b2[i]);
            let row = &mut delta[i * n + i + 1..(i + 1) * n];
            let it = a[i + 1..n]
                .iter()
                .zip(&b[i + 1..n])
                .zip(a2[i + 1..n].iter().zip(&b2[i + 1..n]));
            for (x, ((&aj, &bj), (&a2j, &b2j))) in row.iter_mut().zip(it) {
                *x += (ai - aj) * (bi - bj) + (a2i - a2j) * (b2i - b2j);
            }
        }
    }
    // Pairs touching r or s: recompute.
    for u in [r, s] {
        for k in 0..n {
            if k == u {
                continue;
            }
            let (i, j) = if k < u { (k, u) } else { (u, k) };
            if i < nr {
                delta[i * n + j] = st.delta(dm, i, j);
            }
        }
    }
}
