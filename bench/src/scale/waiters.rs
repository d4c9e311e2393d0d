//! Curve 2, local waiters: T tasks parked on one key behind a holder of this
//! process; then handed the lock one after the other, or all cancelled.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockflight::Locker;
use testkit::RedisServer;
use tokio::task::JoinSet;

use super::probe::rss_bytes;
use super::{connect, idle, join_all};

const KEY: &str = "hot";

/// One point of the local-waiters curve.
#[derive(Clone, Debug, Default)]
pub struct WaitersRow {
    /// Tasks waiting.
    pub t: u64,
    /// RSS growth with the T tasks parked, per waiter (bytes; the task and its
    /// `lock` future included).
    pub bytes_per_waiter: f64,
    /// From the holder's release until every waiter ran its section, per section (µs).
    pub us_per_section: f64,
    /// Sections that got the lease by local handoff, and leases taken from Redis.
    pub handoffs: u64,
    /// Leases taken from Redis during the handover.
    pub acquired: u64,
    /// Aborting the T parked tasks, until all are gone (ms).
    pub cancel_ms: f64,
    /// RSS after the cancel minus RSS before the waiters were spawned (bytes).
    pub rss_residue_after_cancel: i64,
    /// Handoffs when the holder released after the cancel (0: no waiter left).
    pub handoffs_after_cancel: u64,
    /// `try_lock` right after that release succeeded.
    pub relock_at_once: bool,
    /// `Stats::keys_in_use` at the end (0: no state left for the key).
    pub keys_in_use: u64,
}

/// Spawns `t` tasks that lock `KEY`, add one to `ran`, release; returns when all
/// of them are queued behind the holder (`Stats::local_waits`), waiting at most
/// `bound`.
async fn park(
    locker: &Locker,
    t: u64,
    ran: &Arc<AtomicU64>,
    bound: Duration,
) -> Result<JoinSet<Result<(), String>>, String> {
    let waits = locker.stats().local_waits;
    let mut set = JoinSet::new();
    for _ in 0..t {
        let (locker, ran) = (locker.clone(), Arc::clone(ran));
        set.spawn(async move {
            let guard = locker.lock(KEY).await.map_err(|e| format!("lock: {e}"))?;
            ran.fetch_add(1, Ordering::Relaxed);
            guard.release().await.map_err(|e| format!("release: {e}"))
        });
    }
    let deadline = Instant::now() + bound;
    // Bounded by `deadline`.
    while locker.stats().local_waits - waits < t {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {t} waiters parked within {bound:?}",
                locker.stats().local_waits - waits
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(set)
}

/// Measures one point: `t` waiters handed the lock in turn, then `t` waiters
/// cancelled. The locker allows `t` waiters per key and waits up to an hour.
pub async fn measure(server: &RedisServer, t: u64) -> Result<WaitersRow, String> {
    let prefix = testkit::unique_prefix("scale-waiters");
    let max_waiters = usize::try_from(t).unwrap_or(usize::MAX).max(1);
    let locker = connect(server, &prefix, |b| {
        b.max_waiters(max_waiters)
            .wait_timeout(Duration::from_secs(3600))
    })
    .await?;
    let bound = Duration::from_secs(120);
    let ran = Arc::new(AtomicU64::new(0));
    let mut row = WaitersRow {
        t,
        ..WaitersRow::default()
    };

    // Phase 1: park, then hand over.
    let holder = locker.lock(KEY).await.map_err(|e| format!("lock: {e}"))?;
    let rss_base = rss_bytes();
    let set = park(&locker, t, &ran, bound).await?;
    row.bytes_per_waiter = rss_bytes().saturating_sub(rss_base) as f64 / t as f64;
    let before = locker.stats();
    let start = Instant::now();
    holder
        .release()
        .await
        .map_err(|e| format!("release: {e}"))?;
    join_all(set).await?;
    row.us_per_section = start.elapsed().as_secs_f64() * 1e6 / t as f64;
    let delta = locker.stats() - before;
    (row.handoffs, row.acquired) = (delta.handoffs, delta.acquired);
    if ran.load(Ordering::Relaxed) != t {
        return Err(format!(
            "{} of {t} waiters ran",
            ran.load(Ordering::Relaxed)
        ));
    }
    idle(&locker).await?;

    // Phase 2: park, then cancel every waiter.
    let holder = locker.lock(KEY).await.map_err(|e| format!("lock: {e}"))?;
    let rss_base = rss_bytes();
    let mut set = park(&locker, t, &ran, bound).await?;
    let start = Instant::now();
    set.abort_all();
    // Bounded: the set holds `t` tasks.
    while let Some(joined) = set.join_next().await {
        if let Ok(Err(e)) = joined {
            return Err(format!("a cancelled waiter failed first: {e}"));
        }
    }
    row.cancel_ms = start.elapsed().as_secs_f64() * 1e3;
    drop(set);
    row.rss_residue_after_cancel = rss_bytes() as i64 - rss_base as i64;
    let before = locker.stats();
    holder
        .release()
        .await
        .map_err(|e| format!("release: {e}"))?;
    row.handoffs_after_cancel = (locker.stats() - before).handoffs;
    match locker.try_lock(KEY).await {
        Ok(Some(guard)) => {
            row.relock_at_once = true;
            guard.release().await.map_err(|e| format!("release: {e}"))?;
        }
        Ok(None) => row.relock_at_once = false,
        Err(e) => return Err(format!("try_lock after the cancel: {e}")),
    }
    idle(&locker).await?;
    row.keys_in_use = locker.stats().keys_in_use;
    if ran.load(Ordering::Relaxed) != t {
        return Err("a cancelled waiter ran its section".to_owned());
    }
    locker.shutdown().await;
    Ok(row)
}
