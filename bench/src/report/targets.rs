//! The targets table: each goal, what was measured, met or not.

use super::format::{fmt_rate, fmt_shares, fmt_us};
use super::{Point, Report, pct, sorted};
use crate::config::{Config, Mode, Workload};

/// The point of (workload, mode) at matrix T `t`.
pub(super) fn find(points: &[Point], w: Workload, m: Mode, t: usize) -> Option<&Point> {
    points
        .iter()
        .find(|p| p.workload == w && p.mode == m && p.t == t)
}

pub(super) struct Target {
    pub(super) name: String,
    pub(super) goal: String,
    pub(super) measured: String,
    pub(super) met: Option<bool>,
}

pub(super) fn targets(cfg: &Config, r: &Report) -> Vec<Target> {
    let t = cfg.tasks.iter().copied().max().unwrap_or(1);
    let w = Workload::HotkeyRmw;
    let at = format!("P={}, T={t}", cfg.procs);
    let mut out = Vec::new();
    let naive = find(&r.points, w, Mode::Naive, t);
    let naive_txt = naive.map_or(String::new(), |n| {
        format!(" (naive: {:.2})", n.requests_per_cs())
    });
    if let Some(p) = find(&r.points, w, Mode::Coalesced, t) {
        out.push(Target {
            name: format!("Redis requests / critical section, coalesced, {at}"),
            goal: "≤ 3".into(),
            measured: format!(
                "{:.3}{naive_txt}; server-side lock commands/cs {:.1}",
                p.requests_per_cs(),
                p.server_lock_per_cs()
            ),
            met: Some(p.requests_per_cs() <= 3.0),
        });
    }
    if let Some(p) = find(&r.points, w, Mode::Default, t) {
        out.push(Target {
            name: format!("Redis requests / critical section, handoff, {at}"),
            goal: "≤ 0.1".into(),
            measured: format!(
                "{:.3}{naive_txt}; server-side lock commands/cs {:.2}",
                p.requests_per_cs(),
                p.server_lock_per_cs()
            ),
            met: Some(p.requests_per_cs() <= 0.1),
        });
    }
    for wl in [Workload::HotkeyRmw, Workload::HotkeyHold] {
        if let (Some(h), Some(f)) = (
            find(&r.points, wl, Mode::Default, t),
            find(&r.points, wl, Mode::Floor, t),
        ) {
            let ratio = h.throughput / f.throughput.max(1e-9);
            let per_round: Vec<String> = h
                .rounds
                .iter()
                .zip(&f.rounds)
                .map(|(a, b)| format!("{:.0} %", a / b.max(1e-9) * 100.0))
                .collect();
            out.push(Target {
                name: format!("Throughput handoff / in-process floor, {}, {at}", wl.name()),
                goal: "≥ 90 %".into(),
                measured: format!(
                    "{:.0} % (medians {} vs {} cs/s; round by round {})",
                    ratio * 100.0,
                    fmt_rate(h.throughput),
                    fmt_rate(f.throughput),
                    per_round.join(", ")
                ),
                met: Some(ratio >= 0.9),
            });
        }
    }
    let wake = sorted(&r.wake.wake_us);
    let ping = sorted(&r.wake.ping_us);
    if !wake.is_empty() {
        let (w50, p50) = (pct(&wake, 0.5), pct(&ping, 0.5));
        out.push(Target {
            name: "Wake-up after a remote release, p50".into(),
            goal: "≤ 1 loopback RTT + 1 ms".into(),
            measured: format!(
                "{} (p99 {}); PING RTT p50 {} → bound {}",
                fmt_us(w50),
                fmt_us(pct(&wake, 0.99)),
                fmt_us(p50),
                fmt_us(p50 + 1000)
            ),
            met: Some(w50 <= p50 + 1000),
        });
    }
    for u in &r.uncontended {
        out.push(Target {
            name: format!("Uncontended lock + release round trips ({})", u.mode.name()),
            goal: "exactly 2".into(),
            measured: if u.min_requests == u.max_requests {
                format!("{} in each of {} repetitions", u.min_requests, u.reps)
            } else {
                format!(
                    "{}..{} over {} repetitions",
                    u.min_requests, u.max_requests, u.reps
                )
            },
            met: Some(u.min_requests == 2 && u.max_requests == 2),
        });
    }
    out.push(Target {
        name: "Slot-map overhead per uncontended lock/unlock (MemoryBackend)".into(),
        goal: "≤ 1 µs".into(),
        measured: "see `cargo bench -p bench --bench micro`".into(),
        met: None,
    });
    if let Some(p) = find(&r.points, w, Mode::Default, t) {
        let shares = p.shares();
        let ok = shares.iter().all(|s| (0.15..=0.35).contains(s));
        out.push(Target {
            name: format!("Fairness with handoff, {at}"),
            goal: "every process 15–35 %".into(),
            measured: fmt_shares(&shares),
            met: Some(ok && cfg.procs == 4),
        });
    }
    out
}
