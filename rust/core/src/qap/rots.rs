//! Robust tabu search (E. Taillard, "Robust taboo search for the quadratic assignment problem",
//! Parallel Computing 17, 1991) on a dense delta matrix.
//!
//! `delta[i*N + j]` (i < j) holds the cost change of swapping the locations of ranks i and j.
//! After a swap of (r, s), every pair disjoint from {r, s} is updated in O(1) with Taillard's
//! formula; pairs touching r or s are recomputed in O(N).

use std::time::Instant;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::model::{expired, DenseModel, Problem};

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

/// Cost change of swapping the locations of ranks r and s (r != s), in O(N).
#[inline]
pub(super) fn full_delta(dm: &DenseModel, p: &[usize], r: usize, s: usize) -> f64 {
    let n = dm.size;
    let f = &dm.f;
    let d = &dm.d;
    let (pr, ps) = (p[r], p[s]);
    let fr = &f[r * n..(r + 1) * n];
    let fs = &f[s * n..(s + 1) * n];
    let dr = &d[pr * n..(pr + 1) * n];
    let ds = &d[ps * n..(ps + 1) * n];
    let diag = (fr[r] - fs[s]) * (ds[ps] - dr[pr]);
    if dm.sym {
        // 2 * sum_{k != r,s} (f_rk - f_sk)(d_{ps,pk} - d_{pr,pk})
        let mut sum = 0.0;
        for k in 0..n {
            let pk = p[k];
            sum += (fr[k] - fs[k]) * (ds[pk] - dr[pk]);
        }
        let tr = (fr[r] - fs[r]) * (ds[pr] - dr[pr]);
        let ts = (fr[s] - fs[s]) * (ds[ps] - dr[ps]);
        diag + 2.0 * (sum - tr - ts)
    } else {
        let mut sum = (fr[s] - fs[r]) * (d[ps * n + pr] - d[pr * n + ps]);
        for k in 0..n {
            if k == r || k == s {
                continue;
            }
            let pk = p[k];
            let dk = &d[pk * n..(pk + 1) * n];
            sum += (f[k * n + r] - f[k * n + s]) * (dk[ps] - dk[pr]) + (fr[k] - fs[k]) * (ds[pk] - dr[pk]);
        }
        diag + sum
    }
}

fn fill_delta(dm: &DenseModel, p: &[usize], nr: usize, delta: &mut [f64]) {
    let n = dm.size;
    for i in 0..nr {
        for j in i + 1..n {
            delta[i * n + j] = full_delta(dm, p, i, j);
        }
    }
}

#[inline]
fn cube(x: f64) -> f64 {
    x * x * x
}

/// Run RoTS from `p` (a full padded permutation). Returns the best permutation and iterations.
pub(super) fn run(
    pb: &Problem,
    dm: &DenseModel,
    mut p: Vec<usize>,
    rng: &mut ChaCha8Rng,
    deadline: Option<Instant>,
    max_iter: u64,
) -> (Vec<usize>, u64) {
    let n = dm.size;
    let nr = pb.n.min(n.saturating_sub(1));
    if n < 2 || max_iter == 0 || nr == 0 {
        return (p, 0);
    }
    let mut delta = vec![0.0f64; n * n];
    fill_delta(dm, &p, nr, &mut delta);
    let mut cur = dense_cost(dm, &p);
    let mut best = cur;
    let mut best_p = p.clone();

    // tabu[i*n + loc]: iteration until which rank i may not return to loc.
    let mut tabu: Vec<i64> = (0..n * n).map(|k| -(k as i64)).collect();
    let tabu_duration = (8 * n) as f64;
    let aspiration = (n as i64) * (n as i64) * 5;
    let eps = if pb.integral { 0.0 } else { 1e-9 };
    let refresh = if pb.integral { u64::MAX } else { (4 * n as u64).max(64) };
    let check_every = (1 + 65536 / (n * n)) as u64;

    let mut a = vec![0.0f64; n];
    let mut b = vec![0.0f64; n];
    let mut a2 = vec![0.0f64; n];
    let mut b2 = vec![0.0f64; n];

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

        // --- choose the move ---
        let mut ri = usize::MAX;
        let mut sj = usize::MAX;
        let mut min_delta = f64::INFINITY;
        let mut already_aspired = false;
        for i in 0..nr {
            let pi = p[i];
            let drow = &delta[i * n..(i + 1) * n];
            let trow = &tabu[i * n..(i + 1) * n];
            for j in i + 1..n {
                let dl = drow[j];
                let ti = trow[p[j]];
                let tj = tabu[j * n + pi];
                let authorized = ti < it || tj < it;
                let aspired = (ti < it - aspiration && tj < it - aspiration) || cur + dl < thr;
                if (aspired && !already_aspired)
                    || (aspired && already_aspired && dl < min_delta)
                    || (!aspired && !already_aspired && authorized && dl < min_delta)
                {
                    ri = i;
                    sj = j;
                    min_delta = dl;
                    if aspired {
                        already_aspired = true;
                    }
                }
            }
        }
        if ri == usize::MAX {
            ri = rng.gen_range(0..nr);
            sj = rng.gen_range(ri + 1..n);
        }
        let (r, s) = (ri, sj);

        // --- apply ---
        cur += delta[r * n + s];
        p.swap(r, s);
        tabu[r * n + p[s]] = it + (cube(rng.gen::<f64>()) * tabu_duration) as i64;
        tabu[s * n + p[r]] = it + (cube(rng.gen::<f64>()) * tabu_duration) as i64;

        if iter % refresh == 0 {
            fill_delta(dm, &p, nr, &mut delta);
            cur = dense_cost(dm, &p);
        } else {
            update_delta(dm, &p, nr, r, s, &mut delta, &mut a, &mut b, &mut a2, &mut b2);
        }
        if cur < thr {
            best = cur;
            best_p.copy_from_slice(&p);
        }
    }
    (best_p, iter)
}

#[allow(clippy::too_many_arguments)]
fn update_delta(
    dm: &DenseModel,
    p: &[usize],
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
    let d = &dm.d;
    let (pr, ps) = (p[r], p[s]);
    let fr = &f[r * n..(r + 1) * n];
    let fs = &f[s * n..(s + 1) * n];
    let dr = &d[pr * n..(pr + 1) * n];
    let ds = &d[ps * n..(ps + 1) * n];
    for k in 0..n {
        a[k] = fr[k] - fs[k];
        b[k] = ds[p[k]] - dr[p[k]];
    }
    if dm.sym {
        for k in 0..n {
            a[k] *= 2.0;
        }
        for i in 0..nr {
            let (ai, bi) = (a[i], b[i]);
            let row = &mut delta[i * n + i + 1..(i + 1) * n];
            let aj = &a[i + 1..n];
            let bj = &b[i + 1..n];
            for ((x, &av), &bv) in row.iter_mut().zip(aj).zip(bj) {
                *x += (ai - av) * (bi - bv);
            }
        }
    } else {
        for k in 0..n {
            a2[k] = f[k * n + r] - f[k * n + s];
            let dk = &d[p[k] * n..(p[k] + 1) * n];
            b2[k] = dk[ps] - dk[pr];
        }
        for i in 0..nr {
            let (ai, bi, a2i, b2i) = (a[i], b[i], a2[i], b2[i]);
            let row = &mut delta[i * n + i + 1..(i + 1) * n];
            for (off, x) in row.iter_mut().enumerate() {
                let j = i + 1 + off;
                *x += (ai - a[j]) * (bi - b[j]) + (a2i - a2[j]) * (b2i - b2[j]);
            }
        }
    }
    // Pairs touching r or s: recompute.
    for &u in &[r, s] {
        for k in 0..n {
            if k == u {
                continue;
            }
            let (i, j) = if k < u { (k, u) } else { (u, k) };
            if i < nr {
                delta[i * n + j] = full_delta(dm, p, i, j);
            }
        }
    }
}
