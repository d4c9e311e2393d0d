//! The Markdown report (`results.md`, and what the bench prints).

use std::fmt::Write as _;

use super::compare::compare_markdown;
use super::format::{fmt_cs, fmt_opt, fmt_rate, fmt_shares, fmt_us, machine, utc_now};
use super::targets::{find, targets};
use super::{Point, Report, pct, sorted};
use crate::config::{Config, Workload};

pub(crate) fn markdown(cfg: &Config, r: &Report, violations: &[String]) -> String {
    let mut s = String::new();
    let m = machine();
    let _ = writeln!(
        s,
        "## lockflight contention bench{} — {}\n",
        if cfg.smoke { " (smoke)" } else { "" },
        utc_now()
    );
    let _ = writeln!(
        s,
        "Machine: {} × {}, {}; {}; {}. P = {} processes, T ∈ {:?}, {:.1} s per point, \
         {} round(s) per point with the modes interleaved (the round with the median \
         throughput is shown; cs/s gives the range over the rounds); worker runtime: {}; \
         total run {:.0} s.\n",
        m["nproc"],
        m["cpu"].as_str().unwrap_or("?"),
        m["mem"].as_str().unwrap_or("?"),
        m["redis_server"].as_str().unwrap_or("?"),
        m["rustc"].as_str().unwrap_or("?"),
        cfg.procs,
        cfg.tasks,
        cfg.secs,
        cfg.repeat,
        if cfg.worker_threads == 0 {
            "current-thread".to_owned()
        } else {
            format!("multi-thread, {} workers", cfg.worker_threads)
        },
        r.total.as_secs_f64()
    );
    if violations.is_empty() {
        let _ = writeln!(
            s,
            "Correctness: every point passed (counter = critical sections, fencing tokens \
             strictly increasing in critical-section order across processes, no lease lost, \
             no timeout, no lock key or slot left).\n"
        );
    } else {
        let _ = writeln!(s, "**CORRECTNESS VIOLATIONS:**\n");
        for v in violations {
            let _ = writeln!(s, "- {v}");
        }
        s.push('\n');
    }

    if !r.compare.is_empty() {
        compare_markdown(&mut s, r);
    }

    let _ = writeln!(s, "### Targets\n");
    let _ = writeln!(s, "| target | goal | measured | met |\n|---|---|---|---|");
    for t in targets(cfg, r) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            t.name,
            t.goal,
            t.measured,
            match t.met {
                Some(true) => "met",
                Some(false) => "**not met**",
                None => "—",
            }
        );
    }
    s.push('\n');

    for &w in &cfg.workloads {
        let _ = writeln!(s, "### {}\n", w.name());
        let _ = writeln!(
            s,
            "| mode | P×T | cs/s | wait p50 | wait p99 | wait max | lock req/cs (acq/rel/renew/leave) | \
             server lock cmds/cs | server scripts/cs | handoffs/cs | per-process share |"
        );
        let _ = writeln!(s, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|");
        for &t in &cfg.tasks {
            for &mode in &cfg.modes {
                let Some(p) = find(&r.points, w, mode, t) else {
                    continue;
                };
                let per = |n: u64| n as f64 / p.sections.max(1) as f64;
                let _ = writeln!(
                    s,
                    "| {} | {}×{} | {} | {} | {} | {} | {:.3} ({:.2}/{:.2}/{:.3}/{:.3}) | {:.2} | {:.3} | {:.3} | {} |",
                    mode.name(),
                    p.procs,
                    p.tasks,
                    fmt_cs(p),
                    fmt_us(p.wait_p50_us as i64),
                    fmt_us(p.wait_p99_us as i64),
                    fmt_us(p.wait_max_us as i64),
                    p.requests_per_cs(),
                    per(p.requests[0]),
                    per(p.requests[1]),
                    per(p.requests[2]),
                    per(p.requests[3]),
                    p.server_lock_per_cs(),
                    per(p.server_scripts()),
                    per(p.handoffs),
                    fmt_shares(&p.shares()),
                );
            }
        }
        s.push('\n');
    }

    busy_markdown(&mut s, r);

    let t = cfg.tasks.iter().copied().max().unwrap_or(1);
    let w = Workload::HotkeyRmw;
    let cols: Vec<&Point> = cfg
        .modes
        .iter()
        .filter_map(|&m| find(&r.points, w, m, t))
        .collect();
    if !cols.is_empty() {
        let _ = writeln!(
            s,
            "### Server-side commands per critical section ({}, P={}, T={t}; `INFO commandstats` \
             delta, commands run inside scripts included)\n",
            w.name(),
            cfg.procs
        );
        let mut names: Vec<String> = Vec::new();
        for p in &cols {
            for (n, _) in p.server_breakdown() {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        let _ = write!(s, "| command |");
        for p in &cols {
            let _ = write!(s, " {} |", p.mode.name());
        }
        let _ = write!(s, "\n|---|");
        for _ in &cols {
            let _ = write!(s, "--:|");
        }
        s.push('\n');
        for n in &names {
            let _ = write!(s, "| {n} |");
            for p in &cols {
                let v = p
                    .server_breakdown()
                    .into_iter()
                    .find(|(m, _)| m == n)
                    .map_or(0.0, |(_, v)| v);
                let _ = write!(s, " {v:.3} |");
            }
            s.push('\n');
        }
        s.push('\n');
    }

    let wake = sorted(&r.wake.wake_us);
    let ping = sorted(&r.wake.ping_us);
    let _ = writeln!(s, "### Wake-up after a remote release\n");
    let _ = writeln!(
        s,
        "Two Lockers on two RedisBackends (two pub/sub connections) in one process: A holds, \
         B waits in `lock()` (queued at Redis), A releases; B's `lock()` return minus A's \
         `release()` completion, {} repetitions.\n",
        r.wake.reps
    );
    let _ = writeln!(s, "| | p50 | p99 | max |\n|---|--:|--:|--:|");
    let _ = writeln!(
        s,
        "| wake-up | {} | {} | {} |",
        fmt_us(pct(&wake, 0.5)),
        fmt_us(pct(&wake, 0.99)),
        fmt_us(wake.last().copied().unwrap_or(0))
    );
    let _ = writeln!(
        s,
        "| PING round trip | {} | {} | {} |\n",
        fmt_us(pct(&ping, 0.5)),
        fmt_us(pct(&ping, 0.99)),
        fmt_us(ping.last().copied().unwrap_or(0))
    );
    let _ = writeln!(
        s,
        "B sent {:.2} acquire requests per wait (one that queued, one that won).\n",
        r.wake.b_requests_per_rep
    );

    let _ = writeln!(s, "### Uncontended lock + release (Redis)\n");
    let _ = writeln!(
        s,
        "| mode | round trips (min..max) | server commands / pair | latency p50 | p99 |\n|---|--:|--:|--:|--:|"
    );
    for u in &r.uncontended {
        let l = sorted(&u.latency_us);
        let _ = writeln!(
            s,
            "| {} | {}..{} | {:.1} | {} | {} |",
            u.mode.name(),
            u.min_requests,
            u.max_requests,
            u.server_per_pair,
            fmt_us(pct(&l, 0.5)),
            fmt_us(pct(&l, 0.99))
        );
    }
    if let Some(rows) = &r.topology {
        let _ = writeln!(s, "\n### Topologies (issue #22 target 3)\n");
        s.push_str(&crate::topology::markdown(rows, cfg.secs));
    }
    s
}

/// How busy the hot key was: efficiency, transfers between processes, idle time per
/// transfer, for every hot-key point (the comparison matrix's, then the per-workload
/// matrix's).
fn busy_markdown(s: &mut String, r: &Report) {
    let hot: Vec<&Point> = r
        .compare
        .iter()
        .chain(&r.points)
        .filter(|p| p.efficiency.is_some())
        .collect();
    if hot.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "### How busy the hot key is
"
    );
    let _ = writeln!(
        s,
        "Of the round shown (sections/s is that round's). Efficiency = the critical sections' \
         own time (GET + SET of the counter, and the 1 ms hold; timed in the workers) / \
         the point's elapsed time: 1.00 = the key is never idle. Transfers = consecutive \
         critical sections (in counter order) run by two different processes. Idle per \
         transfer = the mean time from a section's end to the next section's start when \
         another process runs it (the workers' clocks are the machine's); idle per turn = \
         the same when the same process runs it. One-way = a section's mean time (less the \
         hold) / 4, as the sections are two round trips; ÷ bound = idle per transfer / two \
         one-way delays, the two messages a transfer needs.\n"
    );
    let _ = writeln!(
        s,
        "| workload | mode | P×T | sections/s | efficiency | transfers/s | idle µs per transfer | idle µs per turn | one-way µs | ÷ bound |\n\
         |---|---|---|--:|--:|--:|--:|--:|--:|--:|"
    );
    for p in hot {
        let _ = writeln!(
            s,
            "| {} | {} | {}×{} | {} | {} | {} | {} | {} | {} | {} |",
            p.workload.name(),
            p.mode.name(),
            p.procs,
            p.tasks,
            fmt_rate(p.throughput),
            fmt_opt(p.efficiency, |e| format!("{e:.2}")),
            fmt_opt(p.transfers_per_s, fmt_rate),
            fmt_opt(p.idle_us_per_transfer, |us| format!("{us:.1}")),
            fmt_opt(p.idle_us_per_turn, |us| format!("{us:.1}")),
            fmt_opt(p.one_way_us, |us| format!("{us:.1}")),
            fmt_opt(p.transfer_vs_bound(), |r| format!("{r:.2}")),
        );
    }
    s.push('\n');
}
