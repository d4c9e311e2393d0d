//! Integration tests of lockflight's locks against a real Redis: mutual exclusion
//! under contention (coalescing, naive and handoff modes, and the in-memory backend),
//! fencing tokens, wake-ups, crash recovery, renewal, loss, bad input and cancel
//! safety.
//!
//! Tests that only need *a* Redis use [`testkit::shared`] with their own
//! [`testkit::unique_prefix`]; tests that pause, kill, restart, flush or kill
//! connections of the server start their own [`RedisServer`].
//!
//! The last section holds regression tests for defects found and fixed earlier.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockflight::backend::{Acquire, LeaseToken, Renewal, WhenBusy};
use lockflight::{
    Contention, Error, FencingToken, Handoff, LockGuard, LockKey, Locker, LockerBuilder,
    MemoryBackend, RedisBackend, backend::LockBackend, error::Phase,
};
use redis::aio::MultiplexedConnection;
use testkit::{
    CountingProxy, RedisServer, assert_strictly_increasing, backend_at, child_line, counter_value,
    del, eventually, exists, get_string, holder_child_target, increment, join_all, pttl,
    set_for_30s, shared, shared_scene, spawn_holder_child, tell_parent, unique_prefix, wait_idle,
    wait_until, within, zcard,
};
use tokio::task::JoinSet;
mod bad_input;
mod cancel;
mod cost;
mod counter;
mod crash;
mod fencing;
mod foreign_token;
mod grants;
mod names;
mod regressions;
mod renewal;
mod renewal_batch;
mod turns;
mod wakeups;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// How long a test waits for its lockers' local activity to end.
const IDLE: Duration = Duration::from_secs(10);

/// A locker with default settings on a subscribed backend on `url` under `prefix`.
async fn plain_locker(url: &str, prefix: &str) -> Locker {
    Locker::builder(backend_at(url, prefix).await)
        .build()
        .unwrap()
}

/// Whether `field` (an instance id) has an entry in a waiter queue (a sorted set).
async fn hexists(con: &mut MultiplexedConnection, name: &[u8], field: &str) -> bool {
    redis::cmd("ZSCORE")
        .arg(name)
        .arg(field)
        .query_async::<Option<String>>(con)
        .await
        .expect("ZSCORE")
        .is_some()
}

/// Waits up to `limit` until `backend`'s instance (under `prefix`) has an entry in
/// the Redis queue of `key` (`queued`), or has none (`!queued`); returns whether it
/// came to that.
async fn wait_queued(
    con: &MultiplexedConnection,
    prefix: &str,
    backend: &RedisBackend,
    key: &LockKey,
    queued: bool,
    limit: Duration,
) -> bool {
    let queue = testkit::names::queue(prefix, key);
    let instance = backend.instance_id().to_owned();
    wait_until(limit, || {
        let (mut con, queue, instance) = (con.clone(), &queue, &instance);
        async move { hexists(&mut con, queue, instance).await == queued }
    })
    .await
}

/// Sum of `acquire_attempts` over `lockers`.
fn total_attempts(lockers: &[Locker]) -> u64 {
    lockers.iter().map(|l| l.stats().acquire_attempts).sum()
}

/// Proves mutual exclusion from inside a critical section: entering while another
/// task is inside panics. Leaving happens on drop, so a cancelled critical section
/// leaves too (before its lock guard is dropped, if declared after it).
struct Exclusive(Arc<AtomicUsize>);

impl Exclusive {
    fn enter(inside: &Arc<AtomicUsize>) -> Exclusive {
        let before = inside.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two holders of one lock at the same time");
        Exclusive(Arc::clone(inside))
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sets a flag when dropped (proves a future was dropped).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Waits for `guard`'s loss after the lock key was changed behind it by `what`,
/// checks it came within `bound` and that releasing reports the loss; returns how
/// long it took.
async fn expect_loss(guard: LockGuard, bound: Duration, what: &str) -> Duration {
    let changed = Instant::now();
    within(
        bound + Duration::from_secs(2),
        &format!("lost() after {what}"),
        guard.lost(),
    )
    .await;
    let noticed = changed.elapsed();
    assert!(
        noticed <= bound,
        "loss after {what} noticed after {noticed:?}"
    );
    assert!(guard.is_lost());
    match guard.release().await {
        Err(Error::LeaseLost { phase, .. }) => assert_eq!(phase, Phase::Releasing),
        other => panic!("release after {what}: {other:?}"),
    }
    noticed
}

/// How a test's lockers coordinate locally.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Coalescing,
    Naive,
    Handoff,
}

fn configure(builder: LockerBuilder, mode: Mode) -> LockerBuilder {
    let builder = builder.wait_timeout(Duration::from_secs(60));
    match mode {
        Mode::Coalescing => builder.handoff(Handoff::disabled()),
        Mode::Naive => builder.contention(Contention::PerTask),
        Mode::Handoff => builder.handoff(Handoff::enabled()),
    }
}
