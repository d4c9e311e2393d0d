//! Renewal and loss.

use super::*;

/// The watchdog keeps a critical section of 4 × the TTL alive and exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_long_critical_section_exclusive() {
    let (server, _log, prefix) = shared_scene("renewal");
    let key = LockKey::from("k");
    let ttl = Duration::from_millis(300);
    let holder = Locker::builder(backend_at(&server.url(), &prefix).await)
        .lease_ttl(ttl)
        .build()
        .unwrap();
    let other = plain_locker(&server.url(), &prefix).await;

    let guard = holder.lock(&key).await.unwrap();
    let started = Instant::now();
    let mut tries = 0;
    while started.elapsed() < 4 * ttl {
        assert!(
            other.try_lock(&key).await.unwrap().is_none(),
            "another instance got the lock after {:?} of a renewed lease",
            started.elapsed()
        );
        assert!(!guard.is_lost(), "lost after {:?}", started.elapsed());
        tries += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!guard.is_lost());
    let stats = holder.stats();
    assert!(stats.renewals >= 3, "{stats:?}");
    assert_eq!(stats.leases_lost, 0, "{stats:?}");
    guard.release().await.expect("the lease is still ours");
    println!(
        "renewal: {} renewals, {tries} failed try_locks",
        stats.renewals
    );
    wait_idle(&[holder, other], IDLE).await;
}

/// `try_lock` returns `None` while another instance (or another local task) holds
/// the lock, and `Some` once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_is_none_while_held() {
    let (server, _log, prefix) = shared_scene("try-lock");
    let key = LockKey::from("k");
    let a = plain_locker(&server.url(), &prefix).await;
    let b = plain_locker(&server.url(), &prefix).await;

    let guard = a.try_lock(&key).await.unwrap().expect("a free lock");
    assert!(b.try_lock(&key).await.unwrap().is_none());
    assert!(a.try_lock(&key).await.unwrap().is_none(), "held locally");
    guard.release().await.unwrap();
    let guard = b.try_lock(&key).await.unwrap().expect("free again");
    assert!(a.try_lock(&key).await.unwrap().is_none());
    guard.release().await.unwrap();
    wait_idle(&[a, b], IDLE).await;
}

/// A lock key deleted or overwritten behind the holder's back is noticed at the
/// next renewal (within ttl/3 + 200 ms), and the release then reports the loss
/// without deleting the foreign value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_or_overwritten_lock_is_lost() {
    let (server, _log, prefix) = shared_scene("loss");
    let ttl = Duration::from_millis(1500);
    let bound = ttl / 3 + Duration::from_millis(200);
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .build()
        .unwrap();
    let mut con = server.connection().await;

    // Deleted.
    let key = LockKey::from("deleted");
    let guard = locker.lock(&key).await.unwrap();
    del(&mut con, &testkit::names::lock(&prefix, &key)).await;
    let noticed = expect_loss(guard, bound, "DEL").await;
    println!("loss after DEL noticed after {noticed:?}");

    // Overwritten by another value (with a TTL, so it looks like another holder).
    let key = LockKey::from("overwritten");
    let name = testkit::names::lock(&prefix, &key);
    let guard = locker.lock(&key).await.unwrap();
    set_for_30s(&mut con, &name, "someone-else").await;
    let noticed = expect_loss(guard, bound, "SET").await;
    println!("loss after SET noticed after {noticed:?}");
    let value = get_string(&mut con, &name).await;
    assert_eq!(
        value.as_deref(),
        Some("someone-else"),
        "the foreign value was deleted"
    );
    assert_eq!(locker.stats().leases_lost, 2);
    del(&mut con, &name).await;
    wait_idle(&[locker], IDLE).await;
}

/// `with_lock` drops the user's future when the lease is lost and returns
/// `Error::LeaseLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_aborts_work_on_loss() {
    let (server, _log, prefix) = shared_scene("with-lock-loss");
    let ttl = Duration::from_millis(1500);
    let key = LockKey::from("k");
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .build()
        .unwrap();

    let dropped = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let work = {
        let (locker, key) = (locker.clone(), key.clone());
        let (dropped, finished) = (dropped.clone(), finished.clone());
        tokio::spawn(async move {
            locker
                .with_lock(&key, move |info| async move {
                    let _flag = SetOnDrop(dropped);
                    started_tx.send(info).unwrap();
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    finished.store(true, Ordering::SeqCst);
                })
                .await
        })
    };
    let info = within(Duration::from_secs(10), "the work starts", started_rx)
        .await
        .unwrap();
    assert_eq!(info.key, key);
    let mut con = server.connection().await;
    del(&mut con, &testkit::names::lock(&prefix, &key)).await;
    let deleted = Instant::now();
    let result = within(Duration::from_secs(5), "with_lock", work)
        .await
        .unwrap();
    let noticed = deleted.elapsed();
    assert!(
        matches!(result, Err(Error::LeaseLost { .. })),
        "with_lock after loss: {result:?}"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the work's future was not dropped"
    );
    assert!(!finished.load(Ordering::SeqCst), "the work ran to its end");
    assert!(
        noticed <= ttl / 3 + Duration::from_millis(200),
        "{noticed:?}"
    );
    wait_idle(&[locker], IDLE).await;
}

/// A paused (unresponsive) Redis cannot renew the lease: loss is signalled no
/// later than (about) the end of the lease's validity, never a holder that
/// believes it still holds an expired lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_ends_in_loss_by_valid_until() {
    let server = RedisServer::start();
    let prefix = unique_prefix("paused");
    let key = LockKey::from("k");
    let ttl = Duration::from_secs(1);
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .build()
        .unwrap();

    let guard = locker.lock(&key).await.unwrap();
    // Let a renewal happen first.
    eventually("the first renewal", || async {
        locker.stats().renewals >= 1
    })
    .await;
    assert!(!guard.is_lost());
    server.pause();
    // A reply sent before the pause has arrived by now; no later one can.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let valid_for = guard.valid_for();
    let valid_until = Instant::now() + valid_for;
    assert!(!guard.is_lost(), "lost while still valid for {valid_for:?}");
    within(
        valid_for + Duration::from_secs(3),
        "lost() while paused",
        guard.lost(),
    )
    .await;
    let lost_at = Instant::now();
    assert!(guard.is_lost());
    assert!(guard.valid_for().is_zero());
    let late = lost_at.saturating_duration_since(valid_until);
    println!(
        "paused redis: loss signalled {late:?} after valid_until (valid for {valid_for:?} at pause)"
    );
    assert!(
        late <= Duration::from_millis(300),
        "loss signalled {late:?} after the lease's validity ended"
    );
    server.resume();

    // Whatever the release finds, the lock is usable again afterwards.
    let _ = within(Duration::from_secs(10), "release", guard.release()).await;
    let other = Locker::builder(backend_at(&server.url(), &prefix).await)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    other.lock(&key).await.unwrap().release().await.unwrap();
    assert_eq!(locker.stats().leases_lost, 1);
}
