//! Iterated local search for sparse or very large problems.
//!
//! Moves are swaps of two ranks' locations (a rank and a dummy: a move to an empty location),
//! evaluated in O(deg r + deg s). Candidate swaps for rank r are guided: r goes next to one of
//! its traffic partners j, i.e. onto a location near `p[j]` (same lowest block of the hierarchy,
//! or among the K nearest locations). Descent processes a worklist of ranks; each round of the
//! iterated local search perturbs the current solution with a few random guided swaps, descends,
//! and keeps the result if it is not worse (otherwise undoes it).

use std::time::Instant;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::hier::Hierarchy;
use super::model::{expired, Problem};

/// Candidate locations near each location.
pub(super) struct Near {
    ptr: Vec<usize>,
    list: Vec<u32>,
}

const K_NEAR: usize = 16;

impl Near {
    #[inline]
    pub fn of(&self, l: usize) -> &[u32] {
        &self.list[self.ptr[l]..self.ptr[l + 1]]
    }

    pub fn build(dist: &[f64], m: usize, hier: Option<&Hierarchy>) -> Near {
        let mut ptr = vec![0usize; m + 1];
        let mut list: Vec<u32> = Vec::with_capacity(m * K_NEAR);
        match hier {
            Some(h) => {
                let mut pos = vec![0usize; m];
                for (k, &l) in h.order.iter().enumerate() {
                    pos[l] = k;
                }
                for l in 0..m {
                    let b = &h.nodes[h.leaf_block[l]];
                    let len = b.len();
                    // Up to 2*K_NEAR block mates, cyclically after l in tree order.
                    let take = len.min(2 * K_NEAR + 1);
                    let off = pos[l] - b.start;
                    for k in 1..take {
                        list.push(h.order[b.start + (off + k) % len] as u32);
                    }
                    ptr[l + 1] = list.len();
                }
            }
            None => {
                let k = K_NEAR.min(m.saturating_sub(1));
                let mut row: Vec<(f64, u32)> = Vec::with_capacity(m);
                for l in 0..m {
                    row.clear();
                    row.extend(
                        (0..m)
                            .filter(|&x| x != l)
                            .map(|x| (dist[l * m + x] + dist[x * m + l], x as u32)),
                    );
                    if k > 0 && k < row.len() {
                        row.select_nth_unstable_by(k - 1, |a, b| {
                            a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
                        });
                    }
                    row.truncate(k);
                    row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    list.extend(row.iter().map(|e| e.1));
                    ptr[l + 1] = list.len();
                }
            }
        }
        Near { ptr, list }
    }
}

struct State<'p, 'a> {
    pb: &'p Problem<'a>,
    p: Vec<usize>,
    q: Vec<usize>,
    cur: f64,
    log: Vec<(usize, usize)>,
    in_work: Vec<bool>,
    work: Vec<usize>,
    /// `seen[s] == stamp`: partner s already evaluated for the current rank.
    seen: Vec<u32>,
    stamp: u32,
}

impl<'p, 'a> State<'p, 'a> {
    fn swap(&mut self, r: usize, s: usize, delta: f64) {
        let (a, b) = (self.p[r], self.p[s]);
        self.p[r] = b;
        self.p[s] = a;
        self.q[a] = s;
        self.q[b] = r;
        self.cur += delta;
        self.log.push((r, s));
    }

    fn push_work(&mut self, r: usize) {
        if r < self.pb.n && !self.in_work[r] {
            self.in_work[r] = true;
            self.work.push(r);
        }
    }

    fn push_with_partners(&mut self, r: usize) {
        self.push_work(r);
        if r < self.pb.n {
            let csr = &self.pb.csr;
            for k in 0..csr.out_of(r).len() + csr.in_of(r).len() {
                let j = if k < csr.out_of(r).len() {
                    csr.out_of(r)[k].0
                } else {
                    csr.in_of(r)[k - csr.out_of(r).len()].0
                } as usize;
                self.push_work(j);
            }
        }
    }

    /// Best guided swap of rank r: (delta, partner).
    fn best_move(&mut self, r: usize, near: &Near) -> (f64, usize) {
        let pb = self.pb;
        let mut best = (0.0f64, usize::MAX);
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.seen.iter_mut().for_each(|x| *x = 0);
            self.stamp = 1;
        }
        let stamp = self.stamp;
        for &(j, _) in pb.csr.out_of(r).iter().chain(pb.csr.in_of(r)) {
            let j = j as usize;
            if j == r {
                continue;
            }
            let pj = self.p[j];
            for &l in near.of(pj) {
                let s = self.q[l as usize];
                if s == r || self.seen[s] == stamp {
                    continue;
                }
                self.seen[s] = stamp;
                let dl = pb.sparse_delta(&self.p, r, s);
                if dl < best.0 {
                    best = (dl, s);
                }
            }
        }
        best
    }

    /// Descend until the worklist is empty (or time is up).
    fn descend(&mut self, near: &Near, eps: f64, deadline: Option<Instant>) {
        let mut pops = 0u64;
        while let Some(r) = self.work.pop() {
            self.in_work[r] = false;
            pops += 1;
            if pops % 1024 == 0 && expired(deadline) {
                for &v in &self.work {
                    self.in_work[v] = false;
                }
                self.work.clear();
                return;
            }
            let (dl, s) = self.best_move(r, near);
            if s != usize::MAX && dl < -eps {
                self.swap(r, s, dl);
                self.push_with_partners(r);
                self.push_with_partners(s);
            }
        }
    }
}

pub(super) fn run(
    pb: &Problem,
    start: Vec<usize>,
    rng: &mut ChaCha8Rng,
    deadline: Option<Instant>,
    max_iter: u64,
) -> (Vec<usize>, u64) {
    let size = pb.size;
    let n = pb.n;
    let near = match &pb.near {
        Some(nr) => nr,
        None => return (start, 0),
    };
    let mut q = vec![0usize; size];
    for (r, &l) in start.iter().enumerate() {
        q[l] = r;
    }
    let cur = pb.cost(&start);
    let mut st = State {
        pb,
        p: start,
        q,
        cur,
        log: Vec::new(),
        in_work: vec![false; size],
        work: Vec::new(),
        seen: vec![0; size],
        stamp: 0,
    };
    let eps = if pb.integral {
        0.0
    } else {
        1e-9 * cur.abs().max(1.0)
    };
    for r in (0..n).rev() {
        st.push_work(r);
    }
    st.descend(near, eps, deadline);
    let mut best = st.cur;
    let mut best_p = st.p.clone();
    let mut iter = 0u64;
    let kmax = 8usize.min(n.max(1));
    while iter < max_iter && !expired(deadline) {
        iter += 1;
        st.log.clear();
        let before = st.cur;
        let k = rng.gen_range(1..=kmax);
        for _ in 0..k {
            let r = rng.gen_range(0..n);
            let deg = pb.csr.out_of(r).len() + pb.csr.in_of(r).len();
            let l = if deg == 0 {
                rng.gen_range(0..size)
            } else {
                let e = rng.gen_range(0..deg);
                let j = if e < pb.csr.out_of(r).len() {
                    pb.csr.out_of(r)[e].0
                } else {
                    pb.csr.in_of(r)[e - pb.csr.out_of(r).len()].0
                } as usize;
                let cand = near.of(st.p[j]);
                if cand.is_empty() {
                    rng.gen_range(0..size)
                } else {
                    cand[rng.gen_range(0..cand.len())] as usize
                }
            };
            let s = st.q[l];
            if s != r {
                let dl = pb.sparse_delta(&st.p, r, s);
                st.swap(r, s, dl);
                st.push_with_partners(r);
                st.push_with_partners(s);
            }
        }
        st.descend(near, eps, deadline);
        if st.cur < best - eps {
            best = st.cur;
            best_p.copy_from_slice(&st.p);
        } else if st.cur > before + eps {
            // Undo the round.
            while let Some((r, s)) = st.log.pop() {
                let (a, b) = (st.p[r], st.p[s]);
                st.p[r] = b;
                st.p[s] = a;
                st.q[a] = s;
                st.q[b] = r;
            }
            st.cur = before;
        }
        if !pb.integral && iter % 4096 == 0 {
            st.cur = pb.cost(&st.p);
        }
    }
    (best_p, iter)
}
