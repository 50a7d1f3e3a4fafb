//! Starting solutions: the caller's initial mapping, the hierarchy-aware construction, a greedy
//! construction, or a random permutation.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use super::hier::{fill_dummies, Hierarchy};
use super::model::Problem;

/// Starting permutation (full, padded) of search `index`.
pub(super) fn start(
    pb: &Problem,
    hier: Option<&Hierarchy>,
    initial: Option<&[usize]>,
    index: usize,
    rng: &mut ChaCha8Rng,
) -> Vec<usize> {
    let mut cands: Vec<Vec<usize>> = Vec::new();
    if index == 0 {
        if let Some(init) = initial {
            let mut p = vec![usize::MAX; pb.size];
            p[..pb.n].copy_from_slice(init);
            fill_dummies(&mut p, pb.n);
            cands.push(p);
        }
        match hier {
            Some(h) => cands.push(h.construct(&pb.csr, pb.n, None)),
            None => {
                if let Some(g) = greedy(pb) {
                    cands.push(g);
                }
            }
        }
    } else {
        match hier {
            Some(h) => cands.push(h.construct(&pb.csr, pb.n, Some(rng))),
            None => {
                if pb.dense.is_none() {
                    if let Some(g) = greedy(pb) {
                        // Randomise the sparse start a little: a few random swaps.
                        let mut g = g;
                        let k = (pb.size / 20).max(1);
                        for _ in 0..k {
                            let i = rand::Rng::gen_range(rng, 0..pb.size);
                            let j = rand::Rng::gen_range(rng, 0..pb.size);
                            g.swap(i, j);
                        }
                        cands.push(g);
                    }
                }
            }
        }
    }
    if cands.is_empty() {
        let mut p: Vec<usize> = (0..pb.size).collect();
        p.shuffle(rng);
        return p;
    }
    let mut best = 0;
    let mut best_cost = f64::INFINITY;
    for (k, c) in cands.iter().enumerate() {
        let cost = pb.cost(c);
        if cost < best_cost {
            best_cost = cost;
            best = k;
        }
    }
    cands.swap_remove(best)
}

#[derive(PartialEq)]
struct Key(f64, usize);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then_with(|| o.1.cmp(&self.1))
    }
}

/// Greedy construction: repeatedly take the unplaced rank with the heaviest traffic to the placed
/// ones (a new component starts with the heaviest rank left) and put it on the free location that
/// adds the least cost; the first rank of a component goes to the most central free location.
/// Candidate locations are all free ones when that is cheap enough, otherwise the locations near
/// the placed partners (needs near lists). Returns None when too expensive.
pub(super) fn greedy(pb: &Problem) -> Option<Vec<usize>> {
    let size = pb.size;
    let n = pb.n;
    let m = size;
    let d = pb.dist;
    let full_scan = (pb.csr.nnz() as f64 + n as f64) * (size as f64) <= 3e7;
    if !full_scan && pb.near.is_none() {
        return None;
    }
    // Centrality of locations (row + column sums), most central first.
    let mut central: Vec<usize> = (0..m).collect();
    let cent: Vec<f64> = if (m as f64) * (m as f64) <= 6.4e7 {
        (0..m)
            .map(|l| d[l * m..(l + 1) * m].iter().sum::<f64>())
            .collect()
    } else {
        vec![0.0; m]
    };
    central.sort_by(|&a, &b| cent[a].total_cmp(&cent[b]).then(a.cmp(&b)));
    let mut central_pos = 0usize;

    let mut by_weight: Vec<usize> = (0..n).collect();
    let wdeg: Vec<f64> = (0..n).map(|i| pb.csr.degree_weight(i)).collect();
    by_weight.sort_by(|&a, &b| wdeg[b].total_cmp(&wdeg[a]).then(a.cmp(&b)));
    let mut bw_pos = 0usize;

    let mut p = vec![usize::MAX; size];
    let mut used = vec![false; m];
    let mut conn = vec![0.0f64; n];
    let mut heap: BinaryHeap<Key> = BinaryHeap::new();
    let mut placed = 0usize;
    let mut cost_at = vec![0.0f64; m];
    let mut touched: Vec<usize> = Vec::new();
    while placed < n {
        // Next rank.
        let mut r = usize::MAX;
        while let Some(Key(c, v)) = heap.pop() {
            if p[v] == usize::MAX && c == conn[v] {
                r = v;
                break;
            }
        }
        let loc;
        if r == usize::MAX {
            while p[by_weight[bw_pos]] != usize::MAX {
                bw_pos += 1;
            }
            r = by_weight[bw_pos];
            while used[central[central_pos]] {
                central_pos += 1;
            }
            loc = central[central_pos];
        } else {
            // Cost of r at each candidate location w.r.t. its placed partners.
            let partners = || {
                pb.csr
                    .out_of(r)
                    .iter()
                    .map(|&(j, w)| (j as usize, w, true))
                    .chain(pb.csr.in_of(r).iter().map(|&(j, w)| (j as usize, w, false)))
                    .filter(|&(j, _, _)| j != r && p[j] != usize::MAX)
            };
            let mut best_l = usize::MAX;
            let mut best_c = f64::INFINITY;
            if full_scan {
                cost_at[..m].fill(0.0);
                for (j, w, outgoing) in partners() {
                    let pj = p[j];
                    if outgoing {
                        let row = &d[pj..];
                        for l in 0..m {
                            cost_at[l] += w * row[l * m];
                        }
                    } else {
                        let row = &d[pj * m..(pj + 1) * m];
                        for l in 0..m {
                            cost_at[l] += w * row[l];
                        }
                    }
                }
                for l in 0..m {
                    if !used[l] && cost_at[l] < best_c {
                        best_c = cost_at[l];
                        best_l = l;
                    }
                }
            } else {
                let near = pb.near.as_ref().expect("checked above");
                touched.clear();
                for (j, _, _) in partners() {
                    let pj = p[j];
                    for &l in near.of(pj) {
                        if !used[l as usize] {
                            touched.push(l as usize);
                        }
                    }
                }
                touched.sort_unstable();
                touched.dedup();
                for &l in &touched {
                    let mut c = 0.0;
                    for (j, w, outgoing) in partners() {
                        c += if outgoing {
                            w * d[l * m + p[j]]
                        } else {
                            w * d[p[j] * m + l]
                        };
                    }
                    if c < best_c {
                        best_c = c;
                        best_l = l;
                    }
                }
            }
            if best_l == usize::MAX {
                while used[central[central_pos]] {
                    central_pos += 1;
                }
                best_l = central[central_pos];
            }
            loc = best_l;
        }
        p[r] = loc;
        used[loc] = true;
        placed += 1;
        for &(j, w) in pb.csr.out_of(r).iter().chain(pb.csr.in_of(r)) {
            let j = j as usize;
            if j != r && p[j] == usize::MAX {
                conn[j] += w.abs();
                heap.push(Key(conn[j], j));
            }
        }
    }
    fill_dummies(&mut p, n);
    Some(p)
}
