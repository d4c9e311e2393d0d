//! Curve 3, held leases: N leases held at once with a short TTL, renewed by the
//! watchdog while the curve counts what a renewal period costs.

use std::time::{Duration, Instant};

use lockflight::{LockGuard, LockKey};
use testkit::RedisServer;
use tokio::task::JoinSet;

use super::probe::{CommandStats, cpu_time, rss_bytes, server_cpu, used_memory};
use super::{connect, idle, join_all};

/// The default lease TTL of the held leases: renewed every second (a third of it).
pub const LEASE_TTL: Duration = Duration::from_secs(3);

/// The renewal period of leases of `ttl`: the watchdog's interval (a third of the
/// TTL) plus its scan tick (a quarter of the interval). A renewal is due one
/// interval after it was sent, and it is sent just after a scan, so it is found due
/// one scan later than that: a measured window of whole periods then sees a whole
/// number of rounds.
pub fn period(ttl: Duration) -> Duration {
    let every = ttl / 3;
    every + every / 4
}
/// Tasks that take (and release) the leases.
const TASKS: u64 = 64;

/// One point of the held-leases curve.
#[derive(Clone, Debug, Default)]
pub struct HeldRow {
    /// Leases held at once.
    pub n: u64,
    /// RSS growth per held lease (bytes).
    pub rss_per_lease: f64,
    /// Redis `used_memory` growth per held lease (bytes).
    pub redis_per_lease: f64,
    /// The lease TTL.
    pub ttl: Duration,
    /// Renewal periods measured (see [`period`]).
    pub periods: u64,
    /// Server `EVALSHA` calls per renewal period.
    pub evalsha_per_period: f64,
    /// Renewal requests per period (`Stats::renew_attempts`).
    pub renewals_per_period: f64,
    /// Redis CPU per period (ms).
    pub redis_cpu_ms_per_period: f64,
    /// This process's CPU per period (ms).
    pub client_cpu_ms_per_period: f64,
    /// Leases lost during the run (`Stats::leases_lost`): renewals that did
    /// not keep up.
    pub lost: u64,
    /// `Stats::keys_in_use` once all were released.
    pub keys_in_use: u64,
}

/// Measures one point on `server` (not shared: `INFO` is the server's): `n`
/// leases of `ttl`, over `periods` renewal periods.
pub async fn measure(
    server: &RedisServer,
    n: u64,
    ttl: Duration,
    periods: u64,
) -> Result<HeldRow, String> {
    let prefix = testkit::unique_prefix("scale-held");
    let locker = connect(server, &prefix, |b| b.lease_ttl(ttl)).await?;
    let period = period(ttl);
    let mut con = server.connection().await;
    // Warm up the connections.
    locker
        .lock("warm")
        .await
        .map_err(|e| format!("lock: {e}"))?
        .release()
        .await
        .map_err(|e| format!("release: {e}"))?;
    idle(&locker).await?;
    let (rss0, mem0) = (rss_bytes(), used_memory(&mut con).await?);

    let mut set = JoinSet::new();
    for t in 0..TASKS {
        let locker = locker.clone();
        set.spawn(async move {
            let mut held: Vec<LockGuard> = Vec::new();
            let mut i = t;
            while i < n {
                let key = LockKey::from(format!("h{i}"));
                held.push(locker.lock(key).await.map_err(|e| format!("lock: {e}"))?);
                i += TASKS;
            }
            Ok::<_, String>(held)
        });
    }
    let mut guards = Vec::new();
    // Bounded: the set holds `TASKS` tasks.
    while let Some(joined) = set.join_next().await {
        guards.extend(joined.map_err(|e| format!("task: {e}"))??);
    }
    let mut row = HeldRow {
        n,
        ttl,
        periods,
        rss_per_lease: rss_bytes().saturating_sub(rss0) as f64 / n as f64,
        redis_per_lease: used_memory(&mut con).await?.saturating_sub(mem0) as f64 / n as f64,
        ..HeldRow::default()
    };

    let (cmd0, scpu0, ccpu0, stats0) = (
        CommandStats::read(&mut con).await?,
        server_cpu(&mut con).await?,
        cpu_time(),
        locker.stats(),
    );
    let start = Instant::now();
    tokio::time::sleep(period * periods as u32).await;
    let (cmd1, scpu1, ccpu1, stats1) = (
        CommandStats::read(&mut con).await?,
        server_cpu(&mut con).await?,
        cpu_time(),
        locker.stats(),
    );
    // Per period of the time actually slept.
    let p = start.elapsed().as_secs_f64() / period.as_secs_f64();
    row.evalsha_per_period = (cmd1.calls("evalsha") - cmd0.calls("evalsha")) as f64 / p;
    row.renewals_per_period = (stats1 - stats0).renew_attempts as f64 / p;
    row.redis_cpu_ms_per_period = (scpu1.saturating_sub(scpu0)).as_secs_f64() * 1e3 / p;
    row.client_cpu_ms_per_period = (ccpu1.saturating_sub(ccpu0)).as_secs_f64() * 1e3 / p;

    let mut set = JoinSet::new();
    let mut guards = guards.into_iter();
    let chunk = (n as usize).div_ceil(TASKS as usize).max(1);
    // Bounded: each round takes up to `chunk` of the `n` guards.
    loop {
        let part: Vec<LockGuard> = guards.by_ref().take(chunk).collect();
        if part.is_empty() {
            break;
        }
        set.spawn(async move {
            for g in part {
                match g.release().await {
                    // Counted by `Stats::leases_lost`: a point too large for the
                    // machine to renew in time reports its losses.
                    Ok(()) | Err(lockflight::Error::LeaseLost { .. }) => {}
                    Err(e) => return Err(format!("release: {e}")),
                }
            }
            Ok::<(), String>(())
        });
    }
    join_all(set).await?;
    idle(&locker).await?;
    let stats = locker.stats();
    (row.lost, row.keys_in_use) = (stats.leases_lost, stats.keys_in_use);
    locker.shutdown().await;
    Ok(row)
}
