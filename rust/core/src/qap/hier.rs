//! Hierarchy detection in a distance matrix, and hierarchy-aware construction.
//!
//! A symmetric distance matrix is *ultrametric* when `d(a,c) <= max(d(a,b), d(b,c))` for all
//! locations. Then, for every threshold t, "distance < t" is an equivalence relation and the
//! classes nest into a tree (GPUs in a node, nodes in a rack, ...) in which the distance of two
//! locations depends only on their lowest common block. The tree is recovered top-down: a block
//! whose largest inner distance is `level` splits into the classes of "distance < level".

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::model::FlowCsr;

#[derive(Debug, Clone)]
pub(super) struct Node {
    /// Range of `Hierarchy::order` holding this block's locations.
    pub start: usize,
    pub end: usize,
    pub children: Vec<usize>,
}

impl Node {
    pub fn len(&self) -> usize {
        self.end - self.start
    }
}

#[derive(Debug, Clone)]
pub(super) struct Hierarchy {
    /// Locations in tree order: every block is a contiguous range.
    pub order: Vec<usize>,
    /// Node 0 is the root (all locations).
    pub nodes: Vec<Node>,
    /// For each location, the smallest block with at least two locations that contains it.
    pub leaf_block: Vec<usize>,
}

impl Hierarchy {
    /// Recover the hierarchy tree, or None when the matrix is not (symmetric) ultrametric
    /// or has fewer than two levels of blocks worth exploiting.
    pub fn detect(d: &[f64], m: usize) -> Option<Hierarchy> {
        if m < 3 {
            return None;
        }
        for i in 0..m {
            for j in i + 1..m {
                if d[i * m + j] != d[j * m + i] {
                    return None;
                }
            }
        }
        let mut order: Vec<usize> = (0..m).collect();
        let mut nodes = vec![Node {
            start: 0,
            end: m,
            children: Vec::new(),
        }];
        // (node index, level of the parent block: inner distances must be strictly below it)
        let mut stack: Vec<(usize, f64)> = vec![(0, f64::INFINITY)];
        while let Some((id, parent_level)) = stack.pop() {
            let (st, en) = (nodes[id].start, nodes[id].end);
            if en - st < 2 {
                continue;
            }
            let mut level = f64::NEG_INFINITY;
            for x in st..en {
                let row = &d[order[x] * m..(order[x] + 1) * m];
                for y in x + 1..en {
                    level = level.max(row[order[y]]);
                }
            }
            // NaN-safe: anything but a level strictly below the parent's ends the detection.
            if level.partial_cmp(&parent_level) != Some(std::cmp::Ordering::Less) {
                return None;
            }
            // Split into classes of "distance < level".
            let mut blocks: Vec<(usize, usize)> = Vec::new();
            let mut cur = st;
            while cur < en {
                let a = order[cur];
                let bs = cur;
                cur += 1;
                // Partition order[cur..en]: members of a's class move to the front.
                let first_unsorted = cur;
                for k in first_unsorted..en {
                    if d[a * m + order[k]] < level {
                        order.swap(cur, k);
                        cur += 1;
                    }
                }
                blocks.push((bs, cur));
            }
            if blocks.len() < 2 {
                return None;
            }
            // Cross-block distances must all equal the level.
            for (bi, &(s1, e1)) in blocks.iter().enumerate() {
                for &(s2, e2) in &blocks[bi + 1..] {
                    for x in s1..e1 {
                        let row = &d[order[x] * m..(order[x] + 1) * m];
                        for y in s2..e2 {
                            if row[order[y]] != level {
                                return None;
                            }
                        }
                    }
                }
            }
            for (s, e) in blocks {
                let cid = nodes.len();
                nodes.push(Node {
                    start: s,
                    end: e,
                    children: Vec::new(),
                });
                nodes[id].children.push(cid);
                stack.push((cid, level));
            }
        }
        let mut leaf_block = vec![0usize; m];
        // Parents appear before children in `nodes`, so later (smaller) blocks overwrite.
        for (id, node) in nodes.iter().enumerate() {
            if node.len() >= 2 {
                for x in node.start..node.end {
                    leaf_block[order[x]] = id;
                }
            }
        }
        let h = Hierarchy {
            order,
            nodes,
            leaf_block,
        };
        // A single level (all off-diagonal distances equal) carries no structure to exploit.
        if h.nodes[0].children.iter().all(|&c| h.nodes[c].len() == 1) {
            return None;
        }
        Some(h)
    }

    /// Top-down construction: split the ranks among the children of each block by heavy-edge
    /// region growing. `randomize` shuffles tie-breaking (for the extra searches of a multi-start).
    /// Returns a full permutation of `size` (dummy ranks `n..size` fill the empty locations).
    pub fn construct(&self, csr: &FlowCsr, n: usize, rng: Option<&mut ChaCha8Rng>) -> Vec<usize> {
        let size = csr.size;
        // Tie-break priority: lower wins.
        let prio: Vec<u64> = match rng {
            Some(r) => (0..size).map(|_| r.gen::<u64>()).collect(),
            None => (0..size as u64).collect(),
        };
        let mut p = vec![usize::MAX; size];
        let mut mark = vec![usize::MAX; size]; // node id whose rank set contains v
        let mut group = vec![usize::MAX; size]; // child index within the current node
        let mut int_w = vec![0.0f64; size];
        let mut out_w = vec![0.0f64; size];
        let mut tot_w = vec![0.0f64; size];
        let mut in_front = vec![false; size];

        let mut stack: Vec<(usize, Vec<usize>)> = vec![(0, (0..n).collect())];
        while let Some((id, ranks)) = stack.pop() {
            let node = &self.nodes[id];
            if ranks.is_empty() {
                continue;
            }
            if node.children.is_empty() {
                // Leaf: exactly one location.
                p[ranks[0]] = self.order[node.start];
                continue;
            }
            for &v in &ranks {
                mark[v] = id;
                group[v] = usize::MAX;
                int_w[v] = 0.0;
                out_w[v] = 0.0;
                in_front[v] = false;
            }
            for &v in &ranks {
                let mut t = 0.0;
                for &(u, w) in csr.out_of(v).iter().chain(csr.in_of(v)) {
                    let u = u as usize;
                    if u != v && mark[u] == id {
                        t += w;
                    }
                }
                tot_w[v] = t;
            }
            // Children by capacity, largest first (ties: tree order).
            let mut kids: Vec<usize> = node.children.clone();
            kids.sort_by_key(|&c| std::cmp::Reverse(self.nodes[c].len()));
            let mut remaining = ranks.len();
            let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
            for (gi, &c) in kids.iter().enumerate() {
                if remaining == 0 {
                    break;
                }
                let target = self.nodes[c].len().min(remaining);
                remaining -= target;
                let mut region: Vec<usize> = Vec::with_capacity(target);
                if remaining == 0 {
                    // Last group takes every rank left.
                    region.extend(ranks.iter().copied().filter(|&v| group[v] == usize::MAX));
                    for &v in &region {
                        group[v] = gi;
                    }
                    groups.push((c, region));
                    break;
                }
                let mut frontier: Vec<usize> = Vec::new();
                while region.len() < target {
                    // Best frontier rank: max of cut gain 2*int + out - tot, ties by prio.
                    let key = |v: usize| 2.0 * int_w[v] + out_w[v] - tot_w[v];
                    let mut pick = usize::MAX;
                    frontier.retain(|&v| group[v] == usize::MAX);
                    for &v in &frontier {
                        if pick == usize::MAX
                            || key(v) > key(pick)
                            || (key(v) == key(pick) && prio[v] < prio[pick])
                        {
                            pick = v;
                        }
                    }
                    if pick == usize::MAX {
                        // New seed: the free rank least tied to the rest (peripheral).
                        for &v in &ranks {
                            if group[v] != usize::MAX {
                                continue;
                            }
                            if pick == usize::MAX
                                || key(v) > key(pick)
                                || (key(v) == key(pick) && prio[v] < prio[pick])
                            {
                                pick = v;
                            }
                        }
                    }
                    let v = pick;
                    group[v] = gi;
                    region.push(v);
                    for &(u, w) in csr.out_of(v).iter().chain(csr.in_of(v)) {
                        let u = u as usize;
                        if u != v && mark[u] == id && group[u] == usize::MAX {
                            int_w[u] += w;
                            if !in_front[u] {
                                in_front[u] = true;
                                frontier.push(u);
                            }
                        }
                    }
                }
                for &u in &frontier {
                    out_w[u] += int_w[u];
                    int_w[u] = 0.0;
                    in_front[u] = false;
                }
                groups.push((c, region));
            }
            for (c, g) in groups {
                stack.push((c, g));
            }
        }
        fill_dummies(&mut p, n);
        p
    }
}

/// Give the dummy ranks `n..size` the locations no real rank took.
pub(super) fn fill_dummies(p: &mut [usize], n: usize) {
    let size = p.len();
    let mut used = vec![false; size];
    for &l in &p[..n] {
        used[l] = true;
    }
    let mut free = (0..size).filter(|&l| !used[l]);
    for slot in p[n..].iter_mut() {
        *slot = free.next().expect("as many locations as ranks");
    }
}
