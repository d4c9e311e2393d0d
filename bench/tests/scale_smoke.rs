//! The scale curves (`bench::scale`) at tiny sizes, with assertions on counts,
//! never on elapsed time: released keys leave no per-key state in the locker and
//! no lock name in Redis, renewals of many held leases are batched, cancelled
//! waiters leave nothing behind.

use bench::scale::{held, instances, keys, waiters};
use testkit::RedisServer;

/// One test at a time: the keys test reads the process's RSS, which the others'
/// thousands of tasks would move.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_keys_leave_no_residue() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let row = keys::measure(&server, 2000, std::time::Duration::ZERO)
        .await
        .expect("keys curve");
    assert_eq!(row.keys_in_use, 0, "per-key state left: {row:?}");
    assert_eq!(row.lock_names_left, 0, "lock names left in Redis: {row:?}");
    // Generous and not timed: 4,000 keys kept would be far more than a few
    // hundred bytes each.
    assert!(
        row.rss_after_second.saturating_sub(row.rss_before) < 8 << 20,
        "RSS grew by more than 8 MiB: {row:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_waiter() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let row = waiters::measure(&server, 2000)
        .await
        .expect("waiters curve");
    // Every waiter but the first of each lease got it in memory.
    assert!(row.handoffs > 0, "no handoff: {row:?}");
    assert_eq!(
        row.handoffs_after_cancel, 0,
        "a cancelled waiter was handed the lock: {row:?}"
    );
    assert!(
        row.relock_at_once,
        "the key was not free after the cancel: {row:?}"
    );
    assert_eq!(row.keys_in_use, 0, "per-key state left: {row:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_renew_in_batches() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let row = held::measure(&server, 200, held::LEASE_TTL, 2)
        .await
        .expect("held curve");
    assert_eq!(row.lost, 0, "a lease was lost: {row:?}");
    assert!(row.renewals_per_period > 0.0, "no renewal: {row:?}");
    assert!(
        row.evalsha_per_period < 200.0,
        "as many script calls as leases per period: {row:?}"
    );
    assert_eq!(row.keys_in_use, 0, "per-key state left: {row:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_instance_not_all() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let row = instances::measure(&server, 4, 1.0)
        .await
        .expect("instances curve");
    assert!(row.sections > 0, "{row:?}");
    // Notify-one: a release wakes one waiting instance (a revocation of a cached
    // lease publishes too), never all three others.
    assert!(
        row.publish_per_release < 3.0,
        "a release woke every waiting instance: {row:?}"
    );
    // The key's Redis queue holds one entry per waiting instance (its id; the woken
    // one leaves when its acquire lands), however many of its tasks wait: never
    // more than the 4 instances.
    assert!(
        row.queue_max <= 4,
        "more than one queue entry per instance: {row:?}"
    );
    // No instance starved for the whole run.
    assert!(
        row.share_min > 0.0,
        "an instance never held the key: {row:?}"
    );
}
