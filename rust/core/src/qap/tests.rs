//! Unit tests of the QAP core.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::model::{FlowCsr, Problem};
use super::*;

fn opts(seed: u64, iters: Option<u64>) -> QapOptions {
    QapOptions {
        time_limit: Duration::from_secs(30),
        seed,
        threads: 1,
        initial: None,
        max_iterations: iters,
    }
}

fn random_matrix(rng: &mut ChaCha8Rng, n: usize, sym: bool, zero_diag: bool) -> Vec<f64> {
    let mut a = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            if sym && j < i {
                a[i * n + j] = a[j * n + i];
            } else if !(zero_diag && i == j) {
                a[i * n + j] = rng.gen_range(0..20) as f64;
            }
        }
    }
    a
}

/// Minimum cost over all injections of n ranks into m locations (tiny sizes only).
fn brute_force(t: &Traffic, d: &[f64], m: usize) -> f64 {
    fn rec(
        t: &Traffic,
        d: &[f64],
        m: usize,
        perm: &mut Vec<usize>,
        used: &mut Vec<bool>,
        best: &mut f64,
    ) {
        if perm.len() == t.n() {
            *best = best.min(qap_cost(t, d, m, perm));
            return;
        }
        for l in 0..m {
            if !used[l] {
                used[l] = true;
                perm.push(l);
                rec(t, d, m, perm, used, best);
                perm.pop();
                used[l] = false;
            }
        }
    }
    let mut best = f64::INFINITY;
    rec(t, d, m, &mut Vec::new(), &mut vec![false; m], &mut best);
    best
}

fn to_sparse(n: usize, a: &[f64]) -> Traffic {
    let mut edges = Vec::new();
    for i in 0..n {
        for j in 0..n {
            if a[i * n + j] != 0.0 {
                edges.push((i as u32, j as u32, a[i * n + j]));
            }
        }
    }
    Traffic::Sparse { n, edges }
}

/// Megatron-style job: tp 8, pp 4, dp 16, r = tp_i + 8*(dp_i + 16*pp_i); 8 GPUs/node,
/// 4 nodes/rack, 16 racks. Returns (traffic, distance, optimal cost).
fn megatron() -> (usize, Vec<f64>, Vec<f64>, f64) {
    let (tp, pp, dp) = (8usize, 4usize, 16usize);
    let n = tp * pp * dp;
    let rank = |t: usize, d: usize, p: usize| t + tp * (d + dp * p);
    let mut a = vec![0.0; n * n];
    for p in 0..pp {
        for d in 0..dp {
            for t in 0..tp {
                let r = rank(t, d, p);
                for t2 in 0..tp {
                    if t2 != t {
                        a[r * n + rank(t2, d, p)] = 1000.0;
                    }
                }
                if p + 1 < pp {
                    let s = rank(t, d, p + 1);
                    a[r * n + s] = 100.0;
                    a[s * n + r] = 100.0;
                }
                let s = rank(t, (d + 1) % dp, p);
                a[r * n + s] = 10.0;
                a[s * n + r] = 10.0;
            }
        }
    }
    let mut b = vec![0.0; n * n];
    for x in 0..n {
        for y in 0..n {
            b[x * n + y] = if x == y {
                0.0
            } else if x / 8 == y / 8 {
                1.0
            } else if x / 32 == y / 32 {
                10.0
            } else {
                100.0
            };
        }
    }
    let mut perm = vec![0; n];
    for p in 0..pp {
        for d in 0..dp {
            for t in 0..tp {
                perm[rank(t, d, p)] = 32 * d + 8 * p + t;
            }
        }
    }
    let opt = qap_cost(
        &Traffic::Dense {
            n,
            values: a.clone(),
        },
        &b,
        n,
        &perm,
    );
    (n, a, b, opt)
}

fn relabel(n: usize, a: &[f64], rng: &mut ChaCha8Rng) -> Vec<f64> {
    let mut sigma: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        sigma.swap(i, rng.gen_range(0..=i));
    }
    let mut a2 = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            a2[sigma[i] * n + sigma[j]] = a[i * n + j];
        }
    }
    a2
}

#[test]
fn cost_of_known_permutation() {
    // traffic: 0->1: 2, 1->2: 3, 2->0: 5 ; distance on 3 locations.
    let t = Traffic::Dense {
        n: 3,
        values: vec![0., 2., 0., 0., 0., 3., 5., 0., 0.],
    };
    let d = vec![0., 1., 4., 1., 0., 2., 4., 2., 0.];
    // p = [2, 0, 1]: 2*d[2][0] + 3*d[0][1] + 5*d[1][2] = 8 + 3 + 10
    assert_eq!(qap_cost(&t, &d, 3, &[2, 0, 1]), 21.0);
    assert_eq!(qap_cost(&t, &d, 3, &[0, 1, 2]), 2.0 + 6.0 + 20.0);
    let s = Traffic::Sparse {
        n: 3,
        edges: vec![(0, 1, 2.), (1, 2, 1.), (2, 0, 5.), (1, 2, 2.)],
    };
    assert_eq!(qap_cost(&s, &d, 3, &[2, 0, 1]), 21.0);
    // invalid permutations give NaN, not a panic
    assert!(qap_cost(&t, &d, 3, &[0, 0, 1]).is_nan());
    assert!(qap_cost(&t, &d, 3, &[0, 1]).is_nan());
    assert!(qap_cost(&t, &d, 3, &[0, 1, 7]).is_nan());
    assert!(qap_cost(&t, &d[..8], 3, &[0, 1, 2]).is_nan());
    // n < m
    assert_eq!(qap_cost(&t, &[0.0; 16], 4, &[3, 0, 1]), 0.0);
}

#[test]
fn finds_brute_force_optimum_small() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for case in 0..12 {
        let n = 5 + case % 3;
        let sym = case % 2 == 0;
        let a = random_matrix(&mut rng, n, sym, case % 4 < 2);
        let b = random_matrix(&mut rng, n, sym && case % 3 != 0, true);
        let t = Traffic::Dense { n, values: a };
        let opt = brute_force(&t, &b, n);
        let r = map_ranks(&t, &b, n, &opts(case as u64, Some(2000))).unwrap();
        assert_eq!(r.cost, opt, "case {case}");
        assert_eq!(r.cost, qap_cost(&t, &b, n, &r.perm));
    }
}

#[test]
fn padding_fewer_ranks_than_locations() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for case in 0..4 {
        let (n, m) = (4 + case % 2, 7);
        let a = random_matrix(&mut rng, n, case % 2 == 0, true);
        let b = random_matrix(&mut rng, m, case < 2, true);
        let t = Traffic::Dense {
            n,
            values: a.clone(),
        };
        let opt = brute_force(&t, &b, m);
        let r = map_ranks(&t, &b, m, &opts(1, Some(3000))).unwrap();
        assert_eq!(r.perm.len(), n);
        let mut seen = vec![false; m];
        for &l in &r.perm {
            assert!(l < m && !seen[l]);
            seen[l] = true;
        }
        assert_eq!(r.cost, opt, "case {case}");
        let rs = map_ranks(&to_sparse(n, &a), &b, m, &opts(1, Some(3000))).unwrap();
        assert_eq!(rs.cost, opt, "sparse case {case}");
    }
}

#[test]
fn never_worse_than_initial() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let n = 20;
    let a = random_matrix(&mut rng, n, true, true);
    let b = random_matrix(&mut rng, n, true, true);
    let t = Traffic::Dense { n, values: a };
    // A very good initial: the result of a long run; a short run must not return worse.
    let good = map_ranks(&t, &b, n, &opts(5, Some(20000))).unwrap();
    for iters in [0, 1, 5] {
        let mut o = opts(9, Some(iters));
        o.initial = Some(good.perm.clone());
        let r = map_ranks(&t, &b, n, &o).unwrap();
        assert!(r.cost <= good.cost, "{} > {}", r.cost, good.cost);
    }
    // A zero time limit still returns a valid mapping no worse than initial.
    let mut o = opts(9, None);
    o.time_limit = Duration::ZERO;
    o.initial = Some(good.perm.clone());
    let r = map_ranks(&t, &b, n, &o).unwrap();
    assert!(r.cost <= good.cost);
    assert_eq!(r.cost, qap_cost(&t, &b, n, &r.perm));
}

#[test]
fn deterministic_for_seed() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let n = 25;
    let a = random_matrix(&mut rng, n, false, false);
    let b = random_matrix(&mut rng, n, true, true);
    let t = Traffic::Dense {
        n,
        values: a.clone(),
    };
    for threads in [1, 2] {
        let mut o = opts(42, Some(3000));
        o.threads = threads;
        let r1 = map_ranks(&t, &b, n, &o).unwrap();
        let r2 = map_ranks(&t, &b, n, &o).unwrap();
        assert_eq!(r1.perm, r2.perm);
        assert_eq!(r1.cost, r2.cost);
        assert_eq!(r1.iterations, r2.iterations);
    }
    // sparse engine too (large sparse ring on a hierarchy)
    let (n, a, b, _) = megatron();
    let t = to_sparse(n, &relabel(n, &a, &mut rng));
    let mut o = opts(3, Some(20));
    o.threads = 2;
    let r1 = map_ranks(&t, &b, n, &o).unwrap();
    let r2 = map_ranks(&t, &b, n, &o).unwrap();
    assert_eq!(r1.perm, r2.perm);
}

#[test]
fn hierarchical_megatron_reaches_optimum_under_relabelling() {
    let (n, a, b, opt) = megatron();
    assert_eq!(opt, 5_376_000.0);
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    for rep in 0..3 {
        let a2 = relabel(n, &a, &mut rng);
        let dense = Traffic::Dense {
            n,
            values: a2.clone(),
        };
        let r = map_ranks(&dense, &b, n, &opts(rep, Some(5))).unwrap();
        assert_eq!(r.cost, opt, "dense rep {rep}");
        let sparse = to_sparse(n, &a2);
        let r = map_ranks(&sparse, &b, n, &opts(rep, Some(5))).unwrap();
        assert_eq!(r.cost, opt, "sparse rep {rep}");
    }
}

#[test]
fn hierarchical_with_spare_locations() {
    // Same job on 20 racks (640 GPUs): still optimal, extra locations empty.
    let (n, a, _, opt) = megatron();
    let m = 640;
    let mut b = vec![0.0; m * m];
    for x in 0..m {
        for y in 0..m {
            b[x * m + y] = if x == y {
                0.0
            } else if x / 8 == y / 8 {
                1.0
            } else if x / 32 == y / 32 {
                10.0
            } else {
                100.0
            };
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let t = to_sparse(n, &relabel(n, &a, &mut rng));
    let r = map_ranks(&t, &b, m, &opts(0, Some(5))).unwrap();
    assert_eq!(r.cost, opt);
}

#[test]
fn sparse_equals_dense() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    for case in 0..6 {
        let n = 6 + case % 2;
        let mut a = random_matrix(&mut rng, n, case % 2 == 0, true);
        for v in a.iter_mut() {
            if rng.gen_bool(0.5) {
                *v = 0.0;
            }
        }
        let b = random_matrix(&mut rng, n, true, true);
        let dense = Traffic::Dense {
            n,
            values: a.clone(),
        };
        let sparse = to_sparse(n, &a);
        let opt = brute_force(&dense, &b, n);
        let rd = map_ranks(&dense, &b, n, &opts(case as u64, Some(3000))).unwrap();
        let rs = map_ranks(&sparse, &b, n, &opts(case as u64, Some(3000))).unwrap();
        assert_eq!(rd.cost, opt);
        assert_eq!(rs.cost, opt);
        assert_eq!(qap_cost(&sparse, &b, n, &rd.perm), rd.cost);
    }
}

#[test]
fn delta_formulas_match_recomputation() {
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    for &(sym_a, sym_b) in &[(false, false), (true, true), (true, false), (false, true)] {
        let n = 9;
        let a = random_matrix(&mut rng, n, sym_a, false);
        let b = random_matrix(&mut rng, n, sym_b, false);
        let t = Traffic::Dense { n, values: a };
        let csr = FlowCsr::from_traffic(&t, n);
        let pb = Problem::new(n, n, &b, csr);
        let dm = pb.dense.as_ref().unwrap();
        let mut p: Vec<usize> = (0..n).collect();
        for _ in 0..30 {
            let r = rng.gen_range(0..n);
            let s = (r + rng.gen_range(1..n)) % n;
            let before = pb.cost(&p);
            let dfull = super::rots::full_delta(dm, &p, r, s);
            let dsparse = pb.sparse_delta(&p, r, s);
            p.swap(r, s);
            let after = pb.cost(&p);
            assert_eq!(dfull, after - before);
            assert_eq!(dsparse, after - before);
            assert_eq!(super::rots::dense_cost(dm, &p), after);
        }
        // RoTS keeps its incremental delta matrix exact (checked through iterations).
        let t2 = Traffic::Dense {
            n,
            values: random_matrix(&mut rng, n, sym_a, false),
        };
        let r = map_ranks(&t2, &b, n, &opts(1, Some(5000))).unwrap();
        assert_eq!(r.cost, brute_force(&t2, &b, n));
    }
}

#[test]
fn non_integer_and_negative_inputs() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let n = 7;
    let a: Vec<f64> = (0..n * n).map(|_| rng.gen_range(-1.0..3.0)).collect();
    let b: Vec<f64> = (0..n * n).map(|_| rng.gen_range(0.0..2.5)).collect();
    let t = Traffic::Dense { n, values: a };
    let opt = brute_force(&t, &b, n);
    let r = map_ranks(&t, &b, n, &opts(0, Some(3000))).unwrap();
    assert!(
        (r.cost - opt).abs() <= 1e-9 * opt.abs().max(1.0),
        "{} vs {opt}",
        r.cost
    );
}

#[test]
fn hierarchy_detection() {
    use super::hier::Hierarchy;
    // Uneven blocks: node sizes 3, 2, 4; two racks {0,1} {2}.
    let groups = [0usize, 0, 0, 1, 1, 2, 2, 2, 2];
    let rack = |g: usize| if g < 2 { 0 } else { 1 };
    let m = groups.len();
    let mut d = vec![0.0; m * m];
    for x in 0..m {
        for y in 0..m {
            if x != y {
                d[x * m + y] = if groups[x] == groups[y] {
                    1.0
                } else if rack(groups[x]) == rack(groups[y]) {
                    5.0
                } else {
                    20.0
                };
            }
        }
    }
    let h = Hierarchy::detect(&d, m).expect("ultrametric");
    assert_eq!(h.nodes[0].children.len(), 2);
    // Break ultrametricity: not hierarchical.
    d[1] = 30.0;
    d[m] = 30.0;
    assert!(Hierarchy::detect(&d, m).is_none());
    // A line metric is not hierarchical.
    let line: Vec<f64> = (0..16)
        .map(|k| ((k / 4) as f64 - (k % 4) as f64).abs())
        .collect();
    assert!(Hierarchy::detect(&line, 4).is_none());
}

#[test]
fn validation_errors() {
    let d4 = vec![0.0; 16];
    let t = Traffic::Dense {
        n: 2,
        values: vec![0.0; 4],
    };
    let o = opts(0, Some(10));
    assert!(matches!(
        map_ranks(
            &Traffic::Dense {
                n: 2,
                values: vec![0.0; 3]
            },
            &d4,
            4,
            &o
        ),
        Err(QapError::TrafficShape { .. })
    ));
    assert!(matches!(
        map_ranks(&t, &d4[..15], 4, &o),
        Err(QapError::DistanceShape { .. })
    ));
    assert!(matches!(
        map_ranks(
            &Traffic::Dense {
                n: 2,
                values: vec![0.0, f64::NAN, 0.0, 0.0]
            },
            &d4,
            4,
            &o
        ),
        Err(QapError::TrafficNotFinite { row: 0, col: 1, .. })
    ));
    let mut dinf = d4.clone();
    dinf[6] = f64::INFINITY;
    assert!(matches!(
        map_ranks(&t, &dinf, 4, &o),
        Err(QapError::DistanceNotFinite { row: 1, col: 2, .. })
    ));
    assert!(matches!(
        map_ranks(
            &Traffic::Sparse {
                n: 2,
                edges: vec![(0, 2, 1.0)]
            },
            &d4,
            4,
            &o
        ),
        Err(QapError::EdgeOutOfRange { .. })
    ));
    assert!(matches!(
        map_ranks(
            &Traffic::Sparse {
                n: 2,
                edges: vec![(0, 1, f64::NAN)]
            },
            &d4,
            4,
            &o
        ),
        Err(QapError::TrafficNotFinite { .. })
    ));
    assert!(matches!(
        map_ranks(
            &Traffic::Dense {
                n: 3,
                values: vec![0.0; 9]
            },
            &[0.0; 4],
            2,
            &o
        ),
        Err(QapError::TooManyRanks { n: 3, m: 2 })
    ));
    let mut bad = o.clone();
    bad.threads = 0;
    assert_eq!(map_ranks(&t, &d4, 4, &bad), Err(QapError::ZeroThreads));
    for (init, want) in [
        (vec![0], "length"),
        (vec![0, 4], "only 4 locations"),
        (vec![1, 1], "not a permutation"),
    ] {
        let mut b = o.clone();
        b.initial = Some(init);
        let e = map_ranks(&t, &d4, 4, &b).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
    // Degenerate sizes.
    let r = map_ranks(
        &Traffic::Dense {
            n: 0,
            values: vec![],
        },
        &[],
        0,
        &o,
    )
    .unwrap();
    assert!(r.perm.is_empty());
    let r = map_ranks(
        &Traffic::Dense {
            n: 1,
            values: vec![3.0],
        },
        &[2.0],
        1,
        &o,
    )
    .unwrap();
    assert_eq!((r.perm, r.cost), (vec![0], 6.0));
    let r = map_ranks(
        &Traffic::Sparse {
            n: 0,
            edges: vec![],
        },
        &d4,
        4,
        &o,
    )
    .unwrap();
    assert!(r.perm.is_empty());
    let r = map_ranks(
        &Traffic::Dense {
            n: 1,
            values: vec![1.0],
        },
        &[0.0, 1.0, 1.0, 5.0],
        2,
        &o,
    )
    .unwrap();
    assert_eq!((r.perm, r.cost), (vec![0], 0.0));
}

#[test]
fn sparse_large_ring_improves() {
    // A 2000-rank ring on a 2000-location line: sparse engine, non-hierarchical distance.
    let n = 2000;
    let mut edges = Vec::new();
    for i in 0..n {
        edges.push((i as u32, ((i + 1) % n) as u32, 1.0));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut sigma: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        sigma.swap(i, rng.gen_range(0..=i));
    }
    let edges: Vec<_> = edges
        .into_iter()
        .map(|(a, b, w)| (sigma[a as usize], sigma[b as usize], w))
        .collect();
    let t = Traffic::Sparse { n, edges };
    let d: Vec<f64> = (0..n * n)
        .map(|k| ((k / n) as f64 - (k % n) as f64).abs())
        .collect();
    let mut o = opts(0, None);
    o.time_limit = Duration::from_millis(300);
    let r = map_ranks(&t, &d, n, &o).unwrap();
    let random_cost = qap_cost(&t, &d, n, &(0..n).collect::<Vec<_>>());
    // optimum is 2*(n-1); a random layout costs ~ n*n/3.
    assert!(
        r.cost < random_cost / 20.0,
        "{} vs random {}",
        r.cost,
        random_cost
    );
}
