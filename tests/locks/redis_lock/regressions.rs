//! Regressions of fixed defects.

use super::*;

/// Regression (src/locker.rs, `Shared::lead`): a leader cancelled while its
/// *first* acquire is in flight must leave the Redis queue.
///
/// `lead` used to set `leading.lead.queued = true` only after a `Busy` reply, so when the
/// future is dropped (timeout, abort) while the first acquire-or-enqueue is on the
/// wire, `Leading::drop` → `Shared::cleanup` releases the token but never calls
/// `leave`, although the script did enqueue this instance. The stale entry lives
/// for `queue_entry_ttl`: it inflates the `waiting` count other holders see
/// (halving their handoff budget), and the next release hands this instance a
/// claim it does not want (an extra hop, or a `claim_ttl` stall if its
/// subscription is down). `Locker::lock`'s docs promise that a dropped leader
/// "leaves the backend queue in the background when nobody waits".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cancelled_during_first_acquire_leaves_the_queue() {
    let (server, _log, prefix) = shared_scene("cancel-first-acquire");
    let key = LockKey::from("k");
    let holder = plain_locker(&server.url(), &prefix).await;
    let held = holder.lock(&key).await.unwrap();

    // The waiter talks to Redis through a slow proxy, so its acquire is still on
    // the wire when the caller gives up. Long queue entries make a stale entry
    // obvious.
    let proxy = CountingProxy::start(server).await;
    let backend = RedisBackend::builder(proxy.url())
        .prefix(&prefix)
        .queue_entry_ttl(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let waiter = Locker::builder(backend.clone()).build().unwrap();
    proxy.set_delay(Duration::from_millis(300));
    let cancelled = tokio::time::timeout(Duration::from_millis(100), waiter.lock(&key)).await;
    assert!(
        cancelled.is_err(),
        "the lock is held: lock() cannot succeed"
    );

    let mut con = server.connection().await;
    let queue = testkit::names::queue(&prefix, &key);
    // The acquire landed after the cancellation and queued this instance...
    assert!(
        wait_queued(&con, &prefix, &backend, &key, true, Duration::from_secs(5)).await,
        "the in-flight acquire never reached Redis"
    );
    // ...and nobody of this instance waits any more, so it must leave the queue.
    let left = wait_queued(&con, &prefix, &backend, &key, false, Duration::from_secs(3)).await;
    assert_eq!(waiter.stats().keys_in_use, 0);
    held.release().await.unwrap();
    assert!(
        left,
        "a leader cancelled during its first acquire left a stale entry in the Redis \
         queue (it lives for queue_entry_ttl); PTTL of the queue: {} ms",
        pttl(&mut con, &queue).await
    );
}

/// Regression (src/lease/mod.rs, `Lease::remaining`, used by
/// `LockGuard::valid_for`): once the backend had said the lock is no longer ours,
/// `valid_for()` still reported the time left until the old `valid_until` (about `ttl - ttl/3`), so
/// code that checks `guard.valid_for() > margin` before a write believes it
/// still holds the lock while `is_lost()` is true. A lost lease is known to be
/// invalid: `valid_for()` should be zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_guard_has_no_validity_left() {
    let (server, _log, prefix) = shared_scene("lost-validity");
    let key = LockKey::from("k");
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let guard = locker.lock(&key).await.unwrap();
    let mut con = server.connection().await;
    del(&mut con, &testkit::names::lock(&prefix, &key)).await;
    within(Duration::from_secs(3), "lost() after DEL", guard.lost()).await;
    assert!(guard.is_lost());
    let left = guard.valid_for();
    drop(guard);
    assert_eq!(
        left,
        Duration::ZERO,
        "a lost guard still claims {left:?} of validity"
    );
}
