//! Curve 4, instances: P instances (each its own `RedisBackend` and `Locker`, in
//! this process) × 2 tasks on one hot key; Redis commands and `PUBLISH` calls per
//! release, the length of the key's Redis wait queue (sampled), each instance's
//! share of the sections, and the p99 of a task's wait for the lock.
//!
//! In-process instances, as the topology table runs them, not the contention
//! bench's worker processes: the commands a release costs at the server do not
//! depend on the process an instance lives in, and one process keeps the curve
//! callable from a test.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lockflight::LockKey;
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
    /// Instances waiting in the key's Redis queue (`ZCARD` of its `:wq`, sampled
    /// every 10 ms): the mean.
    pub queue_mean: f64,
    /// The same: the largest sample (at most P with coalescing: one entry per
    /// instance; a woken instance leaves the queue when its acquire lands).
    pub queue_max: u64,
    /// The smallest instance's share of the sections (1/P is an even split).
    pub share_min: f64,
    /// The largest instance's share of the sections.
    pub share_max: f64,
    /// A task's wait from calling `lock` to holding, 99th percentile, in ms.
    pub wait_p99_ms: f64,
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
    let per_instance: Vec<Arc<AtomicU64>> = (0..p).map(|_| Arc::default()).collect();
    let before = CommandStats::read(&mut con).await?;
    let stats0: Vec<_> = lockers.iter().map(|l| l.stats()).collect();
    let start = Instant::now();
    let mut set = JoinSet::new();
    for (locker, mine) in lockers.iter().zip(&per_instance) {
        for _ in 0..TASKS {
            let (locker, stop, sections, mine) = (
                locker.clone(),
                Arc::clone(&stop),
                Arc::clone(&sections),
                Arc::clone(mine),
            );
            set.spawn(async move {
                let mut waits = wait_histogram();
                // Bounded by `stop`, set after `secs`.
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let guard = locker.lock("hot").await.map_err(|e| format!("lock: {e}"))?;
                    waits.saturating_record(asked.elapsed().as_micros() as u64);
                    sections.fetch_add(1, Ordering::Relaxed);
                    mine.fetch_add(1, Ordering::Relaxed);
                    guard.release().await.map_err(|e| format!("release: {e}"))?;
                }
                Ok::<Histogram<u64>, String>(waits)
            });
        }
    }
    // The queue's length, sampled until `stop` (a connection of its own).
    let sampler = {
        let (mut con, stop) = (server.connection().await, Arc::clone(&stop));
        let queue = testkit::names::queue(&prefix, &LockKey::from("hot"));
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let n: u64 = redis::cmd("ZCARD")
                    .arg(&queue)
                    .query_async(&mut con)
                    .await
                    .map_err(|e| format!("ZCARD: {e}"))?;
                samples.push(n);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<Vec<u64>, String>(samples)
        })
    };
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut waits = wait_histogram();
    for h in join_all(set).await? {
        waits
            .add(h)
            .map_err(|e| format!("merging wait histograms: {e}"))?;
    }
    let queue = sampler.await.map_err(|e| format!("queue sampler: {e}"))??;
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
    // The sampler's own `ZCARD`s are not lockflight's.
    let commands = (after.total() - before.total()).saturating_sub(queue.len() as u64);
    let per_release = |d: u64| d as f64 / releases.max(1) as f64;
    let shares = per_instance
        .iter()
        .map(|n| n.load(Ordering::Relaxed) as f64 / sections.max(1) as f64);
    let share_min = shares.clone().fold(f64::INFINITY, f64::min);
    let share_max = shares.fold(0.0, f64::max);
    for locker in &lockers {
        locker.shutdown().await;
    }
    Ok(InstancesRow {
        p,
        throughput: sections as f64 / took,
        releases_per_cs: releases as f64 / sections.max(1) as f64,
        commands_per_cs: commands as f64 / sections.max(1) as f64,
        commands_per_release: per_release(commands),
        publish_per_release: per_release(after.calls("publish") - before.calls("publish")),
        evalsha_per_release: per_release(after.calls("evalsha") - before.calls("evalsha")),
        sections,
        queue_mean: queue.iter().sum::<u64>() as f64 / queue.len().max(1) as f64,
        queue_max: queue.iter().copied().max().unwrap_or(0),
        share_min,
        share_max,
        wait_p99_ms: waits.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

/// Waits in µs, 1 µs to an hour, 3 significant digits.
fn wait_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}
