//! What a run reports: the measured points and scenarios, the results files
//! (`results.jsonl`, `results.md`, `contention.svg`).

mod chart;
mod compare;
mod format;
mod markdown;
mod targets;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::{Config, Mode, Workload};
use crate::protocol::unix_us;
use chart::chart;
pub(crate) use format::{fmt_shares, fmt_us};
use format::{machine, utc_now};
pub(crate) use markdown::markdown;
use targets::targets;

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    /// The workload.
    pub workload: Workload,
    /// The lock mode.
    pub mode: Mode,
    /// Processes actually run (1 for the floor).
    pub procs: usize,
    /// Tasks per process actually run (P·T for the floor).
    pub tasks: usize,
    /// The T of the matrix this point belongs to.
    pub t: usize,
    /// Critical sections completed (all processes).
    pub sections: u64,
    /// Measured duration, s (the slowest process).
    pub elapsed_s: f64,
    /// Critical sections per second.
    pub throughput: f64,
    /// Lock wait, median, µs.
    pub wait_p50_us: u64,
    /// Lock wait, 99th percentile, µs.
    pub wait_p99_us: u64,
    /// Lock wait, maximum, µs.
    pub wait_max_us: u64,
    /// Client-side requests `[acquire, release, renew, leave]`.
    pub requests: [u64; 4],
    /// Server-side command calls by name (`INFO commandstats` delta, `info` excluded).
    pub server: BTreeMap<String, u64>,
    /// Local lease handoffs (lockflight modes).
    pub handoffs: u64,
    /// Tasks that waited locally behind another task.
    pub local_waits: u64,
    /// Leases acquired from Redis.
    pub acquired: u64,
    /// Critical sections per process.
    pub per_proc: Vec<u64>,
    /// Throughput of every round of this point (the point itself is the median).
    pub rounds: Vec<f64>,
    /// How busy the hot key was: the critical sections' own durations (timed in the
    /// workers around the GET + SET of the counter, and the 1 ms hold of
    /// `hotkey-rmw-hold1ms`; the lock's acquire and release are outside), summed,
    /// over [`elapsed_s`](Self::elapsed_s), the same elapsed time as the throughput
    /// (the slowest process, from the common start instant until all its tasks had
    /// finished; a section started before the end instant is finished and counted).
    /// 1.0: the key was never idle. `None` for `zipf` (many keys).
    pub efficiency: Option<f64>,
    /// Transfers of the hot key's lock between processes (consecutive critical
    /// sections, in counter order, run by two different processes) per second of
    /// [`elapsed_s`](Self::elapsed_s); 0 for one process (the floor). `None` for
    /// `zipf`.
    pub transfers_per_s: Option<f64>,
    /// The hot key's mean idle time at a transfer between processes, µs: from the end
    /// of a critical section to the start of the next one (in counter order) when
    /// another process runs it, both read from the machine's clock in the workers.
    /// The key is held for part of it (the release, the lock's own reply or grant),
    /// but no section runs: it is the time a transfer costs the key. `None` without
    /// a transfer (one process) and for `zipf`.
    pub idle_us_per_transfer: Option<f64>,
    /// The same for the next section in the same process (a handoff, a cached
    /// lease, or the process's own next acquire), µs. `None` without one and for
    /// `zipf`.
    pub idle_us_per_turn: Option<f64>,
    /// The one-way delay between a worker and Redis as the critical sections saw
    /// it, µs: a section's mean duration (less the 1 ms hold of
    /// `hotkey-rmw-hold1ms`) over four, since it is two round trips on the data
    /// connection. A transfer between processes needs two such delays at least
    /// (the release reaching Redis, the grant or the answer reaching the next
    /// holder); [`transfer_vs_bound`](Self::transfer_vs_bound) compares with that.
    /// `None` for `zipf`.
    pub one_way_us: Option<f64>,
}

impl Point {
    /// [`idle_us_per_transfer`](Self::idle_us_per_transfer) over two one-way delays
    /// ([`one_way_us`](Self::one_way_us)): 1.0 means a transfer idles the key no
    /// longer than the two messages it physically needs.
    pub fn transfer_vs_bound(&self) -> Option<f64> {
        match (self.idle_us_per_transfer, self.one_way_us) {
            (Some(idle), Some(one_way)) if one_way > 0.0 => Some(idle / (2.0 * one_way)),
            _ => None,
        }
    }

    pub(crate) fn requests_per_cs(&self) -> f64 {
        self.requests.iter().sum::<u64>() as f64 / self.sections.max(1) as f64
    }

    /// Server-side commands that are not the critical sections' own GET + SET.
    pub(crate) fn server_lock_cmds(&self) -> u64 {
        self.server
            .values()
            .sum::<u64>()
            .saturating_sub(2 * self.sections)
    }

    pub(crate) fn server_lock_per_cs(&self) -> f64 {
        self.server_lock_cmds() as f64 / self.sections.max(1) as f64
    }

    /// Script invocations seen by the server (EVALSHA, plus EVAL / SCRIPT on a miss).
    pub(crate) fn server_scripts(&self) -> u64 {
        ["evalsha", "eval", "evalsha_ro", "eval_ro"]
            .iter()
            .map(|n| self.server.get(*n).copied().unwrap_or(0))
            .sum()
    }

    pub(crate) fn shares(&self) -> Vec<f64> {
        let total = self.sections.max(1) as f64;
        self.per_proc.iter().map(|&n| n as f64 / total).collect()
    }

    /// Server calls by name per critical section, the critical section's own GET and
    /// SET apart (`get (cs)`, `get (lock)`, ...).
    pub(crate) fn server_breakdown(&self) -> Vec<(String, f64)> {
        let per = |n: u64| n as f64 / self.sections.max(1) as f64;
        let mut out = vec![
            ("get (cs)".to_owned(), per(self.sections)),
            ("set (cs)".to_owned(), per(self.sections)),
        ];
        for (name, &calls) in &self.server {
            let calls = if name == "get" || name == "set" {
                calls.saturating_sub(self.sections)
            } else {
                calls
            };
            if calls > 0 {
                let label = if name == "get" || name == "set" {
                    format!("{name} (lock)")
                } else {
                    name.clone()
                };
                out.push((label, per(calls)));
            }
        }
        out
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "kind": "point",
            "workload": self.workload.name(),
            "mode": self.mode.name(),
            "P": self.procs,
            "T": self.tasks,
            "matrix_T": self.t,
            "critical_sections": self.sections,
            "elapsed_s": self.elapsed_s,
            "cs_per_s": self.throughput,
            "cs_per_s_rounds": self.rounds,
            "wait_us": {"p50": self.wait_p50_us, "p99": self.wait_p99_us, "max": self.wait_max_us},
            "requests": {
                "acquire": self.requests[0], "release": self.requests[1],
                "renew": self.requests[2], "leave": self.requests[3],
            },
            "requests_per_cs": self.requests_per_cs(),
            "server_commands": self.server,
            "server_scripts_per_cs": self.server_scripts() as f64 / self.sections.max(1) as f64,
            "server_lock_commands_per_cs": self.server_lock_per_cs(),
            "server_cs_commands_per_cs": if self.sections > 0 { 2.0 } else { 0.0 },
            "handoffs": self.handoffs,
            "local_waits": self.local_waits,
            "acquired": self.acquired,
            "per_process_cs": self.per_proc,
            "per_process_share": self.shares(),
            "efficiency": self.efficiency,
            "transfers_per_s": self.transfers_per_s,
            "idle_us_per_transfer": self.idle_us_per_transfer,
            "idle_us_per_turn": self.idle_us_per_turn,
            "one_way_us": self.one_way_us,
            "transfer_vs_bound": self.transfer_vs_bound(),
        })
    }
}

/// The wake-up-after-remote-release scenario.
#[derive(Clone, Debug)]
pub struct Wake {
    /// Repetitions.
    pub reps: usize,
    /// B's `lock()` return minus A's `release()` completion, µs (may be negative).
    pub wake_us: Vec<i64>,
    /// Loopback round trip of a PING, µs.
    pub ping_us: Vec<i64>,
    /// Round trips B sent per repetition (acquire that queued + acquire that won).
    pub b_requests_per_rep: f64,
}

/// Uncontended lock + release.
#[derive(Clone, Debug)]
pub struct Uncontended {
    /// The lock mode.
    pub mode: Mode,
    /// Repetitions.
    pub reps: usize,
    /// Fewest backend round trips of one lock + release.
    pub min_requests: u64,
    /// Most backend round trips of one lock + release.
    pub max_requests: u64,
    /// Latency of each lock + release, µs.
    pub latency_us: Vec<i64>,
    /// Server-side calls per lock + release.
    pub server_per_pair: f64,
}

/// Everything [`run`](crate::run) measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// The per-workload matrix.
    pub points: Vec<Point>,
    /// The comparison matrix's points ([`Config::compare`]).
    pub compare: Vec<Point>,
    /// The wake-up scenario.
    pub wake: Wake,
    /// The uncontended lock + release, per lockflight mode.
    pub uncontended: Vec<Uncontended>,
    /// The topology table, when measured ([`Config::topology`](crate::Config::topology)).
    pub topology: Option<Vec<crate::topology::Row>>,
    /// The Markdown report (also written to `results.md`).
    pub markdown: String,
    /// The SVG chart, when one was drawn.
    pub chart: Option<PathBuf>,
    /// Wall time of the whole run.
    pub total: Duration,
}

pub(crate) fn pct(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

pub(crate) fn sorted(v: &[i64]) -> Vec<i64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v
}

pub(crate) fn write_outputs(cfg: &Config, r: &mut Report) -> Result<(), String> {
    std::fs::create_dir_all(&cfg.out_dir)
        .map_err(|e| format!("create {}: {e}", cfg.out_dir.display()))?;
    let mut jsonl = String::new();
    let meta = json!({
        "kind": "meta",
        "date": utc_now(),
        "unix_s": unix_us() / 1_000_000,
        "machine": machine(),
        "smoke": cfg.smoke,
        "P": cfg.procs,
        "T": cfg.tasks,
        "secs_per_point": cfg.secs,
        "total_s": r.total.as_secs_f64(),
    });
    let _ = writeln!(jsonl, "{meta}");
    for p in r.points.iter().chain(&r.compare) {
        let _ = writeln!(jsonl, "{}", p.to_json());
    }
    let wake = sorted(&r.wake.wake_us);
    let ping = sorted(&r.wake.ping_us);
    let _ = writeln!(
        jsonl,
        "{}",
        json!({
            "kind": "wakeup",
            "reps": r.wake.reps,
            "wake_us": {"p50": pct(&wake, 0.5), "p99": pct(&wake, 0.99), "max": wake.last()},
            "ping_us": {"p50": pct(&ping, 0.5), "p99": pct(&ping, 0.99), "max": ping.last()},
            "b_acquires_per_wait": r.wake.b_requests_per_rep,
        })
    );
    for u in &r.uncontended {
        let l = sorted(&u.latency_us);
        let _ = writeln!(
            jsonl,
            "{}",
            json!({
                "kind": "uncontended",
                "mode": u.mode.name(),
                "reps": u.reps,
                "round_trips_min": u.min_requests,
                "round_trips_max": u.max_requests,
                "server_commands_per_pair": u.server_per_pair,
                "latency_us": {"p50": pct(&l, 0.5), "p99": pct(&l, 0.99)},
            })
        );
    }
    for t in targets(cfg, r) {
        let _ = writeln!(
            jsonl,
            "{}",
            json!({"kind": "target", "name": t.name, "goal": t.goal, "measured": t.measured, "met": t.met})
        );
    }
    let write = |name: &str, text: &str| {
        let path = cfg.out_dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))
    };
    write("results.jsonl", &jsonl)?;
    write("results.md", &r.markdown)?;
    if cfg.chart && cfg.tasks.len() > 1 {
        let path = cfg.out_dir.join("contention.svg");
        chart(cfg, r, &path).map_err(|e| format!("chart {}: {e}", path.display()))?;
        r.chart = Some(path);
    }
    Ok(())
}
