//! Curve 4, instances: P instances (each its own `RedisBackend` and `Locker`, in
//! this process) × 2 tasks on one hot key; Redis commands and `PUBLISH` calls per
//! release.
//!
//! In-process instances, as the topology table runs them, not the contention
//! bench's worker processes: the commands a release costs at the server do not
//! depend on the process an instance lives in, and one process keeps the curve
//! callable from a test.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use testkit::RedisServer;
use tokio::task::JoinSet;

use super::probe::CommandStats;
use super::{connect, idle, join_all};

/// Tasks per instance.
pub const TASKS: usize = 2;

/// One point of the instances curve.
#[derive(Clone, Debug, Default)]
pub struct InstancesRow {
    /// Instances.
    pub p: u64,
    /// Critical sections per second, all instances.
    pub throughput: f64,
    /// Releases sent to Redis (`Stats::releases`, summed) per critical section.
    pub releases_per_cs: f64,
    /// Redis commands (all of `INFO commandstats`, scripts' own calls included)
    /// per critical section.
    pub commands_per_cs: f64,
    /// The same per Redis release.
    pub commands_per_release: f64,
    /// `PUBLISH` calls per Redis release.
    pub publish_per_release: f64,
    /// `EVALSHA` calls per Redis release.
    pub evalsha_per_release: f64,
    /// Critical sections run.
    pub sections: u64,
}

/// Measures `p` instances for `secs` seconds on `server` (not shared).
pub async fn measure(server: &RedisServer, p: u64, secs: f64) -> Result<InstancesRow, String> {
    let prefix = testkit::unique_prefix("scale-instances");
    let mut lockers = Vec::new();
    for _ in 0..p {
        lockers.push(connect(server, &prefix, |b| b).await?);
    }
    let mut con = server.connection().await;
    let stop = Arc::new(AtomicBool::new(false));
    let sections = Arc::new(AtomicU64::new(0));
    let before = CommandStats::read(&mut con).await?;
    let stats0: Vec<_> = lockers.iter().map(|l| l.stats()).collect();
    let start = Instant::now();
    let mut set = JoinSet::new();
    for locker in &lockers {
        for _ in 0..TASKS {
            let (locker, stop, sections) =
                (locker.clone(), Arc::clone(&stop), Arc::clone(&sections));
            set.spawn(async move {
                // Bounded by `stop`, set after `secs`.
                while !stop.load(Ordering::Relaxed) {
                    let guard = locker.lock("hot").await.map_err(|e| format!("lock: {e}"))?;
                    sections.fetch_add(1, Ordering::Relaxed);
                    guard.release().await.map_err(|e| format!("release: {e}"))?;
                }
                Ok::<(), String>(())
            });
        }
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    join_all(set).await?;
    let took = start.elapsed().as_secs_f64();
    for locker in &lockers {
        idle(locker).await?;
    }
    let after = CommandStats::read(&mut con).await?;
    let releases: u64 = lockers
        .iter()
        .zip(&stats0)
        .map(|(l, s0)| (l.stats() - *s0).releases)
        .sum();
    let sections = sections.load(Ordering::Relaxed);
    let per_release = |d: u64| d as f64 / releases.max(1) as f64;
    for locker in &lockers {
        locker.shutdown().await;
    }
    Ok(InstancesRow {
        p,
        throughput: sections as f64 / took,
        releases_per_cs: releases as f64 / sections.max(1) as f64,
        commands_per_cs: (after.total() - before.total()) as f64 / sections.max(1) as f64,
        commands_per_release: per_release(after.total() - before.total()),
        publish_per_release: per_release(after.calls("publish") - before.calls("publish")),
        evalsha_per_release: per_release(after.calls("evalsha") - before.calls("evalsha")),
        sections,
    })
}
