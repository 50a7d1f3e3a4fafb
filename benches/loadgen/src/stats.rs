//! Percentiles as the bench computes them (numpy's default), and this process's CPU time.

use std::fs;

/// The `q`-th percentile (0-100) of `values`, as `numpy.percentile` computes it by default
/// ("linear": the value at fractional rank q/100 x (n - 1), interpolated between its two
/// neighbours, with numpy's arithmetic); NaN when `values` is empty. Sorts `values`.
pub fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let quantile = q / 100.0;
    // numpy's _compute_virtual_index with alpha = beta = 1.
    let virtual_index = (n as f64 * quantile + (1.0 - quantile) - 1.0).clamp(0.0, (n - 1) as f64);
    let below = virtual_index.floor();
    let gamma = virtual_index - below;
    let a = values[below as usize];
    let b = values[(below as usize + 1).min(n - 1)];
    // numpy's _lerp: from the nearer end, so the result stays inside [a, b].
    let diff = b - a;
    if gamma >= 0.5 {
        b - diff * (1.0 - gamma)
    } else {
        a + diff * gamma
    }
}

/// User + system CPU seconds of this process (all its threads) so far, from /proc/self/stat.
pub fn own_cpu_seconds() -> Option<f64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    cpu_seconds_from_stat(&stat, clock_ticks_per_second())
}

/// utime + stime (fields 14 and 15 of proc(5), after the parenthesised command name, which may
/// itself hold spaces and parentheses) in seconds.
pub fn cpu_seconds_from_stat(stat: &str, ticks_per_second: f64) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some((user + system) as f64 / ticks_per_second)
}

fn clock_ticks_per_second() -> f64 {
    use std::ffi::{c_int, c_long};
    extern "C" {
        fn sysconf(name: c_int) -> c_long;
    }
    const SC_CLK_TCK: c_int = 2; // <bits/confname.h> on Linux
                                 // SAFETY: sysconf takes an int and returns a long; it reads no memory of ours.
    let ticks = unsafe { sysconf(SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0 // USER_HZ, what Linux reports /proc times in everywhere but Alpha
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_hand() {
        // Ranks q/100 x (n - 1) on 1..=10 (n = 10): p50 at 4.5 -> 5.5; p99 at 8.91 -> 9.91;
        // p90 at 8.1 -> 9.1; p0 and p100 are the ends.
        let values: Vec<f64> = (1..=10).map(f64::from).collect();
        let at = |q: f64| percentile(&mut values.clone(), q);
        assert!((at(50.0) - 5.5).abs() < 1e-12);
        assert!((at(99.0) - 9.91).abs() < 1e-12);
        assert!((at(90.0) - 9.1).abs() < 1e-12);
        assert_eq!(at(0.0), 1.0);
        assert_eq!(at(100.0), 10.0);
    }

    #[test]
    fn percentiles_of_unsorted_uneven_values() {
        // Sorted: 1, 2, 4, 8, 100 (n = 5). p50: rank 2 -> 4. p99: rank 3.96 -> 8 + 0.96 x 92 =
        // 96.32. p25: rank 1 -> 2. p30: rank 1.2 -> 2 + 0.2 x 2 = 2.4.
        let values = [8.0, 100.0, 1.0, 4.0, 2.0];
        let at = |q: f64| percentile(&mut values.to_vec(), q);
        assert_eq!(at(50.0), 4.0);
        assert!((at(99.0) - 96.32).abs() < 1e-9);
        assert_eq!(at(25.0), 2.0);
        assert!((at(30.0) - 2.4).abs() < 1e-12);
    }

    #[test]
    fn percentile_of_one_or_none() {
        assert_eq!(percentile(&mut [3.5], 99.0), 3.5);
        assert!(percentile(&mut [], 50.0).is_nan());
    }

    #[test]
    fn cpu_seconds_read_past_a_command_name_with_spaces() {
        // proc(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
        // cmajflt utime stime ...
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 3";
        assert_eq!(cpu_seconds_from_stat(stat, 100.0), Some(3.0));
        assert_eq!(cpu_seconds_from_stat("4242 (x) S 1", 100.0), None);
        assert!(own_cpu_seconds().is_some_and(|s| s >= 0.0));
    }
}
