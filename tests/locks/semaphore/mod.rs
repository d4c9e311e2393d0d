//! Distributed semaphores against a real Redis: at most N holders across instances,
//! a killed holder's permit comes back at its TTL, no permit leaks through a
//! cancellation storm, N is fixed per key, local waiters coalesce into one request,
//! a release wakes one waiting instance by message, and a lost permit is signalled.

mod cancel;
mod crash;
mod exclusion;
mod handoff;
mod requests;
mod signals;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockflight::semaphore::Permit;
use lockflight::{Contention, Error, LockKey, Locker, RedisBackend, error::Phase};
use testkit::{
    CountingProxy, MINIMAL_ACL_RULES, backend_at, child_line, eventually, holder_child_target,
    join_all, key_count, keys_in_use, set_acl_user, shared, shared_scene, spawn_holder_child,
    suffixed, tell_parent, unique_prefix, wait_until, wait_zero, within, zcard,
};
use tokio::task::JoinSet;

/// How long a test waits for its lockers' local activity to end.
const IDLE: Duration = Duration::from_secs(10);

fn locker(backend: RedisBackend, ttl: Duration) -> Locker {
    Locker::builder(backend)
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .expect("build the locker")
}

/// `n` lockers (30 s leases) on subscribed backends on `url` under `prefix`.
async fn instances(url: &str, prefix: &str, n: usize) -> Vec<Locker> {
    let mut lockers = Vec::new();
    for _ in 0..n {
        lockers.push(locker(
            backend_at(url, prefix).await,
            Duration::from_secs(30),
        ));
    }
    lockers
}

/// Waits until none of `lockers` has semaphore state left.
async fn wait_idle(lockers: &[Locker]) {
    let what = "semaphore state left behind";
    wait_zero(lockers, IDLE, keys_in_use, what).await;
}

/// Counts holders inside a critical section and records the maximum.
struct Inside {
    now: AtomicUsize,
    max: AtomicUsize,
}

struct Entered<'a>(&'a Inside);

impl Inside {
    fn enter(&self, n: usize) -> Entered<'_> {
        let inside = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(inside, Ordering::SeqCst);
        assert!(
            inside <= n,
            "{inside} holders of a semaphore of {n} permits"
        );
        Entered(self)
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `tasks` tasks on each of `lockers`, `rounds` critical sections each (1 ms) on
/// the semaphore `pool` of `n` permits, bounded by 60 s (`what` names the step);
/// returns the most holders seen inside at once (each entry checks at most `n`).
async fn exclusion_workload(
    lockers: &[Locker],
    n: u32,
    tasks: usize,
    rounds: usize,
    what: &str,
) -> usize {
    let inside = Arc::new(Inside {
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    });
    let mut set = JoinSet::new();
    for l in lockers {
        for _ in 0..tasks {
            let (sem, inside) = (l.semaphore("pool", n), Arc::clone(&inside));
            set.spawn(async move {
                for _ in 0..rounds {
                    let permit = sem.acquire().await.expect("acquire");
                    let entered = inside.enter(n as usize);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(entered);
                    permit.release().await.expect("release");
                }
            });
        }
    }
    within(Duration::from_secs(60), what, join_all(set)).await;
    inside.max.load(Ordering::SeqCst)
}
