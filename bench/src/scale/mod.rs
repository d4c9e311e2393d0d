//! Scale curves (`benches/scale.rs` is their binary, `tests/scale_smoke.rs` runs
//! them at tiny sizes): how lockflight's cost grows with its work, each measured
//! in this process against a private `redis-server` (`testkit`) started for it.
//!
//! ```text
//! cargo bench -p bench --bench scale                                   # keys up to 10^5
//! LOCKFLIGHT_SCALE_KEYS_MAX=1000000 cargo bench -p bench --bench scale # keys up to 10^6
//! LOCKFLIGHT_SCALE_CURVES=keys,held cargo bench -p bench --bench scale
//! ```
//!
//! The curves, each with the default `Locker` over a `RedisBackend` unless said:
//!
//! * **keys** ([`keys`]): 64 tasks lock and release N distinct keys (N = 10^3 …
//!   10^6), each once; then N other keys. Reported: sections per second (first
//!   pass), this process's RSS (`VmRSS`) before, after the first pass and after
//!   the second, with the locker alive (per-key maps must not keep released keys:
//!   the first pass's growth may be the allocator keeping freed pages, a second
//!   pass that grows it again would be per-key residue); `Stats::keys_in_use`;
//!   the lock names left in Redis; Redis `used_memory` before, right after, and
//!   once the release records (one per release, about 12 s) expired, with
//!   `DBSIZE` (the fences stay 10 lease TTLs, at least 60 s). One fresh server
//!   per point.
//! * **waiters** ([`waiters`]): T tasks (1 … 10^5) wait on one key behind a holder
//!   of this process (the locker's `max_waiters` raised to T, its wait timeout to
//!   an hour). Reported: RSS per parked waiter; after the holder's release, the
//!   time per section until all T ran one (handoff: flat in T); then T other
//!   waiters parked and all aborted: the time to cancel them, the RSS left, and
//!   that the holder's release then finds no waiter and the key is free at once.
//! * **held** ([`held`]): N leases (10^2 … 10^4) held at once with a 3 s TTL, so
//!   the watchdog renews them every 1.25 s (its 1 s interval plus one 250 ms scan
//!   tick: [`held::period`]). Reported: RSS and Redis `used_memory` per lease;
//!   per renewal period, the server's `EVALSHA` calls
//!   (`INFO commandstats`: renewals are batched, far fewer calls than leases),
//!   lockflight's renewal requests (`Stats::renew_attempts`), Redis CPU
//!   (`used_cpu_sys + used_cpu_user`) and this process's CPU (`/proc/self/stat`).
//! * **instances** ([`instances`]): P instances (1 … 16; each its own
//!   `RedisBackend`: connections, instance id, notification channel, in this one
//!   process) × 2 tasks on one hot key for a few seconds. Reported: sections per
//!   second, Redis commands (every command of `INFO commandstats`) and `PUBLISH`
//!   calls per backend release (notify-one: about one wake-up per release while
//!   others wait), the key's Redis wait queue (`ZCARD`, sampled every 10 ms: mean
//!   and largest), the smallest and largest instance's share of the sections, and
//!   the p99 of a task's wait from `lock` to holding.
//!
//! Knobs (environment): `LOCKFLIGHT_SCALE_CURVES` (comma list of `keys`, `waiters`,
//! `held`, `instances`; default all), `LOCKFLIGHT_SCALE_KEYS_MAX` (largest N of
//! the keys curve, default 100000), `LOCKFLIGHT_SCALE_WAITERS_MAX` (default
//! 100000), `LOCKFLIGHT_SCALE_HELD_MAX` (default 10000),
//! `LOCKFLIGHT_SCALE_INSTANCES_MAX` (default 16), `LOCKFLIGHT_SCALE_PERIODS`
//! (renewal periods measured, default 3), `LOCKFLIGHT_SCALE_HELD_TTL_SECS` (the
//! held leases' TTL, default 3), `LOCKFLIGHT_SCALE_SETTLE_SECS` (how
//! long the keys curve waits for the release records to expire, default 30; 0:
//! do not wait), `LOCKFLIGHT_SCALE_SECS` (seconds per instances point, default 2).
//!
//! Outputs: `target/lockflight-bench/scale/` (`scale.md`, `scale-keys.svg`,
//! `scale-waiters.svg`, `scale-held.svg`, `scale-instances.svg`).

pub mod held;
pub mod instances;
pub mod keys;
pub mod probe;
mod report;
pub mod waiters;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockflight::{Locker, LockerBuilder, RedisBackend};
use testkit::RedisServer;
use tokio::task::JoinSet;

pub use held::HeldRow;
pub use instances::InstancesRow;
pub use keys::KeysRow;
pub use report::{markdown, write};
pub use waiters::WaitersRow;

/// What to measure, from the `LOCKFLIGHT_SCALE_*` environment variables.
#[derive(Clone, Debug)]
pub struct Knobs {
    /// N of the keys curve (empty: not run).
    pub keys: Vec<u64>,
    /// T of the waiters curve.
    pub waiters: Vec<u64>,
    /// N of the held-leases curve.
    pub held: Vec<u64>,
    /// P of the instances curve.
    pub instances: Vec<u64>,
    /// Renewal periods measured per held-leases point.
    pub periods: u64,
    /// The lease TTL of the held-leases curve.
    pub held_ttl: Duration,
    /// Longest wait for the release records to expire (zero: no wait).
    pub settle: Duration,
    /// Seconds per instances point.
    pub secs: f64,
    /// Where `scale.md` and the charts go.
    pub out_dir: PathBuf,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn capped(sizes: &[u64], max: u64) -> Vec<u64> {
    sizes.iter().copied().filter(|&n| n <= max).collect()
}

impl Knobs {
    /// The run the environment asks for.
    pub fn from_env() -> Knobs {
        let curves = std::env::var("LOCKFLIGHT_SCALE_CURVES")
            .unwrap_or_else(|_| "keys,waiters,held,instances".to_owned());
        let on = |c: &str| curves.split(',').any(|x| x.trim() == c);
        let pick = |c: &str, sizes: &[u64], var: &str, max: u64| {
            if on(c) {
                capped(sizes, env_u64(var, max))
            } else {
                Vec::new()
            }
        };
        Knobs {
            keys: pick(
                "keys",
                &[1_000, 10_000, 100_000, 1_000_000],
                "LOCKFLIGHT_SCALE_KEYS_MAX",
                100_000,
            ),
            waiters: pick(
                "waiters",
                &[1, 10, 100, 1_000, 10_000, 100_000],
                "LOCKFLIGHT_SCALE_WAITERS_MAX",
                100_000,
            ),
            held: pick(
                "held",
                &[100, 1_000, 10_000, 100_000],
                "LOCKFLIGHT_SCALE_HELD_MAX",
                10_000,
            ),
            instances: pick(
                "instances",
                &[1, 2, 4, 8, 16],
                "LOCKFLIGHT_SCALE_INSTANCES_MAX",
                16,
            ),
            periods: env_u64("LOCKFLIGHT_SCALE_PERIODS", 3).max(1),
            held_ttl: Duration::from_secs(env_u64("LOCKFLIGHT_SCALE_HELD_TTL_SECS", 3).max(1)),
            settle: Duration::from_secs(env_u64("LOCKFLIGHT_SCALE_SETTLE_SECS", 30)),
            secs: std::env::var("LOCKFLIGHT_SCALE_SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2.0),
            out_dir: crate::config::target_dir()
                .join("lockflight-bench")
                .join("scale"),
        }
    }
}

/// Every curve's points.
#[derive(Clone, Debug, Default)]
pub struct Curves {
    /// The distinct-keys curve.
    pub keys: Vec<KeysRow>,
    /// The local-waiters curve.
    pub waiters: Vec<WaitersRow>,
    /// The held-leases curve.
    pub held: Vec<HeldRow>,
    /// The instances curve.
    pub instances: Vec<InstancesRow>,
}

/// Runs the curves `knobs` asks for, printing each point as it is measured.
pub async fn run(knobs: &Knobs) -> Result<Curves, String> {
    let mut curves = Curves::default();
    for &n in &knobs.keys {
        let server = RedisServer::start();
        let row = keys::measure(&server, n, knobs.settle).await?;
        eprintln!("keys {row:?}");
        curves.keys.push(row);
    }
    if !knobs.waiters.is_empty() {
        let server = RedisServer::start();
        for &t in &knobs.waiters {
            let row = waiters::measure(&server, t).await?;
            eprintln!("waiters {row:?}");
            curves.waiters.push(row);
        }
    }
    for &n in &knobs.held {
        let server = RedisServer::start();
        let row = held::measure(&server, n, knobs.held_ttl, knobs.periods).await?;
        eprintln!("held {row:?}");
        curves.held.push(row);
    }
    for &p in &knobs.instances {
        let server = RedisServer::start();
        let row = instances::measure(&server, p, knobs.secs).await?;
        eprintln!("instances {row:?}");
        curves.instances.push(row);
    }
    Ok(curves)
}

/// A locker over a new backend of `server` under `prefix`; `tune` adjusts the
/// default builder.
pub(crate) async fn connect(
    server: &RedisServer,
    prefix: &str,
    tune: impl FnOnce(LockerBuilder) -> LockerBuilder,
) -> Result<Locker, String> {
    let backend = RedisBackend::builder(server.url())
        .prefix(prefix)
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tune(Locker::builder(backend))
        .build()
        .map_err(|e| format!("build: {e}"))
}

/// Waits (at most 10 s) until the locker has no key in use: the leases it
/// cached after the last releases went back to Redis.
pub(crate) async fn idle(locker: &Locker) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    // Bounded by `deadline`.
    while locker.stats().keys_in_use > 0 {
        if Instant::now() > deadline {
            return Err(format!(
                "{} keys still in use 10 s after the last release",
                locker.stats().keys_in_use
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Joins every task of `set`; the first error is returned.
pub(crate) async fn join_all<T: 'static>(
    mut set: JoinSet<Result<T, String>>,
) -> Result<Vec<T>, String> {
    let mut out = Vec::with_capacity(set.len());
    // Bounded: the set holds a finite number of tasks.
    while let Some(joined) = set.join_next().await {
        out.push(joined.map_err(|e| format!("task: {e}"))??);
    }
    Ok(out)
}
