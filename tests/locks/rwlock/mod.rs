//! Read-write locks against a real Redis, with several `RedisBackend`s standing for
//! several service instances: readers share, writers exclude everyone, a stream of
//! readers cannot starve a writer, local readers share one Redis lease, write
//! fencing, cancellation, loss of a shared read lease, and the in-memory backend.

mod backends;
mod exclusion;
mod grants;
mod leases;
mod sharing;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockflight::rwlock::READ_ADMISSION_WINDOW;
use lockflight::{Error, FencingToken, LockKey, Locker, MemoryBackend, RedisBackend};
use testkit::{
    CountingProxy, backend_at, eventually, exists, join_all, keys_in_use, shared, shared_scene,
    suffixed, unique_prefix, wait_until, wait_zero, zcard,
};
use tokio::task::JoinSet;

/// How long a test waits for its lockers' local activity to end.
const IDLE: Duration = Duration::from_secs(10);

/// `n` lockers, each on its own backend (its own instance id and channel).
async fn instances(url: &str, prefix: &str, n: usize) -> Vec<Locker> {
    let mut out = Vec::new();
    for _ in 0..n {
        let backend = backend_at(url, prefix).await;
        out.push(
            Locker::builder(backend)
                .wait_timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        );
    }
    out
}

/// The Redis name of one of `key`'s read-write keys under `prefix` (`suffix`: `:rd`,
/// `:wr`, …).
fn rw_name(prefix: &str, key: &LockKey, suffix: &str) -> Vec<u8> {
    suffixed(&testkit::names::lock(prefix, key), suffix)
}

/// Waits until none of `lockers` has read-write activity left.
async fn wait_idle(lockers: &[Locker]) {
    let what = "read-write state left behind";
    wait_zero(lockers, IDLE, keys_in_use, what).await;
}
