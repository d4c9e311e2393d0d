//! Contention benchmark: P worker **processes** × T Tokio tasks contend for Redis
//! locks through lockflight, side by side with a plain Redis lock (`SET NX PX` + 1 ms
//! retry + Lua compare-and-delete, [`PlainLock`]) and an in-process
//! `tokio::sync::Mutex` floor.
//!
//! ```text
//! cargo bench --bench contention                       # default run (~6 min on 2 cores)
//! LOCKFLIGHT_BENCH_SMOKE=1 cargo bench --bench contention   # tiny, still checks correctness
//! LOCKFLIGHT_BENCH_COMPARE=0 LOCKFLIGHT_BENCH_P=4 LOCKFLIGHT_BENCH_T=1,8,64 cargo bench --bench contention
//! ```
//!
//! The default run has two parts. The **comparison matrix** ([`compare_cells`]): the
//! `hotkey-rmw` workload at P × T ∈ {1×1, 1×8, 1×64, 4×8, 4×64} and
//! `hotkey-rmw-hold1ms` at 4×64, each in the modes plain, naive, coalesced, default
//! and floor; then 4, 16 and 64 instances × 2 tasks (coalesced and default) for the
//! cost of one hot key against the number of waiting instances. Then the
//! **per-workload matrix**: each of `LOCKFLIGHT_BENCH_WORKLOADS` (default `zipf`) at
//! P = `LOCKFLIGHT_BENCH_P` × each T of `LOCKFLIGHT_BENCH_T`, in each of
//! `LOCKFLIGHT_BENCH_MODES`.
//!
//! Knobs (environment): `LOCKFLIGHT_BENCH_SMOKE=1` (P = 2, T = 4, 0.5 s, one round,
//! no comparison matrix), `LOCKFLIGHT_BENCH_SECS` (per point, default 2),
//! `LOCKFLIGHT_BENCH_COMPARE` (`0`: skip the comparison matrix; or a comma list of its
//! `PxT` cells to keep, e.g. `1x1,4x64`), `LOCKFLIGHT_BENCH_P`, `LOCKFLIGHT_BENCH_T`
//! (comma list), `LOCKFLIGHT_BENCH_REPEAT` (rounds per point, default 3: on a small
//! VM the same point varies by 2–3× from run to run, so the modes of one point are
//! run interleaved and the median round is reported), `LOCKFLIGHT_BENCH_WORKLOADS`
//! (`hotkey-rmw,hotkey-rmw-hold1ms,zipf`), `LOCKFLIGHT_BENCH_MODES`
//! (`plain,naive,coalesced,default,handoff,floor`), `LOCKFLIGHT_BENCH_WORKER_THREADS`
//! (Tokio workers per process, default 2; 0 = current-thread runtime), `REDIS_URL`.
//!
//! The floor runs one process with P·T tasks. Outputs go to `target/lockflight-bench/`
//! (`results.jsonl`, `results.md`, `contention.svg`; smoke runs to `…/smoke/`).
//!
//! Without `REDIS_URL` a private `redis-server` is started on a free loopback port
//! (`tests/support`); with it, that server is used (its `INFO commandstats` then
//! includes other clients' traffic). Run without `--bench` (as `cargo test --benches`
//! does), the smoke configuration runs.
//!
//! # How a point runs
//!
//! The coordinator re-executes a worker command (this binary, or the smoke test's
//! binary, see `tests/bench_smoke.rs`) with [`WORKER_ENV`] set, once per process.
//! Protocol, one line each, worker output lines are marked with `LFBENCH`:
//!
//! 1. coordinator → worker stdin: the worker spec (JSON);
//! 2. worker → stdout: `LFBENCH READY` once connected and subscribed;
//! 3. coordinator → every worker: `GO <start µs> <end µs>` (unix time): all start at
//!    the same instant and stop by themselves at the same instant (start barrier);
//! 4. worker → stdout: `LFBENCH RESULT <json>` (or `LFBENCH ERROR <message>`).
//!
//! # Correctness oracle
//!
//! Each critical section reads a Redis counter and writes it back incremented; it
//! records `(key, value read, fencing token)`. If mutual exclusion holds, the values
//! read for one key are exactly `0..n` (no duplicate, no gap) and the final counter is
//! `n`; ordered by that value (the true global order of the critical sections), the
//! fencing tokens strictly increase — across all processes, handoffs included (this
//! implies that each worker's own sequence strictly increases and that the union has
//! no duplicate). No lease may be lost, no lock may time out, no lock key may remain
//! (the plain lock's keys included; it has no fencing tokens, so only its counter
//! oracle applies). Any violation makes [`run`] fail, and the bench exit non-zero.
#![allow(dead_code)] // also compiled as a module of tests/bench_smoke.rs, which uses part of it

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use lockflight::backend::{Acquire, Extend, LeaseToken, Released, WakeRegistry};
use lockflight::{Handoff, LockKey, Locker, RedisBackend, backend::LockBackend};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Set (to anything) in a worker process's environment.
pub(crate) const WORKER_ENV: &str = "LOCKFLIGHT_BENCH_WORKER";
/// Marks the protocol lines on a worker's stdout (other output is ignored).
const MARK: &str = "LFBENCH ";
/// Never reached in a normal run: a timeout is a failure, not a data point.
const WAIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Number of keys of the zipf workload.
const ZIPF_KEYS: usize = 10_000;
/// Zipf exponent.
const ZIPF_S: f64 = 1.0;
/// Extra hold time of the `hotkey-rmw-hold1ms` workload.
const HOLD: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Workload {
    /// One key; GET counter, increment, SET.
    HotkeyRmw,
    /// As `HotkeyRmw`, plus a 1 ms sleep inside the critical section.
    HotkeyHold,
    /// 10,000 keys picked with a Zipf(s = 1) distribution.
    Zipf,
}

impl Workload {
    pub(crate) const ALL: [Workload; 3] =
        [Workload::HotkeyRmw, Workload::HotkeyHold, Workload::Zipf];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::HotkeyRmw => "hotkey-rmw",
            Workload::HotkeyHold => "hotkey-rmw-hold1ms",
            Workload::Zipf => "zipf",
        }
    }

    fn parse(s: &str) -> Option<Workload> {
        Self::ALL.into_iter().find(|w| w.name() == s)
    }

    fn keys(self) -> usize {
        match self {
            Workload::Zipf => ZIPF_KEYS,
            _ => 1,
        }
    }
}

/// How the critical section is guarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Mode {
    /// A plain Redis lock, no lockflight: `SET key token NX PX 30000`, retried every
    /// 1 ms while busy, released by a Lua compare-and-delete (see [`PlainLock`]).
    Plain,
    /// `coalescing(false)`: every task competes at Redis.
    Naive,
    /// Coalescing on, handoff off.
    Coalesced,
    /// `Locker::builder(backend).build()`: the default configuration (coalescing and
    /// handoff with the default budget).
    Default,
    /// Coalescing and an explicit `Handoff::enabled()` (the same settings as the
    /// default today; kept so that older result files keep their meaning).
    Handoff,
    /// One process, a `tokio::sync::Mutex` per key, no distributed lock.
    Floor,
}

impl Mode {
    pub(crate) const ALL: [Mode; 5] = [
        Mode::Plain,
        Mode::Naive,
        Mode::Coalesced,
        Mode::Default,
        Mode::Floor,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Naive => "naive",
            Mode::Coalesced => "coalesced",
            Mode::Default => "default",
            Mode::Handoff => "handoff",
            Mode::Floor => "floor",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        Self::ALL
            .into_iter()
            .chain([Mode::Handoff])
            .find(|m| m.name() == s)
    }

    /// Whether the mode takes a lockflight lock (with fencing tokens and a `Locker`).
    fn is_lockflight(self) -> bool {
        !matches!(self, Mode::Plain | Mode::Floor)
    }

    fn locker(self, backend: impl LockBackend) -> lockflight::Result<Locker> {
        let b = Locker::builder(backend).wait_timeout(WAIT_TIMEOUT);
        match self {
            Mode::Naive => b.coalescing(false).handoff(Handoff::disabled()),
            Mode::Coalesced | Mode::Floor | Mode::Plain => {
                b.coalescing(true).handoff(Handoff::disabled())
            }
            Mode::Default => b,
            Mode::Handoff => b.coalescing(true).handoff(Handoff::enabled()),
        }
        .build()
    }
}

/// One cell of the comparison matrix: a workload at P processes × T tasks, run in
/// each of `modes` (interleaved, `repeat` rounds).
#[derive(Clone, Debug)]
pub(crate) struct Cell {
    pub(crate) workload: Workload,
    pub(crate) procs: usize,
    pub(crate) tasks: usize,
    pub(crate) modes: Vec<Mode>,
}

/// The comparison matrix of issue #13: the default configuration against a plain
/// Redis lock and the in-process floor at P ∈ {1, 4} × T ∈ {1, 8, 64} (0 ms hold),
/// 4 × 64 with a 1 ms hold, and the cost of one hot key waited on by 4, 16 and 64
/// instances.
pub(crate) fn compare_cells() -> Vec<Cell> {
    let all = vec![
        Mode::Plain,
        Mode::Naive,
        Mode::Coalesced,
        Mode::Default,
        Mode::Floor,
    ];
    let mut cells: Vec<Cell> = [(1, 1), (1, 8), (1, 64), (4, 8), (4, 64)]
        .into_iter()
        .map(|(procs, tasks)| Cell {
            workload: Workload::HotkeyRmw,
            procs,
            tasks,
            modes: all.clone(),
        })
        .collect();
    cells.push(Cell {
        workload: Workload::HotkeyHold,
        procs: 4,
        tasks: 64,
        modes: all,
    });
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
/// [`WORKER_ENV`] and the pipes).
pub(crate) type WorkerCommand = fn() -> std::process::Command;

/// What [`run`] measures.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// The smoke configuration (tiny; no chart).
    pub(crate) smoke: bool,
    /// Worker processes per distributed point (P).
    pub(crate) procs: usize,
    /// Tasks per process (T), one point each.
    pub(crate) tasks: Vec<usize>,
    /// Measured duration of each point.
    pub(crate) secs: f64,
    /// Rounds per point (modes interleaved); the median-throughput round is reported.
    pub(crate) repeat: usize,
    pub(crate) workloads: Vec<Workload>,
    pub(crate) modes: Vec<Mode>,
    /// The comparison matrix (issue #13), run before the per-workload matrix.
    pub(crate) compare: Vec<Cell>,
    /// Repetitions of the wake-up scenario.
    pub(crate) wake_reps: usize,
    /// Repetitions of the uncontended lock + release.
    pub(crate) uncontended_reps: usize,
    /// Where results.jsonl, results.md and contention.svg go.
    pub(crate) out_dir: PathBuf,
    /// Draw the SVG chart.
    pub(crate) chart: bool,
    /// An existing server; `None` starts a private one.
    pub(crate) redis_url: Option<String>,
    /// Tokio worker threads of each worker process; 0 = current-thread runtime.
    pub(crate) worker_threads: usize,
    /// How to start a worker process.
    pub(crate) worker: WorkerCommand,
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
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
    pub(crate) fn full(worker: WorkerCommand) -> Config {
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
            worker_threads: 2,
            worker,
        }
    }

    /// The CI configuration: P = 2, T = 4, 0.5 s per point; correctness still checked.
    pub(crate) fn smoke(worker: WorkerCommand) -> Config {
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
            ..Config::full(worker)
        }
    }

    /// [`full`](Self::full) or [`smoke`](Self::smoke) (`LOCKFLIGHT_BENCH_SMOKE=1`, or
    /// `smoke`), then the env knobs `LOCKFLIGHT_BENCH_SECS`, `LOCKFLIGHT_BENCH_P`,
    /// `LOCKFLIGHT_BENCH_T` (comma list), `LOCKFLIGHT_BENCH_WORKLOADS` and
    /// `LOCKFLIGHT_BENCH_MODES` (comma lists of names), and `REDIS_URL`.
    pub(crate) fn from_env(worker: WorkerCommand, smoke: bool) -> Config {
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
        cfg
    }
}

// ---------------------------------------------------------------------------
// The bench binary
// ---------------------------------------------------------------------------

fn this_binary() -> std::process::Command {
    std::process::Command::new(std::env::current_exe().expect("the bench binary's path"))
}

fn main() {
    if std::env::var_os(WORKER_ENV).is_some() {
        worker_main();
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: smoke only.
    let benching = std::env::args().any(|a| a == "--bench");
    let cfg = Config::from_env(this_binary, !benching);
    match run(&cfg) {
        Ok(report) => {
            println!("{}", report.markdown);
            eprintln!(
                "results: {}, {}{}",
                cfg.out_dir.join("results.jsonl").display(),
                cfg.out_dir.join("results.md").display(),
                if report.chart.is_some() {
                    format!(", {}", cfg.out_dir.join("contention.svg").display())
                } else {
                    String::new()
                }
            );
        }
        Err(e) => {
            eprintln!("\n*** lockflight contention bench FAILED ***\n{e}");
            std::process::exit(1);
        }
    }
}

// ---------------------------------------------------------------------------
// Counting backend wrapper: one trait call = one round trip as sent
// ---------------------------------------------------------------------------

/// Requests sent through a [`Counting`] backend.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    acquire: AtomicU64,
    release: AtomicU64,
    extend: AtomicU64,
    leave: AtomicU64,
}

impl Counts {
    /// `[acquire, release, extend, leave]`.
    pub(crate) fn snapshot(&self) -> [u64; 4] {
        [
            self.acquire.load(Ordering::Relaxed),
            self.release.load(Ordering::Relaxed),
            self.extend.load(Ordering::Relaxed),
            self.leave.load(Ordering::Relaxed),
        ]
    }

    pub(crate) fn total(&self) -> u64 {
        self.snapshot().iter().sum()
    }
}

/// Counts every backend request lockflight sends (a script call is one).
#[derive(Debug)]
pub(crate) struct Counting<B> {
    inner: B,
    counts: Arc<Counts>,
}

impl<B> Counting<B> {
    pub(crate) fn new(inner: B) -> (Self, Arc<Counts>) {
        let counts = Arc::new(Counts::default());
        let c = Arc::clone(&counts);
        (Counting { inner, counts }, c)
    }
}

#[async_trait]
impl<B: LockBackend> LockBackend for Counting<B> {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
    ) -> lockflight::Result<Acquire> {
        self.counts.acquire.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(key, token, ttl, queue).await
    }
    async fn release(&self, key: &LockKey, token: LeaseToken) -> lockflight::Result<Released> {
        self.counts.release.fetch_add(1, Ordering::Relaxed);
        self.inner.release(key, token).await
    }
    async fn extend(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> lockflight::Result<Extend> {
        self.counts.extend.fetch_add(1, Ordering::Relaxed);
        self.inner.extend(key, token, ttl).await
    }
    async fn leave(&self, key: &LockKey) -> lockflight::Result<()> {
        self.counts.leave.fetch_add(1, Ordering::Relaxed);
        self.inner.leave(key).await
    }
    fn wakeups(&self) -> &WakeRegistry {
        self.inner.wakeups()
    }
    fn fencing(&self) -> bool {
        self.inner.fencing()
    }
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// SplitMix64: tiny, seedable, good enough for picking keys.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf(s) over `0..n` by inverse CDF (binary search in a cumulative table).
pub(crate) struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub(crate) fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / (k as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut SplitMix) -> usize {
        let u = rng.next_f64();
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The monotonic instant of a unix time in µs (same machine, same clock).
fn instant_at(at_us: u64) -> Instant {
    let (now, now_us) = (Instant::now(), unix_us());
    if at_us >= now_us {
        now + Duration::from_micros(at_us - now_us)
    } else {
        now.checked_sub(Duration::from_micros(now_us - at_us))
            .unwrap_or(now)
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

fn emit(kind: &str, payload: &str) {
    let mut out = std::io::stdout().lock();
    // A leading newline: libtest may have printed "test x ... " on this line.
    let _ = writeln!(out, "\n{MARK}{kind} {payload}");
    let _ = out.flush();
}

async fn data_connection(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| format!("redis url {url}: {e}"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(10)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("connect to {url}: {e}"))
}

fn lock_key(workload: Workload, k: usize) -> LockKey {
    match workload {
        Workload::Zipf => LockKey::from(format!("z{k}")),
        _ => LockKey::from("hot"),
    }
}

fn counter_name(prefix: &str, workload: Workload, k: usize) -> String {
    match workload {
        Workload::Zipf => format!("{prefix}:ctr:z{k}"),
        _ => format!("{prefix}:ctr:hot"),
    }
}

// ---------------------------------------------------------------------------
// Worker process
// ---------------------------------------------------------------------------

/// The entry point of a worker process: reads its spec from stdin, runs, prints one
/// `LFBENCH RESULT` line.
pub(crate) fn worker_main() {
    let mut line = String::new();
    if let Err(e) = std::io::stdin().lock().read_line(&mut line) {
        emit("ERROR", &format!("reading the worker spec: {e}"));
        return;
    }
    let spec: Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => {
            emit("ERROR", &format!("bad worker spec {line:?}: {e}"));
            return;
        }
    };
    let threads = spec["threads"].as_u64().unwrap_or(2) as usize;
    let rt = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("a tokio runtime");
    match rt.block_on(worker(spec)) {
        Ok(result) => emit("RESULT", &result.to_string()),
        Err(e) => emit("ERROR", &e.replace('\n', " | ")),
    }
    rt.shutdown_timeout(Duration::from_secs(1));
}

enum Guard {
    Lock(Arc<Locker>),
    Mutexes(Vec<tokio::sync::Mutex<()>>),
    Plain(PlainLock),
}

/// The honest baseline: a plain Redis lock as the usual libraries write it, on
/// redis-rs. `SET <name> <random token> NX PX 30000`; while busy, sleep 1 ms and try
/// again; release with a Lua compare-and-delete (`EVALSHA`). No coalescing, no
/// queue, no wake-ups, no fencing.
pub(crate) struct PlainLock {
    conn: redis::aio::MultiplexedConnection,
    names: Vec<String>,
    /// `[acquire attempts, releases]`
    requests: [AtomicU64; 2],
}

static PLAIN_RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    )
});

impl PlainLock {
    const TTL_MS: u64 = 30_000;
    const RETRY: Duration = Duration::from_millis(1);

    /// Takes the lock of key `k`; returns its token.
    async fn lock(&self, k: usize, deadline: Instant) -> Result<String, String> {
        let token = LeaseToken::random().to_hex();
        let mut conn = self.conn.clone();
        loop {
            self.requests[0].fetch_add(1, Ordering::Relaxed);
            let ok: Option<String> = redis::cmd("SET")
                .arg(&self.names[k])
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(Self::TTL_MS)
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("plain SET NX: {e}"))?;
            if ok.is_some() {
                return Ok(token);
            }
            if Instant::now() > deadline {
                return Err("plain lock: timed out".into());
            }
            tokio::time::sleep(Self::RETRY).await;
        }
    }

    async fn unlock(&self, k: usize, token: &str) -> Result<(), String> {
        self.requests[1].fetch_add(1, Ordering::Relaxed);
        let mut conn = self.conn.clone();
        let deleted: i64 = PLAIN_RELEASE
            .key(&self.names[k])
            .arg(token)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("plain release: {e}"))?;
        if deleted == 1 {
            Ok(())
        } else {
            Err("plain release: the lock was no longer ours".into())
        }
    }
}

struct Ctx {
    workload: Workload,
    guard: Guard,
    data: redis::aio::MultiplexedConnection,
    keys: Vec<LockKey>,
    counters: Vec<String>,
    zipf: Option<Zipf>,
    end: Instant,
}

#[derive(Default)]
struct TaskOut {
    sections: u64,
    hist: Option<Histogram<u64>>,
    /// `[key index, counter value read, epoch, seq]`
    records: Vec<[u64; 4]>,
    error: Option<String>,
}

async fn worker(spec: Value) -> Result<Value, String> {
    let field = |name: &str| {
        spec.get(name)
            .ok_or_else(|| format!("worker spec without {name}: {spec}"))
    };
    let str_field = |name: &str| {
        field(name)?
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("worker spec: {name} is not a string"))
    };
    let id = field("id")?.as_u64().unwrap_or(0);
    let url = str_field("url")?;
    let prefix = str_field("prefix")?;
    let workload = Workload::parse(&str_field("workload")?).ok_or("unknown workload")?;
    let mode = Mode::parse(&str_field("mode")?).ok_or("unknown mode")?;
    let tasks = field("tasks")?.as_u64().ok_or("tasks")? as usize;
    let seed = field("seed")?.as_u64().unwrap_or(1);

    let data = data_connection(&url).await?;
    let nkeys = workload.keys();
    let (guard, counts) = if mode == Mode::Floor {
        let mutexes = (0..nkeys).map(|_| tokio::sync::Mutex::new(())).collect();
        (Guard::Mutexes(mutexes), None)
    } else if mode == Mode::Plain {
        let plain = PlainLock {
            conn: data_connection(&url).await?,
            names: (0..nkeys)
                .map(|k| format!("{prefix}:{{plain-{k}}}"))
                .collect(),
            requests: Default::default(),
        };
        (Guard::Plain(plain), None)
    } else {
        let backend = RedisBackend::builder(url.as_str())
            .prefix(prefix.as_str())
            .connect()
            .await
            .map_err(|e| format!("worker {id}: connect: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !backend.is_subscribed() {
            if Instant::now() > deadline {
                return Err(format!("worker {id}: not subscribed after 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (backend, counts) = Counting::new(backend);
        let locker = mode.locker(backend).map_err(|e| e.to_string())?;
        (Guard::Lock(Arc::new(locker)), Some(counts))
    };
    emit("READY", &id.to_string());

    let go = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("worker {id}: reading GO: {e}"))?;
    let mut parts = go.split_whitespace();
    let (Some("GO"), Some(start), Some(end)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("worker {id}: expected GO, got {go:?}"));
    };
    let start: u64 = start.parse().map_err(|_| "bad GO start")?;
    let end: u64 = end.parse().map_err(|_| "bad GO end")?;
    let (start, end) = (instant_at(start), instant_at(end));

    let ctx = Arc::new(Ctx {
        workload,
        guard,
        data,
        keys: (0..nkeys).map(|k| lock_key(workload, k)).collect(),
        counters: (0..nkeys)
            .map(|k| counter_name(&prefix, workload, k))
            .collect(),
        zipf: (workload == Workload::Zipf).then(|| Zipf::new(ZIPF_KEYS, ZIPF_S)),
        end,
    });
    let stats_before = match &ctx.guard {
        Guard::Lock(l) => Some(l.stats()),
        Guard::Mutexes(_) | Guard::Plain(_) => None,
    };
    tokio::time::sleep_until(start.into()).await;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let ctx = Arc::clone(&ctx);
            let seed = seed ^ (id << 32) ^ (t as u64).wrapping_mul(0x9E37_79B9);
            tokio::spawn(task_loop(ctx, seed))
        })
        .collect();
    let mut hist = new_histogram();
    let mut sections = 0;
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.await {
            Ok(out) => {
                sections += out.sections;
                if let Some(h) = &out.hist {
                    hist.add(h).map_err(|e| e.to_string())?;
                }
                records.extend(out.records);
                errors.extend(out.error);
            }
            Err(e) => errors.push(format!("task panicked: {e}")),
        }
    }
    let elapsed = start.elapsed();
    let stats = match (&ctx.guard, stats_before) {
        (Guard::Lock(l), Some(before)) => {
            let s = l.stats() - before;
            json!({
                "acquire_attempts": s.acquire_attempts, "acquired": s.acquired,
                "local_waits": s.local_waits, "handoffs": s.handoffs, "releases": s.releases,
                "renewals": s.renewals, "leases_lost": s.leases_lost, "timeouts": s.timeouts,
                "active_keys": l.active_keys(),
            })
        }
        _ => Value::Null,
    };
    let requests = match &ctx.guard {
        Guard::Plain(p) => [
            p.requests[0].load(Ordering::Relaxed),
            p.requests[1].load(Ordering::Relaxed),
            0,
            0,
        ],
        _ => counts.map_or([0; 4], |c| c.snapshot()),
    };
    let hist: Vec<[u64; 2]> = hist
        .iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect();
    Ok(json!({
        "id": id,
        "sections": sections,
        "elapsed_us": micros(elapsed),
        "requests": requests,
        "stats": stats,
        "hist": hist,
        "records": records,
        "errors": errors,
    }))
}

async fn task_loop(ctx: Arc<Ctx>, seed: u64) -> TaskOut {
    let mut out = TaskOut::default();
    let mut hist = new_histogram();
    if let Err(e) = task_body(&ctx, seed, &mut out, &mut hist).await {
        out.error = Some(e);
    }
    out.hist = Some(hist);
    out
}

async fn task_body(
    ctx: &Ctx,
    seed: u64,
    out: &mut TaskOut,
    hist: &mut Histogram<u64>,
) -> Result<(), String> {
    let mut rng = SplitMix(seed);
    let mut conn = ctx.data.clone();
    while Instant::now() < ctx.end {
        let k = ctx.zipf.as_ref().map_or(0, |z| z.sample(&mut rng));
        let t0 = Instant::now();
        match &ctx.guard {
            Guard::Lock(locker) => {
                let guard = locker
                    .lock(&ctx.keys[k])
                    .await
                    .map_err(|e| format!("lock: {e}"))?;
                hist.record(micros(t0.elapsed())).ok();
                let c = critical_section(ctx, &mut conn, k).await?;
                let f = guard.fencing_token();
                out.records.push([k as u64, c, f.epoch, f.seq]);
                guard.release().await.map_err(|e| format!("release: {e}"))?;
            }
            Guard::Mutexes(mutexes) => {
                let guard = mutexes[k].lock().await;
                hist.record(micros(t0.elapsed())).ok();
                let c = critical_section(ctx, &mut conn, k).await?;
                out.records.push([k as u64, c, 0, 0]);
                drop(guard);
            }
            Guard::Plain(plain) => {
                let token = plain.lock(k, t0 + WAIT_TIMEOUT).await?;
                hist.record(micros(t0.elapsed())).ok();
                let c = critical_section(ctx, &mut conn, k).await?;
                out.records.push([k as u64, c, 0, 0]);
                plain.unlock(k, &token).await?;
            }
        }
        out.sections += 1;
    }
    Ok(())
}

/// GET the counter, SET it incremented (two round trips on the data connection),
/// then hold if the workload says so. Returns the value read.
async fn critical_section(
    ctx: &Ctx,
    conn: &mut redis::aio::MultiplexedConnection,
    k: usize,
) -> Result<u64, String> {
    let name = &ctx.counters[k];
    let c: Option<u64> = redis::cmd("GET")
        .arg(name)
        .query_async(conn)
        .await
        .map_err(|e| format!("GET {name}: {e}"))?;
    let c = c.unwrap_or(0);
    redis::cmd("SET")
        .arg(name)
        .arg(c + 1)
        .query_async::<()>(conn)
        .await
        .map_err(|e| format!("SET {name}: {e}"))?;
    if ctx.workload == Workload::HotkeyHold {
        tokio::time::sleep(HOLD).await;
    }
    Ok(c)
}

// ---------------------------------------------------------------------------
// Coordinator
// ---------------------------------------------------------------------------

/// One measured point.
#[derive(Clone, Debug)]
pub(crate) struct Point {
    pub(crate) workload: Workload,
    pub(crate) mode: Mode,
    /// Processes actually run (1 for the floor).
    pub(crate) procs: usize,
    /// Tasks per process actually run (P·T for the floor).
    pub(crate) tasks: usize,
    /// The T of the matrix this point belongs to.
    pub(crate) t: usize,
    pub(crate) sections: u64,
    pub(crate) elapsed_s: f64,
    pub(crate) throughput: f64,
    pub(crate) wait_p50_us: u64,
    pub(crate) wait_p99_us: u64,
    pub(crate) wait_max_us: u64,
    /// Client-side requests `[acquire, release, extend, leave]`.
    pub(crate) requests: [u64; 4],
    /// Server-side command calls by name (`INFO commandstats` delta, `info` excluded).
    pub(crate) server: BTreeMap<String, u64>,
    pub(crate) handoffs: u64,
    pub(crate) local_waits: u64,
    pub(crate) acquired: u64,
    pub(crate) per_proc: Vec<u64>,
    /// Throughput of every round of this point (the point itself is the median).
    pub(crate) rounds: Vec<f64>,
}

impl Point {
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

    fn to_json(&self) -> Value {
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
                "extend": self.requests[2], "leave": self.requests[3],
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
        })
    }
}

/// The wake-up-after-remote-release scenario.
#[derive(Clone, Debug)]
pub(crate) struct Wake {
    pub(crate) reps: usize,
    /// B's `lock()` return minus A's `release()` completion, µs (may be negative).
    pub(crate) wake_us: Vec<i64>,
    /// Loopback round trip of a PING, µs.
    pub(crate) ping_us: Vec<i64>,
    /// Round trips B sent per repetition (acquire that queued + acquire that won).
    pub(crate) b_requests_per_rep: f64,
}

/// Uncontended lock + release.
#[derive(Clone, Debug)]
pub(crate) struct Uncontended {
    pub(crate) mode: Mode,
    pub(crate) reps: usize,
    pub(crate) min_requests: u64,
    pub(crate) max_requests: u64,
    pub(crate) latency_us: Vec<i64>,
    /// Server-side calls per lock + release.
    pub(crate) server_per_pair: f64,
}

/// Everything [`run`] measured.
#[derive(Clone, Debug)]
pub(crate) struct Report {
    pub(crate) points: Vec<Point>,
    /// The comparison matrix's points ([`Config::compare`]).
    pub(crate) compare: Vec<Point>,
    pub(crate) wake: Wake,
    pub(crate) uncontended: Vec<Uncontended>,
    pub(crate) markdown: String,
    pub(crate) chart: Option<PathBuf>,
    pub(crate) total: Duration,
}

fn pct(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn sorted(v: &[i64]) -> Vec<i64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v
}

/// Runs the configured matrix, the wake-up scenario and the uncontended check; writes
/// the results; fails (with every violation listed) if correctness was violated.
pub(crate) fn run(cfg: &Config) -> Result<Report, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(coordinate(cfg))
}

struct Run<'a> {
    cfg: &'a Config,
    url: String,
    admin: redis::aio::MultiplexedConnection,
    run_id: String,
    pb: ProgressBar,
    next_prefix: u64,
}

impl Run<'_> {
    fn say(&self, line: String) {
        if self.pb.is_hidden() {
            eprintln!("{line}");
        } else {
            self.pb.println(line);
        }
    }

    fn prefix(&mut self) -> String {
        self.next_prefix += 1;
        format!("lfbench:{}:{}", self.run_id, self.next_prefix)
    }
}

async fn coordinate(cfg: &Config) -> Result<Report, String> {
    let started = Instant::now();
    let server = match &cfg.redis_url {
        Some(_) => None,
        None => Some(support::RedisServer::start()),
    };
    let url = match (&cfg.redis_url, &server) {
        (Some(u), _) => u.clone(),
        (None, Some(s)) => s.url(),
        (None, None) => unreachable!(),
    };
    let admin = data_connection(&url).await?;
    let distributed: Vec<Mode> = cfg
        .modes
        .iter()
        .copied()
        .filter(|&m| m.is_lockflight())
        .collect();
    let steps = cfg.workloads.len() * cfg.tasks.len() * cfg.modes.len() * cfg.repeat
        + cfg.compare.iter().map(|c| c.modes.len()).sum::<usize>() * cfg.repeat
        + 2;
    let pb = ProgressBar::new(steps as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} (eta {eta}) {msg}",
        )
        .map_err(|e| e.to_string())?,
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    let mut run = Run {
        cfg,
        url,
        admin,
        run_id: format!("{}-{}", std::process::id(), unix_us() % 1_000_000_000),
        pb,
        next_prefix: 0,
    };
    run.say(format!(
        "lockflight contention bench{}: P={} T={:?} {:.1} s/point, workloads {:?}, modes {:?}, redis {}",
        if cfg.smoke { " (smoke)" } else { "" },
        cfg.procs,
        cfg.tasks,
        cfg.secs,
        cfg.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        cfg.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        run.url,
    ));

    let mut violations = Vec::new();
    let mut uncontended = Vec::new();
    run.pb.set_message("uncontended lock + release");
    for &mode in &distributed {
        let u = measure_uncontended(&mut run, mode).await?;
        if u.min_requests != 2 || u.max_requests != 2 {
            violations.push(format!(
                "uncontended lock + release ({}) took {}..{} backend round trips, not exactly 2",
                mode.name(),
                u.min_requests,
                u.max_requests
            ));
        }
        uncontended.push(u);
    }
    run.pb.inc(1);
    run.pb.set_message("wake-up after a remote release");
    let wake = measure_wake(&mut run).await?;
    run.pb.inc(1);

    let mut compare = Vec::new();
    for cell in &cfg.compare {
        compare.extend(
            run_cell(
                &mut run,
                cell.workload,
                cell.procs,
                cell.tasks,
                &cell.modes,
                &mut violations,
            )
            .await?,
        );
    }
    let mut points = Vec::new();
    for &workload in &cfg.workloads {
        for &t in &cfg.tasks {
            let modes = cfg.modes.clone();
            points
                .extend(run_cell(&mut run, workload, cfg.procs, t, &modes, &mut violations).await?);
        }
    }
    run.pb.finish_and_clear();
    drop(server);

    let total = started.elapsed();
    let mut report = Report {
        points,
        compare,
        wake,
        uncontended,
        markdown: String::new(),
        chart: None,
        total,
    };
    report.markdown = markdown(cfg, &report, &violations);
    write_outputs(cfg, &mut report)?;
    if violations.is_empty() {
        Ok(report)
    } else {
        Err(format!(
            "{} correctness violation(s):\n  - {}",
            violations.len(),
            violations.join("\n  - ")
        ))
    }
}

/// Runs one (workload, P, T) point in each of `modes`, interleaved, `repeat` rounds;
/// returns, per mode, the round with the median throughput (with every round's
/// throughput in `rounds`).
async fn run_cell(
    run: &mut Run<'_>,
    workload: Workload,
    procs: usize,
    t: usize,
    modes: &[Mode],
    violations: &mut Vec<String>,
) -> Result<Vec<Point>, String> {
    let repeat = run.cfg.repeat;
    let mut rounds: Vec<Vec<Point>> = vec![Vec::new(); modes.len()];
    for round in 0..repeat {
        for (m, &mode) in modes.iter().enumerate() {
            run.pb.set_message(format!(
                "{} {} P={procs} T={t} round {}/{}",
                workload.name(),
                mode.name(),
                round + 1,
                repeat
            ));
            let (point, bad) = run_point(run, workload, mode, procs, t).await?;
            run.say(format!(
                "{:<20} {:<9} P={} T={:<3} {:>9.0} cs/s  wait p50 {:>7} p99 {:>7}  req/cs {:>7.3}  server lock cmds/cs {:>7.2}  shares {}{}",
                workload.name(),
                mode.name(),
                point.procs,
                point.tasks,
                point.throughput,
                fmt_us(point.wait_p50_us as i64),
                fmt_us(point.wait_p99_us as i64),
                point.requests_per_cs(),
                point.server_lock_per_cs(),
                fmt_shares(&point.shares()),
                if bad.is_empty() { "" } else { "  *** CORRECTNESS VIOLATION ***" },
            ));
            violations.extend(bad);
            rounds[m].push(point);
            run.pb.inc(1);
        }
    }
    Ok(rounds
        .into_iter()
        .map(|mut r| {
            let all: Vec<f64> = r.iter().map(|p| p.throughput).collect();
            r.sort_by(|a, b| a.throughput.total_cmp(&b.throughput));
            let mut median = r.swap_remove(r.len() / 2);
            median.rounds = all;
            median
        })
        .collect())
}

/// A message from a worker's stdout.
enum Msg {
    Ready,
    Result(Box<Value>),
    Error(String),
    Eof,
}

async fn run_point(
    run: &mut Run<'_>,
    workload: Workload,
    mode: Mode,
    p: usize,
    t: usize,
) -> Result<(Point, Vec<String>), String> {
    let cfg = run.cfg;
    let prefix = run.prefix();
    let (procs, tasks) = if mode == Mode::Floor {
        (1, p * t)
    } else {
        (p, t)
    };
    let what = format!("{} {} P={procs} T={tasks}", workload.name(), mode.name());
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Msg)>();
    let mut children = Vec::new();
    let mut stdins = Vec::new();
    for id in 0..procs {
        let mut cmd = tokio::process::Command::from((cfg.worker)());
        cmd.env(WORKER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("{what}: spawn worker: {e}"))?;
        let mut stdin = child.stdin.take().ok_or("no worker stdin")?;
        let spec = json!({
            "id": id, "url": run.url, "prefix": prefix, "workload": workload.name(),
            "mode": mode.name(), "tasks": tasks, "threads": cfg.worker_threads, "seed": unix_us() ^ (id as u64) << 40,
        });
        stdin
            .write_all(format!("{spec}\n").as_bytes())
            .await
            .map_err(|e| format!("{what}: write spec: {e}"))?;
        stdin.flush().await.map_err(|e| e.to_string())?;
        stdins.push(stdin);
        let stdout = child.stdout.take().ok_or("no worker stdout")?;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Some(at) = line.find(MARK) else { continue };
                let rest = &line[at + MARK.len()..];
                let (kind, payload) = rest.split_once(' ').unwrap_or((rest, ""));
                let msg = match kind {
                    "READY" => Msg::Ready,
                    "RESULT" => match serde_json::from_str(payload) {
                        Ok(v) => Msg::Result(Box::new(v)),
                        Err(e) => Msg::Error(format!("unparsable result: {e}")),
                    },
                    _ => Msg::Error(payload.to_owned()),
                };
                if tx.send((id, msg)).is_err() {
                    return;
                }
            }
            let _ = tx.send((id, Msg::Eof));
        });
        children.push(child);
    }
    drop(tx);

    // Start barrier: everyone connected and subscribed.
    let mut ready = 0;
    while ready < procs {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Err(_) => return Err(format!("{what}: workers not ready within 60 s")),
            Ok(None) => return Err(format!("{what}: workers gone before ready")),
            Ok(Some((_, Msg::Ready))) => ready += 1,
            Ok(Some((id, Msg::Error(e)))) => return Err(format!("{what}: worker {id}: {e}")),
            Ok(Some((id, _))) => {
                return Err(format!("{what}: worker {id} exited before it was ready"));
            }
        }
    }
    let before = commandstats(&mut run.admin).await?;
    let start = unix_us() + 50_000;
    let end = start + (cfg.secs * 1e6) as u64;
    for stdin in &mut stdins {
        stdin
            .write_all(format!("GO {start} {end}\n").as_bytes())
            .await
            .map_err(|e| format!("{what}: write GO: {e}"))?;
        stdin.flush().await.map_err(|e| e.to_string())?;
    }
    drop(stdins);

    let mut results: Vec<Option<Value>> = vec![None; procs];
    let mut got = 0;
    let limit = Duration::from_secs_f64(cfg.secs) + Duration::from_secs(90);
    while got < procs {
        match tokio::time::timeout(limit, rx.recv()).await {
            Err(_) => return Err(format!("{what}: no result within {limit:?}")),
            Ok(None) => return Err(format!("{what}: workers gone before their result")),
            Ok(Some((id, Msg::Result(v)))) => {
                results[id] = Some(*v);
                got += 1;
            }
            Ok(Some((id, Msg::Error(e)))) => return Err(format!("{what}: worker {id}: {e}")),
            Ok(Some((id, Msg::Eof))) => {
                if results[id].is_none() {
                    return Err(format!("{what}: worker {id} exited without a result"));
                }
            }
            Ok(Some((_, Msg::Ready))) => {}
        }
    }
    let after = commandstats(&mut run.admin).await?;
    for mut child in children {
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => return Err(format!("{what}: a worker exited with {status}")),
            Ok(Err(e)) => return Err(format!("{what}: waiting for a worker: {e}")),
            Err(_) => return Err(format!("{what}: a worker did not exit after its result")),
        }
    }
    let results: Vec<Value> = results.into_iter().flatten().collect();

    let mut server: BTreeMap<String, u64> = BTreeMap::new();
    for (name, &calls) in &after {
        let delta = calls.saturating_sub(before.get(name).copied().unwrap_or(0));
        if delta > 0 && name != "info" {
            server.insert(name.clone(), delta);
        }
    }
    let (point, mut bad) = summarize(workload, mode, t, procs, tasks, &results, server)?;
    bad.extend(verify(run, workload, mode, &prefix, &results).await?);
    Ok((
        point,
        bad.into_iter().map(|b| format!("{what}: {b}")).collect(),
    ))
}

fn u64_at(v: &Value, path: &[&str]) -> u64 {
    let mut v = v;
    for p in path {
        v = &v[*p];
    }
    v.as_u64().unwrap_or(0)
}

fn summarize(
    workload: Workload,
    mode: Mode,
    t: usize,
    procs: usize,
    tasks: usize,
    results: &[Value],
    server: BTreeMap<String, u64>,
) -> Result<(Point, Vec<String>), String> {
    let mut bad = Vec::new();
    let mut hist = new_histogram();
    let mut requests = [0u64; 4];
    let mut per_proc = Vec::new();
    let mut elapsed_us = 0;
    let (mut handoffs, mut local_waits, mut acquired) = (0, 0, 0);
    for r in results {
        let id = u64_at(r, &["id"]);
        per_proc.push(u64_at(r, &["sections"]));
        elapsed_us = elapsed_us.max(u64_at(r, &["elapsed_us"]));
        for pair in r["hist"].as_array().into_iter().flatten() {
            let (v, n) = (pair[0].as_u64().unwrap_or(1), pair[1].as_u64().unwrap_or(0));
            hist.record_n(v, n).map_err(|e| e.to_string())?;
        }
        for (i, n) in r["requests"].as_array().into_iter().flatten().enumerate() {
            requests[i] += n.as_u64().unwrap_or(0);
        }
        for e in r["errors"].as_array().into_iter().flatten() {
            bad.push(format!("worker {id}: {}", e.as_str().unwrap_or("?")));
        }
        let stats = &r["stats"];
        if !stats.is_null() {
            handoffs += u64_at(stats, &["handoffs"]);
            local_waits += u64_at(stats, &["local_waits"]);
            acquired += u64_at(stats, &["acquired"]);
            for (name, what) in [
                ("leases_lost", "leases lost"),
                ("timeouts", "timeouts"),
                ("active_keys", "slots left in the map"),
            ] {
                let n = u64_at(stats, &[name]);
                if n > 0 {
                    bad.push(format!("worker {id}: {n} {what}"));
                }
            }
        }
    }
    let sections: u64 = per_proc.iter().sum();
    let elapsed_s = elapsed_us as f64 / 1e6;
    let point = Point {
        workload,
        mode,
        procs,
        tasks,
        t,
        sections,
        elapsed_s,
        throughput: if elapsed_s > 0.0 {
            sections as f64 / elapsed_s
        } else {
            0.0
        },
        wait_p50_us: hist.value_at_quantile(0.5),
        wait_p99_us: hist.value_at_quantile(0.99),
        wait_max_us: hist.max(),
        requests,
        server,
        handoffs,
        local_waits,
        acquired,
        per_proc,
        rounds: Vec::new(),
    };
    if sections == 0 {
        bad.push("no critical section completed".into());
    }
    Ok((point, bad))
}

/// The correctness oracle (see the module docs).
async fn verify(
    run: &mut Run<'_>,
    workload: Workload,
    mode: Mode,
    prefix: &str,
    results: &[Value],
) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    // key -> [(value read, epoch, seq, worker)]
    let mut by_key: HashMap<u64, Vec<(u64, u64, u64, u64)>> = HashMap::new();
    for r in results {
        let id = u64_at(r, &["id"]);
        for rec in r["records"].as_array().into_iter().flatten() {
            let f = |i: usize| rec[i].as_u64().unwrap_or(u64::MAX);
            by_key.entry(f(0)).or_default().push((f(1), f(2), f(3), id));
        }
    }
    // Every counter in Redis (also ones whose sections were not reported).
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:ctr:*"))
        .query_async(&mut run.admin)
        .await
        .map_err(|e| format!("KEYS: {e}"))?;
    let mut counters: HashMap<String, u64> = HashMap::new();
    for chunk in names.chunks(1000) {
        let values: Vec<Option<u64>> = redis::cmd("MGET")
            .arg(chunk)
            .query_async(&mut run.admin)
            .await
            .map_err(|e| format!("MGET: {e}"))?;
        for (n, v) in chunk.iter().zip(values) {
            counters.insert(n.clone(), v.unwrap_or(0));
        }
    }
    let counter_total: u64 = counters.values().sum();
    let sections: u64 = by_key.values().map(|v| v.len() as u64).sum();
    if counter_total != sections {
        bad.push(format!(
            "the counters add up to {counter_total} but {sections} critical sections ran \
             (lost updates: mutual exclusion was violated)"
        ));
    }
    let mut reported = 0;
    for (&k, recs) in &mut by_key {
        let name = counter_name(prefix, workload, k as usize);
        let counter = counters.get(&name).copied().unwrap_or(0);
        if counter != recs.len() as u64 {
            bad.push(format!(
                "counter {name} is {counter} but {} critical sections ran on it",
                recs.len()
            ));
        }
        recs.sort_unstable();
        for (i, w) in recs.iter().enumerate() {
            if w.0 != i as u64 && reported < 10 {
                reported += 1;
                bad.push(format!(
                    "key {k}: critical section #{i} (in counter order) read {} (sections overlapped)",
                    w.0
                ));
                break;
            }
        }
        if mode.is_lockflight() {
            for pair in recs.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                if (a.1, a.2) >= (b.1, b.2) && reported < 10 {
                    reported += 1;
                    bad.push(format!(
                        "key {k}: fencing token {}.{} (worker {}, value {}) is not below the \
                         next section's {}.{} (worker {}, value {})",
                        a.1, a.2, a.3, a.0, b.1, b.2, b.3, b.0
                    ));
                }
            }
        }
    }
    if mode != Mode::Floor {
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:{{*}}"))
            .query_async(&mut run.admin)
            .await
            .map_err(|e| format!("KEYS: {e}"))?;
        if !left.is_empty() {
            bad.push(format!(
                "{} lock key(s) remain after every worker released: {:?}",
                left.len(),
                &left[..left.len().min(5)]
            ));
        }
    }
    Ok(bad)
}

async fn commandstats(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<BTreeMap<String, u64>, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| format!("INFO commandstats: {e}"))?;
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        if let Some(calls) = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.parse().ok())
        {
            out.insert(name.to_owned(), calls);
        }
    }
    Ok(out)
}

async fn counting_locker(
    url: &str,
    prefix: &str,
    mode: Mode,
) -> Result<(Locker, RedisBackend, Arc<Counts>), String> {
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !backend.is_subscribed() {
        if Instant::now() > deadline {
            return Err("not subscribed after 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (counting, counts) = Counting::new(backend.clone());
    let locker = mode.locker(counting).map_err(|e| e.to_string())?;
    Ok((locker, backend, counts))
}

async fn measure_uncontended(run: &mut Run<'_>, mode: Mode) -> Result<Uncontended, String> {
    let prefix = run.prefix();
    let (locker, _backend, counts) = counting_locker(&run.url, &prefix, mode).await?;
    let key = LockKey::from("uncontended");
    for _ in 0..10 {
        locker
            .lock(&key)
            .await
            .map_err(|e| e.to_string())?
            .release()
            .await
            .map_err(|e| e.to_string())?;
    }
    let reps = run.cfg.uncontended_reps;
    let (mut min, mut max) = (u64::MAX, 0);
    let mut latency = Vec::with_capacity(reps);
    let before = commandstats(&mut run.admin).await?;
    for _ in 0..reps {
        let n0 = counts.total();
        let t0 = Instant::now();
        let g = locker.lock(&key).await.map_err(|e| e.to_string())?;
        g.release().await.map_err(|e| e.to_string())?;
        latency.push(t0.elapsed().as_micros() as i64);
        let n = counts.total() - n0;
        min = min.min(n);
        max = max.max(n);
    }
    let after = commandstats(&mut run.admin).await?;
    let server: u64 = after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, &c)| c.saturating_sub(before.get(name).copied().unwrap_or(0)))
        .sum();
    Ok(Uncontended {
        mode,
        reps,
        min_requests: min,
        max_requests: max,
        latency_us: latency,
        server_per_pair: server as f64 / reps.max(1) as f64,
    })
}

async fn measure_wake(run: &mut Run<'_>) -> Result<Wake, String> {
    let prefix = run.prefix();
    let (a, _, _) = counting_locker(&run.url, &prefix, Mode::Coalesced).await?;
    let (b, b_backend, b_counts) = counting_locker(&run.url, &prefix, Mode::Coalesced).await?;
    let b = Arc::new(b);
    let key = LockKey::from("wake");
    let queue = format!("{prefix}:{{wake}}:wq");
    let b_id = b_backend.instance_id().to_owned();
    let reps = run.cfg.wake_reps;
    let mut wake = Vec::with_capacity(reps);
    let b_before = b_counts.total();
    for _ in 0..reps {
        let guard = a.lock(&key).await.map_err(|e| e.to_string())?;
        let (bb, k) = (Arc::clone(&b), key.clone());
        let waiter = tokio::spawn(async move {
            let g = bb.lock(&k).await;
            (g, Instant::now())
        });
        // B waits in lock(): its queue entry exists and it has had time to park.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let queued: Option<String> = redis::cmd("ZSCORE")
                .arg(&queue)
                .arg(&b_id)
                .query_async(&mut run.admin)
                .await
                .map_err(|e| e.to_string())?;
            if queued.is_some() {
                break;
            }
            if Instant::now() > deadline {
                return Err("wake-up scenario: B never queued".into());
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
        guard.release().await.map_err(|e| e.to_string())?;
        let released = Instant::now();
        let (g, woke) = waiter.await.map_err(|e| e.to_string())?;
        let g = g.map_err(|e| format!("wake-up scenario: B's lock(): {e}"))?;
        wake.push(if woke >= released {
            (woke - released).as_micros() as i64
        } else {
            -((released - woke).as_micros() as i64)
        });
        g.release().await.map_err(|e| e.to_string())?;
    }
    let b_requests = b_counts.total() - b_before;
    let mut ping = Vec::with_capacity(reps);
    for _ in 0..reps.max(100) {
        let t0 = Instant::now();
        redis::cmd("PING")
            .query_async::<String>(&mut run.admin)
            .await
            .map_err(|e| e.to_string())?;
        ping.push(t0.elapsed().as_micros() as i64);
    }
    Ok(Wake {
        reps,
        wake_us: wake,
        ping_us: ping,
        // Per repetition B also released once (not part of the wait).
        b_requests_per_rep: b_requests as f64 / reps.max(1) as f64 - 1.0,
    })
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

fn fmt_us(us: i64) -> String {
    if us.abs() >= 10_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else if us.abs() >= 1000 {
        format!("{:.2} ms", us as f64 / 1000.0)
    } else {
        format!("{us} µs")
    }
}

/// Median throughput, with the range over the rounds when there were several.
fn fmt_cs(p: &Point) -> String {
    let lo = p.rounds.iter().copied().fold(f64::MAX, f64::min);
    let hi = p.rounds.iter().copied().fold(0.0, f64::max);
    if p.rounds.len() > 1 {
        format!(
            "{} ({}–{})",
            fmt_rate(p.throughput),
            fmt_rate(lo),
            fmt_rate(hi)
        )
    } else {
        fmt_rate(p.throughput)
    }
}

fn fmt_shares(shares: &[f64]) -> String {
    shares
        .iter()
        .map(|s| format!("{:.0}%", s * 100.0))
        .collect::<Vec<_>>()
        .join("/")
}

fn fmt_rate(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `YYYY-MM-DD HH:MM UTC` from the system clock.
fn utc_now() -> String {
    let secs = unix_us() / 1_000_000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .map(|l| l.trim().to_owned())
        })
        .unwrap_or_default();
    let cmd = |c: &str, arg: &str| {
        std::process::Command::new(c)
            .arg(arg)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    json!({
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu": cpu,
        "mem": mem,
        "redis_server": cmd("redis-server", "--version"),
        "rustc": cmd("rustc", "--version"),
    })
}

/// The point of (workload, mode) at matrix T `t`.
fn find(points: &[Point], w: Workload, m: Mode, t: usize) -> Option<&Point> {
    points
        .iter()
        .find(|p| p.workload == w && p.mode == m && p.t == t)
}

struct Target {
    name: String,
    goal: String,
    measured: String,
    met: Option<bool>,
}

fn targets(cfg: &Config, r: &Report) -> Vec<Target> {
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
        measured: "see `cargo bench --bench micro`".into(),
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

/// The point of (workload, mode, P, T) in the comparison matrix.
fn cell(r: &Report, w: Workload, m: Mode, p: usize, t: usize) -> Option<&Point> {
    let procs = if m == Mode::Floor { 1 } else { p };
    r.compare.iter().find(|x| {
        x.workload == w
            && x.mode == m
            && x.procs == procs
            && if m == Mode::Floor {
                x.tasks == p * t
            } else {
                x.tasks == t
            }
    })
}

/// Server commands per critical section, the critical section's GET + SET included.
fn server_per_cs(p: &Point) -> f64 {
    p.server.values().sum::<u64>() as f64 / p.sections.max(1) as f64
}

/// The comparison table and the targets of issue #13.
fn compare_markdown(s: &mut String, r: &Report) {
    let _ = writeln!(
        s,
        "### The default configuration against a plain Redis lock (issue #13)\n"
    );
    let _ = writeln!(
        s,
        "cs/s of the median round (range over the rounds), `plain` = `SET NX PX` + 1 ms \
         retry + Lua compare-and-delete on redis-rs; `default` = \
         `Locker::builder(backend).build()`; `naive` = `coalescing(false)`; `floor` = one \
         process, P·T tasks, a `tokio::sync::Mutex`. ×plain = default / plain.\n"
    );
    let _ = writeln!(
        s,
        "| workload | P×T | floor | plain | default | ×plain | coalesced | naive | default % of floor |\n|---|---|--:|--:|--:|--:|--:|--:|--:|"
    );
    let mut seen: Vec<(Workload, usize, usize)> = Vec::new();
    for p in &r.compare {
        let key = if p.mode == Mode::Floor {
            continue;
        } else {
            (p.workload, p.procs, p.tasks)
        };
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
    }
    let get = |w, m, p, t| cell(r, w, m, p, t);
    let rate = |x: Option<&Point>| x.map_or("—".to_owned(), fmt_cs);
    for &(w, p, t) in &seen {
        if get(w, Mode::Plain, p, t).is_none() {
            continue;
        }
        let d = get(w, Mode::Default, p, t);
        let pl = get(w, Mode::Plain, p, t);
        let f = get(w, Mode::Floor, p, t);
        let ratio = |a: Option<&Point>, b: Option<&Point>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}×", a.throughput / b.throughput.max(1e-9)),
            _ => "—".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {p}×{t} | {} | {} | {} | {} | {} | {} | {} |",
            w.name(),
            rate(f),
            rate(pl),
            rate(d),
            ratio(d, pl),
            rate(get(w, Mode::Coalesced, p, t)),
            rate(get(w, Mode::Naive, p, t)),
            match (d, f) {
                (Some(d), Some(f)) =>
                    format!("{:.0} %", d.throughput / f.throughput.max(1e-9) * 100.0),
                _ => "—".into(),
            },
        );
    }
    s.push('\n');
    let _ = writeln!(
        s,
        "| workload | P×T | mode | wait p50 | wait p99 | server cmds/cs (CS's GET+SET incl.) | lock req/cs | handoffs/cs | shares |\n|---|---|---|--:|--:|--:|--:|--:|---|"
    );
    for p in &r.compare {
        let per = |n: u64| n as f64 / p.sections.max(1) as f64;
        let _ = writeln!(
            s,
            "| {} | {}×{} | {} | {} | {} | {:.2} | {:.3} | {:.3} | {} |",
            p.workload.name(),
            p.procs,
            p.tasks,
            p.mode.name(),
            fmt_us(p.wait_p50_us as i64),
            fmt_us(p.wait_p99_us as i64),
            server_per_cs(p),
            p.requests_per_cs(),
            per(p.handoffs),
            fmt_shares(&p.shares()),
        );
    }
    s.push('\n');

    // The targets.
    let mut t: Vec<Target> = Vec::new();
    let rmw = Workload::HotkeyRmw;
    for (w, p, n, goal) in [
        (rmw, 1, 8, 2.0),
        (rmw, 1, 64, 2.0),
        (rmw, 4, 8, 2.0),
        (rmw, 4, 64, 2.0),
        (Workload::HotkeyHold, 4, 64, 1.1),
    ] {
        if let (Some(d), Some(pl)) = (get(w, Mode::Default, p, n), get(w, Mode::Plain, p, n)) {
            let x = d.throughput / pl.throughput.max(1e-9);
            let p99 = d.wait_p99_us as f64 / (pl.wait_p99_us.max(1) as f64);
            let shares = d.shares();
            let fair = p == 1 || shares.iter().all(|s| (0.15..=0.35).contains(s));
            t.push(Target {
                name: format!("1. default vs plain lock, {} {p}×{n}", w.name()),
                goal: format!("≥ {goal}× throughput, wait p99 ≤ 1/10, shares 15–35 %"),
                measured: format!(
                    "{x:.2}× ({} vs {}); p99 {} vs {} (= {:.2}); shares {}",
                    fmt_rate(d.throughput),
                    fmt_rate(pl.throughput),
                    fmt_us(d.wait_p99_us as i64),
                    fmt_us(pl.wait_p99_us as i64),
                    p99,
                    fmt_shares(&shares)
                ),
                met: Some(x >= goal && p99 <= 0.1 && fair),
            });
        }
    }
    if let (Some(d), Some(f)) = (get(rmw, Mode::Default, 4, 64), get(rmw, Mode::Floor, 4, 64)) {
        let x = d.throughput / f.throughput.max(1e-9);
        t.push(Target {
            name: "2. default (handoff) vs in-process floor, 4×64".into(),
            goal: "≥ 95 %".into(),
            measured: format!(
                "{:.0} % ({} vs {})",
                x * 100.0,
                fmt_rate(d.throughput),
                fmt_rate(f.throughput)
            ),
            met: Some(x >= 0.95),
        });
    }
    if let Some(d) = get(rmw, Mode::Default, 4, 64) {
        let all = server_per_cs(d);
        t.push(Target {
            name: "3. server commands per critical section, default, 4×64".into(),
            goal: "≤ 4 (lock side ≤ 2)".into(),
            measured: format!("{all:.2} (lock side {:.2})", d.server_lock_per_cs()),
            met: Some(all <= 4.0 && d.server_lock_per_cs() <= 2.0),
        });
    }
    for m in [Mode::Coalesced, Mode::Default] {
        let pts: Vec<&Point> = [4, 16, 64]
            .into_iter()
            .filter_map(|p| get(rmw, m, p, 2))
            .collect();
        if pts.len() == 3 {
            let v: Vec<f64> = pts.iter().map(|p| p.server_lock_per_cs()).collect();
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            t.push(Target {
                name: format!(
                    "4. lock commands/cs with 4, 16, 64 instances × 2 tasks, {}",
                    m.name()
                ),
                goal: "flat within 20 %".into(),
                measured: format!(
                    "{} (max/min {:.2})",
                    v.iter()
                        .map(|x| format!("{x:.2}"))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    hi / lo.max(1e-9)
                ),
                met: Some(hi <= lo * 1.2),
            });
        }
    }
    if let (Some(n), Some(pl)) = (get(rmw, Mode::Naive, 4, 64), get(rmw, Mode::Plain, 4, 64)) {
        t.push(Target {
            name: "5. `coalescing(false)` vs plain lock, 4×64".into(),
            goal: "no worse (or not public API)".into(),
            measured: format!(
                "{:.2}× ({} vs {}); the mode is `#[doc(hidden)]`, a benchmark baseline",
                n.throughput / pl.throughput.max(1e-9),
                fmt_rate(n.throughput),
                fmt_rate(pl.throughput)
            ),
            met: Some(n.throughput >= pl.throughput),
        });
    }
    if let (Some(d), Some(pl)) = (get(rmw, Mode::Default, 1, 1), get(rmw, Mode::Plain, 1, 1)) {
        let x = d.throughput / pl.throughput.max(1e-9);
        t.push(Target {
            name: "6. uncontended (1×1), default vs plain lock".into(),
            goal: "within 5 %".into(),
            measured: format!(
                "{:.0} % ({} vs {} cs/s); lock wait p50 {} vs {}; server cmds/cs {:.1} vs {:.1}",
                x * 100.0,
                fmt_rate(d.throughput),
                fmt_rate(pl.throughput),
                fmt_us(d.wait_p50_us as i64),
                fmt_us(pl.wait_p50_us as i64),
                server_per_cs(d),
                server_per_cs(pl)
            ),
            met: Some(x >= 0.95),
        });
    }
    let _ = writeln!(s, "#### Issue #13 targets\n");
    let _ = writeln!(s, "| target | goal | measured | met |\n|---|---|---|---|");
    for x in t {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            x.name,
            x.goal,
            x.measured,
            if x.met == Some(true) {
                "met"
            } else {
                "**not met**"
            }
        );
    }
    s.push('\n');
}

fn markdown(cfg: &Config, r: &Report, violations: &[String]) -> String {
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
            "| mode | P×T | cs/s | wait p50 | wait p99 | wait max | lock req/cs (acq/rel/ext/leave) | \
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
    s
}

fn write_outputs(cfg: &Config, r: &mut Report) -> Result<(), String> {
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

fn chart(cfg: &Config, r: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let colors = |m: Mode| match m {
        Mode::Naive => RGBColor(214, 39, 40),
        Mode::Coalesced => RGBColor(31, 119, 180),
        Mode::Handoff => RGBColor(44, 160, 44),
        Mode::Default => RGBColor(44, 160, 44),
        Mode::Plain => RGBColor(255, 127, 14),
        Mode::Floor => RGBColor(100, 100, 100),
    };
    let rows = cfg.workloads.len();
    let root = SVGBackend::new(path, (1200, 360 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((rows, 2));
    let tmin = *cfg.tasks.iter().min().unwrap_or(&1) as f64;
    let tmax = *cfg.tasks.iter().max().unwrap_or(&1) as f64;
    let x_range = (tmin * 0.8)..(tmax * 1.25);
    for (row, &w) in cfg.workloads.iter().enumerate() {
        let series = |m: Mode, f: &dyn Fn(&Point) -> f64| -> Vec<(f64, f64)> {
            cfg.tasks
                .iter()
                .filter_map(|&t| find(&r.points, w, m, t).map(|p| (t as f64, f(p))))
                .collect()
        };
        // Throughput.
        let ymax = r
            .points
            .iter()
            .filter(|p| p.workload == w)
            .map(|p| p.throughput)
            .fold(1.0, f64::max)
            * 1.6; // room for the legend above the lines
        let mut c = ChartBuilder::on(&areas[row * 2])
            .caption(
                format!("{}: critical sections / s (P={})", w.name(), cfg.procs),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x_range.clone().log_scale(), 0.0..ymax)?;
        c.configure_mesh()
            .x_desc("T (tasks per process)")
            .y_desc("cs/s")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for &m in &cfg.modes {
            let pts = series(m, &|p| p.throughput);
            let col = colors(m);
            let label = if m == Mode::Floor {
                "floor (tokio Mutex, 1 process, P·T tasks)".to_owned()
            } else {
                m.name().to_owned()
            };
            c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
            c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, col.filled())))?;
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        // Requests per critical section (log).
        let vals: Vec<f64> = r
            .points
            .iter()
            .filter(|p| p.workload == w && p.mode != Mode::Floor)
            .map(|p| p.requests_per_cs())
            .filter(|v| *v > 0.0)
            .collect();
        let lo = vals.iter().copied().fold(f64::MAX, f64::min).min(0.1) / 2.0;
        let hi = vals.iter().copied().fold(1.0, f64::max) * 2.0;
        let mut c = ChartBuilder::on(&areas[row * 2 + 1])
            .caption(
                format!("{}: Redis lock requests / critical section", w.name()),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x_range.clone().log_scale(), (lo..hi).log_scale())?;
        c.configure_mesh()
            .x_desc("T (tasks per process)")
            .y_desc("requests / cs")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.3}"))
            .draw()?;
        for &m in cfg.modes.iter().filter(|&&m| m != Mode::Floor) {
            let pts: Vec<(f64, f64)> = series(m, &|p| p.requests_per_cs())
                .into_iter()
                .filter(|p| p.1 > 0.0)
                .collect();
            let col = colors(m);
            c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
                .label(m.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
            c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, col.filled())))?;
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
