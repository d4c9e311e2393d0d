//! The fault matrix as integration tests against real `redis-server` processes.
//!
//! | row | fault | tests |
//! |---|---|---|
//! | 1 | the holder's **process** is SIGSTOPped for 2 × TTL | [`holder_pause::paused_holder_process_sees_loss_or_is_fenced`] |
//! | 2 | **Redis** is SIGSTOPped for 2 × TTL while a lock is held and waited on | [`redis_pause::paused_redis_signals_loss_in_time_and_never_overlaps`] |
//! | 3 | Redis is **killed and restarted empty**, twice, under a hot key; and once under leases of every kind | [`restart::tokens_increase_and_progress_resumes_across_empty_restarts`], [`restart::a_restart_ends_every_lease_at_once_and_grants_nothing_until_their_ttl`] |
//! | 4 | the **reply is lost** after the server applied acquire / renew / release (and the release **request** is lost) | [`lost_reply`]`::*` (6 tests) |
//! | 5 | `CLIENT KILL TYPE normal` / `pubsub` every 200 ms under load | [`client_kill::killed_connections_keep_the_counter_exact`] |
//! | 6 | **handoff** while Redis becomes a **black hole** | [`blackhole::handoff_into_a_black_hole_grants_only_valid_leases_and_signals_loss`] |
//! | 7 | a seeded **nemesis soak** of all of the above | [`soak::nemesis_soak`] |
//! | 8 | a **request delayed on the wire** past later ones (a release past the next local lease; an acquire past its lease's release, and past its release record's lifetime), plain and with `replica_ack` | [`delayed`]`::*` (5 tests) |
//!
//! The oracle ([`oracle`]): a fenced resource that accepts only increasing
//! fencing tokens, and a history of critical sections that must never overlap in
//! the holders' belief and whose tokens must follow acquisition order.
//!
//! Every test runs alone ([`serial`]): these tests pause, kill and restart
//! servers and measure loss latencies, which a second fault test running on the
//! same two cores would blur. Each test that disturbs Redis starts its own
//! server; the fenced resource of the cross-process test lives in the shared
//! server, which nobody disturbs.

mod blackhole;
mod client_kill;
mod delayed;
mod holder_pause;
mod lost_reply;
mod oracle;
mod redis_pause;
mod restart;
mod soak;

use std::time::Duration;

use lockflight::{Error, Handoff, LockGuard, Locker};
use testkit::{RedisServer, wait_until};
pub(crate) use testkit::{backend_at, join_all, wait_idle, within};

/// How long a test waits for its lockers' local activity to end.
pub(crate) const IDLE: Duration = Duration::from_secs(15);

/// The lease TTL of the fault tests.
pub(crate) const TTL: Duration = Duration::from_secs(1);

/// One fault test at a time (see the module docs). Hold the guard for the test.
pub(crate) async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// The lock keys (not fences, queues or claims) under `prefix` on `server`.
pub(crate) async fn lock_keys(server: &RedisServer, prefix: &str) -> Vec<String> {
    let mut con = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:{{*"))
        .query_async(&mut con)
        .await
        .expect("KEYS");
    keys.into_iter().filter(|k| k.ends_with('}')).collect()
}

/// Waits (up to `limit`) until no lock key is left under `prefix`; panics
/// naming the ones that stay.
pub(crate) async fn assert_no_lock_left(server: &RedisServer, prefix: &str, limit: Duration) {
    let gone = wait_until(limit, || async {
        lock_keys(server, prefix).await.is_empty()
    })
    .await;
    let left = lock_keys(server, prefix).await;
    assert!(
        gone,
        "lock keys still in Redis {limit:?} after all tasks stopped: {left:?}"
    );
}

/// The guard `lock()` returned, or `None` once its error is counted in `errors`:
/// under faults `lock()` may fail with `Timeout` or `Backend` only.
pub(crate) fn lock_granted(
    result: lockflight::Result<LockGuard>,
    errors: &Tally,
) -> Option<LockGuard> {
    match result {
        Ok(g) => Some(g),
        Err(e) => {
            errors.add(format!("lock: {}", kind(&e)));
            assert!(
                matches!(e, Error::Timeout { .. } | Error::Backend { .. }),
                "lock() failed with {e:?}"
            );
            None
        }
    }
}

/// `n` lockers on `url` under `prefix` with the fault tests' [`TTL`] and `wait`:
/// the first hands leases off locally, the others do not.
pub(crate) async fn mixed_lockers(
    url: &str,
    prefix: &str,
    n: usize,
    wait: Duration,
) -> Vec<Locker> {
    let mut lockers = Vec::new();
    for i in 0..n {
        lockers.push(
            Locker::builder(backend_at(url, prefix).await)
                .lease_ttl(TTL)
                .wait_timeout(wait)
                .handoff(if i == 0 {
                    Handoff::enabled()
                } else {
                    Handoff::disabled()
                })
                .build()
                .unwrap(),
        );
    }
    lockers
}

/// The kind of a lockflight error, for counting: its stable code.
pub(crate) fn kind(e: &Error) -> &'static str {
    e.code()
}

/// Counts of things by name, for a test's report.
#[derive(Default, Debug)]
pub(crate) struct Tally(std::sync::Mutex<std::collections::BTreeMap<String, u64>>);

impl Tally {
    pub(crate) fn add(&self, what: impl Into<String>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(what.into())
            .or_default() += 1;
    }

    pub(crate) fn get(&self, what: &str) -> u64 {
        self.snapshot().get(what).copied().unwrap_or(0)
    }

    pub(crate) fn snapshot(&self) -> std::collections::BTreeMap<String, u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The proxy's RESP parsers work on tricky streams in every chunking.
#[test]
fn fault_proxy_parsers() {
    testkit::parsers_self_test();
}
