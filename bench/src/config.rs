//! What a run measures: the workloads, the lock modes, the comparison matrix and
//! the environment knobs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lockflight::{Contention, Handoff, LockKey, Locker, backend::LockBackend};
use serde::{Deserialize, Serialize};

/// Never reached in a normal run: a timeout is a failure, not a data point.
pub(crate) const WAIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Number of keys of the zipf workload.
pub(crate) const ZIPF_KEYS: usize = 10_000;
/// Zipf exponent.
pub(crate) const ZIPF_S: f64 = 1.0;
/// Extra hold time of the `hotkey-rmw-hold1ms` workload.
pub(crate) const HOLD: Duration = Duration::from_millis(1);

/// The workloads.
///
/// In the worker spec a workload travels by its [`name`](Self::name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Workload {
    /// One key; GET counter, increment, SET.
    #[serde(rename = "hotkey-rmw")]
    HotkeyRmw,
    /// As `HotkeyRmw`, plus a 1 ms sleep inside the critical section.
    #[serde(rename = "hotkey-rmw-hold1ms")]
    HotkeyHold,
    /// 10,000 keys picked with a Zipf(s = 1) distribution.
    #[serde(rename = "zipf")]
    Zipf,
}

impl Workload {
    /// Every workload.
    pub const ALL: [Workload; 3] = [Workload::HotkeyRmw, Workload::HotkeyHold, Workload::Zipf];

    /// The name used in the knobs, the spec and the reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::HotkeyRmw => "hotkey-rmw",
            Workload::HotkeyHold => "hotkey-rmw-hold1ms",
            Workload::Zipf => "zipf",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Workload> {
        Self::ALL.into_iter().find(|w| w.name() == s)
    }

    pub(crate) fn keys(self) -> usize {
        match self {
            Workload::Zipf => ZIPF_KEYS,
            _ => 1,
        }
    }
}

/// How the critical section is guarded.
///
/// In the worker spec a mode travels by its [`name`](Self::name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A plain Redis lock, no lockflight: `SET key token NX PX 30000`, retried every
    /// 1 ms while busy, released by a Lua compare-and-delete (see `PlainLock`).
    Plain,
    /// `Contention::PerTask`: every task competes at Redis.
    Naive,
    /// Coalescing on, handoff off.
    Coalesced,
    /// `Locker::builder(backend).build()`: the default configuration (coalescing and
    /// handoff with the default budget).
    Default,
    /// The default with a 2 ms linger (`cache_leases_for(2 ms)`): lease
    /// caching as measured before it was on by default.
    Cached,
    /// The default without lease caching (`cache_leases_for(Duration::ZERO)`): the
    /// default configuration before lease caching was on by default.
    Uncached,
    /// Coalescing and an explicit `Handoff::enabled()` (the same settings as the
    /// default today; kept so that older result files keep their meaning).
    Handoff,
    /// One process, a `tokio::sync::Mutex` per key, no distributed lock.
    Floor,
}

impl Mode {
    /// The modes of a default run (`handoff` is only run when asked for).
    pub const ALL: [Mode; 5] = [
        Mode::Plain,
        Mode::Naive,
        Mode::Coalesced,
        Mode::Default,
        Mode::Floor,
    ];

    /// The name used in the knobs, the spec and the reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Naive => "naive",
            Mode::Coalesced => "coalesced",
            Mode::Default => "default",
            Mode::Cached => "cached",
            Mode::Uncached => "uncached",
            Mode::Handoff => "handoff",
            Mode::Floor => "floor",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Mode> {
        Self::ALL
            .into_iter()
            .chain([Mode::Handoff, Mode::Cached, Mode::Uncached])
            .find(|m| m.name() == s)
    }

    /// Whether the mode takes a lockflight lock (with fencing tokens and a `Locker`).
    pub(crate) fn is_lockflight(self) -> bool {
        !matches!(self, Mode::Plain | Mode::Floor)
    }

    pub(crate) fn locker(self, backend: impl LockBackend) -> lockflight::Result<Locker> {
        let b = Locker::builder(backend).wait_timeout(WAIT_TIMEOUT);
        match self {
            Mode::Naive => b
                .contention(Contention::PerTask)
                .handoff(Handoff::disabled()),
            Mode::Coalesced | Mode::Floor | Mode::Plain => b.handoff(Handoff::disabled()),
            Mode::Default => b,
            Mode::Cached => b.cache_leases_for(Duration::from_millis(2)),
            Mode::Uncached => b.cache_leases_for(Duration::ZERO),
            Mode::Handoff => b.handoff(Handoff::enabled()),
        }
        .build()
    }
}

/// One cell of the comparison matrix: a workload at P processes × T tasks, run in
/// each of `modes` (interleaved, `repeat` rounds).
#[derive(Clone, Debug)]
pub struct Cell {
    /// The workload.
    pub workload: Workload,
    /// Processes (P).
    pub procs: usize,
    /// Tasks per process (T).
    pub tasks: usize,
    /// The modes compared in this cell.
    pub modes: Vec<Mode>,
}

/// The comparison matrix: the default configuration (and the same without lease
/// caching) against a
/// plain Redis lock and the in-process floor at P ∈ {1, 4} × T ∈ {1, 8, 64}, with a
/// 0 ms and a 1 ms hold, and the cost of one hot key
/// waited on by 4, 16 and 64 instances.
pub fn compare_cells() -> Vec<Cell> {
    let all = vec![
        Mode::Plain,
        Mode::Naive,
        Mode::Coalesced,
        Mode::Default,
        Mode::Uncached,
        Mode::Floor,
    ];
    let mut cells: Vec<Cell> = [(1, 1), (1, 8), (1, 64), (4, 1), (4, 8), (4, 64)]
        .into_iter()
        .map(|(procs, tasks)| Cell {
            workload: Workload::HotkeyRmw,
            procs,
            tasks,
            modes: all.clone(),
        })
        .collect();
    for (procs, tasks) in [(1, 1), (1, 8), (1, 64), (4, 1), (4, 8), (4, 64)] {
        cells.push(Cell {
            workload: Workload::HotkeyHold,
            procs,
            tasks,
            modes: all.clone(),
        });
    }
    for procs in [4, 16, 64] {
        cells.push(Cell {
            workload: Workload::HotkeyRmw,
            procs,
            tasks: 2,
            modes: vec![Mode::Coalesced, Mode::Default],
        });
    }
    cells
}

/// Builds the command that runs one worker process (the coordinator adds
/// [`WORKER_ENV`](crate::WORKER_ENV) and the pipes).
pub type WorkerCommand = fn() -> std::process::Command;

/// What [`run`](crate::run) measures.
#[derive(Clone, Debug)]
pub struct Config {
    /// The smoke configuration (tiny; no chart).
    pub smoke: bool,
    /// Worker processes per distributed point (P).
    pub procs: usize,
    /// Tasks per process (T), one point each.
    pub tasks: Vec<usize>,
    /// Measured duration of each point.
    pub secs: f64,
    /// Rounds per point (modes interleaved); the median-throughput round is reported.
    pub repeat: usize,
    /// The workloads of the per-workload matrix.
    pub workloads: Vec<Workload>,
    /// The modes of the per-workload matrix.
    pub modes: Vec<Mode>,
    /// The comparison matrix (issue #13), run before the per-workload matrix.
    pub compare: Vec<Cell>,
    /// Repetitions of the wake-up scenario.
    pub wake_reps: usize,
    /// Repetitions of the uncontended lock + release.
    pub uncontended_reps: usize,
    /// Where results.jsonl, results.md and contention.svg go.
    pub out_dir: PathBuf,
    /// Draw the SVG chart.
    pub chart: bool,
    /// An existing server; `None` starts a private one.
    pub redis_url: Option<String>,
    /// One-way delay of a proxy between the workers and Redis
    /// (`LOCKFLIGHT_BENCH_DELAY_US`; zero: none).
    pub delay: Duration,
    /// Tokio worker threads of each worker process; 0 = current-thread runtime.
    pub worker_threads: usize,
    /// Measure the topology table ([`crate::topology`]) after the points: on in a
    /// full run without a delay proxy (the topologies run on their own loopback
    /// servers, without it), off in the smoke run; `LOCKFLIGHT_BENCH_TOPOLOGY=1`
    /// or `0` decides.
    pub topology: bool,
    /// How to start a worker process.
    pub worker: WorkerCommand,
}

pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        // The workspace's target directory (this package is bench/).
        .unwrap_or_else(|| {
            let bench = Path::new(env!("CARGO_MANIFEST_DIR"));
            bench.parent().unwrap_or(bench).join("target")
        })
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    let raw = std::env::var(name).ok()?;
    match raw.trim().parse() {
        Ok(v) => Some(v),
        Err(_) => panic!("{name}={raw:?} is not valid"),
    }
}

impl Config {
    /// The default run: the comparison matrix ([`compare_cells`]), 2 s per point, 3
    /// rounds, and the zipf workload at P = 4, T ∈ {8, 64} in every mode.
    pub fn full(worker: WorkerCommand) -> Config {
        Config {
            smoke: false,
            procs: 4,
            tasks: vec![8, 64],
            secs: 2.0,
            repeat: 3,
            workloads: vec![Workload::Zipf],
            modes: Mode::ALL.to_vec(),
            compare: compare_cells(),
            wake_reps: 200,
            uncontended_reps: 500,
            out_dir: target_dir().join("lockflight-bench"),
            chart: true,
            redis_url: None,
            delay: Duration::ZERO,
            worker_threads: 2,
            topology: true,
            worker,
        }
    }

    /// The CI configuration: P = 2, T = 4, 0.5 s per point; correctness still checked.
    pub fn smoke(worker: WorkerCommand) -> Config {
        Config {
            smoke: true,
            procs: 2,
            tasks: vec![4],
            secs: 0.5,
            repeat: 1,
            workloads: Workload::ALL.to_vec(),
            compare: Vec::new(),
            wake_reps: 30,
            uncontended_reps: 50,
            out_dir: target_dir().join("lockflight-bench").join("smoke"),
            chart: false,
            topology: false,
            ..Config::full(worker)
        }
    }

    /// [`full`](Self::full) or [`smoke`](Self::smoke) (`LOCKFLIGHT_BENCH_SMOKE=1`, or
    /// `smoke`), then the env knobs `LOCKFLIGHT_BENCH_SECS`, `LOCKFLIGHT_BENCH_P`,
    /// `LOCKFLIGHT_BENCH_T` (comma list), `LOCKFLIGHT_BENCH_WORKLOADS` and
    /// `LOCKFLIGHT_BENCH_MODES` (comma lists of names), `LOCKFLIGHT_BENCH_DELAY_US`,
    /// `LOCKFLIGHT_BENCH_TOPOLOGY` (`0` or `1`), and `REDIS_URL`.
    pub fn from_env(worker: WorkerCommand, smoke: bool) -> Config {
        let smoke = smoke
            || std::env::var("LOCKFLIGHT_BENCH_SMOKE").is_ok_and(|v| !v.is_empty() && v != "0");
        let mut cfg = if smoke {
            Config::smoke(worker)
        } else {
            Config::full(worker)
        };
        if let Some(secs) = env_parse::<f64>("LOCKFLIGHT_BENCH_SECS") {
            assert!(secs > 0.0, "LOCKFLIGHT_BENCH_SECS must be positive");
            cfg.secs = secs;
        }
        if let Some(r) = env_parse::<usize>("LOCKFLIGHT_BENCH_REPEAT") {
            assert!(r > 0, "LOCKFLIGHT_BENCH_REPEAT must be positive");
            cfg.repeat = r;
        }
        if let Some(n) = env_parse::<usize>("LOCKFLIGHT_BENCH_WORKER_THREADS") {
            cfg.worker_threads = n;
        }
        if let Some(p) = env_parse::<usize>("LOCKFLIGHT_BENCH_P") {
            assert!(p > 0, "LOCKFLIGHT_BENCH_P must be positive");
            cfg.procs = p;
        }
        let list = |name: &str| -> Option<Vec<String>> {
            let raw = std::env::var(name).ok()?;
            Some(
                raw.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect(),
            )
        };
        if let Some(ts) = list("LOCKFLIGHT_BENCH_T") {
            cfg.tasks = ts
                .iter()
                .map(|t| match t.parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => panic!("LOCKFLIGHT_BENCH_T: {t:?} is not a positive number"),
                })
                .collect();
        }
        if let Some(keep) = list("LOCKFLIGHT_BENCH_COMPARE") {
            // `0` (or empty): no comparison matrix; else the `PxT` cells listed.
            cfg.compare
                .retain(|c| keep.contains(&format!("{}x{}", c.procs, c.tasks)));
        }
        if let Some(ms) = list("LOCKFLIGHT_BENCH_COMPARE_MODES") {
            // Only these modes in the comparison cells (a cell keeps its order).
            let keep: Vec<Mode> = ms
                .iter()
                .map(|m| Mode::parse(m).unwrap_or_else(|| panic!("unknown mode {m:?}")))
                .collect();
            for cell in &mut cfg.compare {
                cell.modes.retain(|m| keep.contains(m));
            }
        }
        if let Some(ws) = list("LOCKFLIGHT_BENCH_WORKLOADS") {
            cfg.workloads = ws
                .iter()
                .map(|w| Workload::parse(w).unwrap_or_else(|| panic!("unknown workload {w:?}")))
                .collect();
        }
        if let Some(ms) = list("LOCKFLIGHT_BENCH_MODES") {
            cfg.modes = ms
                .iter()
                .map(|m| Mode::parse(m).unwrap_or_else(|| panic!("unknown mode {m:?}")))
                .collect();
        }
        cfg.redis_url = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty());
        if let Some(us) = env_parse::<u64>("LOCKFLIGHT_BENCH_DELAY_US") {
            cfg.delay = Duration::from_micros(us);
        }
        cfg.topology &= cfg.delay.is_zero();
        if let Some(on) = env_parse::<u8>("LOCKFLIGHT_BENCH_TOPOLOGY") {
            cfg.topology = on != 0;
        }
        cfg
    }
}

/// The lock key of key index `k` of a workload.
pub(crate) fn lock_key(workload: Workload, k: usize) -> LockKey {
    match workload {
        Workload::Zipf => LockKey::from(format!("z{k}")),
        _ => LockKey::from("hot"),
    }
}

/// The Redis counter of key index `k` of a workload, under a point's prefix.
pub(crate) fn counter_name(prefix: &str, workload: Workload, k: usize) -> String {
    match workload {
        Workload::Zipf => format!("{prefix}:ctr:z{k}"),
        _ => format!("{prefix}:ctr:hot"),
    }
}
