//! Curve 1, distinct keys: lock and release N distinct keys with 64 tasks, twice.

use std::time::{Duration, Instant};

use lockflight::{LockKey, Locker};
use testkit::RedisServer;
use tokio::task::JoinSet;

use super::probe::{count_matching, dbsize, lock_names_left, rss_bytes, used_memory};
use super::{connect, idle, join_all};

/// Tasks that share the keys of a pass.
pub const TASKS: usize = 64;

/// One point of the distinct-keys curve.
#[derive(Clone, Debug, Default)]
pub struct KeysRow {
    /// Distinct keys per pass.
    pub n: u64,
    /// Lock + release sections per second, first pass.
    pub throughput: f64,
    /// RSS with the locker warmed up, before the first pass (bytes).
    pub rss_before: u64,
    /// RSS once the first pass's keys are released, the locker alive.
    pub rss_after: u64,
    /// RSS after a second pass over N other keys: growth here would be per-key
    /// residue (the first pass's growth is partly the allocator keeping freed pages).
    pub rss_after_second: u64,
    /// `Stats::keys_in_use` after both passes (0: no per-key state left).
    pub keys_in_use: u64,
    /// Lock names (`prefix:{key}`) of both passes still in Redis.
    pub lock_names_left: u64,
    /// Redis `used_memory` before, right after both passes, and once the release
    /// records expired (bytes).
    pub redis_before: u64,
    /// Redis `used_memory` right after both passes.
    pub redis_after: u64,
    /// Redis `used_memory` once settled.
    pub redis_settled: u64,
    /// `DBSIZE` right after, and settled (the fences, which outlive the records).
    pub dbsize_after: u64,
    /// Release records (`prefix:{key}:rel:<token>`) right after.
    pub records_after: u64,
    /// `DBSIZE` once settled.
    pub dbsize_settled: u64,
    /// Seconds from the end of the passes until no release record was left
    /// (`None`: not waited for, or not reached within the bound).
    pub settle_secs: Option<f64>,
}

fn key(pass: usize, i: u64) -> LockKey {
    LockKey::from(format!("k{pass}-{i}"))
}

/// One pass: `n` distinct keys `k<pass>-<i>`, task `t` taking those with
/// `i % TASKS == t`, each locked and released once.
async fn pass(locker: &Locker, pass_no: usize, n: u64) -> Result<Duration, String> {
    let start = Instant::now();
    let mut set = JoinSet::new();
    for t in 0..TASKS as u64 {
        let locker = locker.clone();
        set.spawn(async move {
            let mut i = t;
            while i < n {
                let guard = locker
                    .lock(key(pass_no, i))
                    .await
                    .map_err(|e| format!("lock: {e}"))?;
                guard.release().await.map_err(|e| format!("release: {e}"))?;
                i += TASKS as u64;
            }
            Ok::<(), String>(())
        });
    }
    join_all(set).await?;
    Ok(start.elapsed())
}

/// Measures one point on `server` (which it does not share: `used_memory` and
/// `DBSIZE` are the server's). `settle` bounds the wait for the release records
/// to expire (zero: do not wait).
pub async fn measure(server: &RedisServer, n: u64, settle: Duration) -> Result<KeysRow, String> {
    let prefix = testkit::unique_prefix("scale-keys");
    let locker = connect(server, &prefix, |b| b).await?;
    let mut con = server.connection().await;
    // Warm up: connections, buffers and the runtime's task slab.
    pass(&locker, 0, TASKS as u64 * 4).await?;
    idle(&locker).await?;
    let mut row = KeysRow {
        n,
        rss_before: rss_bytes(),
        redis_before: used_memory(&mut con).await?,
        ..KeysRow::default()
    };

    let took = pass(&locker, 1, n).await?;
    row.throughput = n as f64 / took.as_secs_f64();
    idle(&locker).await?;
    row.rss_after = rss_bytes();
    pass(&locker, 2, n).await?;
    idle(&locker).await?;
    let done = Instant::now();
    row.rss_after_second = rss_bytes();
    row.keys_in_use = locker.stats().keys_in_use;
    row.redis_after = used_memory(&mut con).await?;
    row.dbsize_after = dbsize(&mut con).await?;
    let keys = (1..=2).flat_map(|p| (0..n).map(move |i| key(p, i)));
    row.lock_names_left = lock_names_left(&mut con, &prefix, keys).await?;

    // What stays for a while: a release record per release (about 12 s) and a
    // fence per key (10 lease TTLs, at least 60 s). Wait until no record is left.
    let records = format!("{prefix}:*:rel:*");
    let mut left = count_matching(&mut con, &records).await?;
    row.records_after = left;
    if !settle.is_zero() {
        let deadline = done + settle;
        // Bounded by `deadline`.
        while left > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            left = count_matching(&mut con, &records).await?;
        }
        if left == 0 {
            row.settle_secs = Some(done.elapsed().as_secs_f64());
        }
    }
    row.dbsize_settled = dbsize(&mut con).await?;
    row.redis_settled = used_memory(&mut con).await?;
    locker.shutdown().await;
    Ok(row)
}
