//! A lost permit is signalled; the futures are `Send`; the documented ACL rules
//! suffice.

use super::*;

/// A permit whose entry is removed in Redis is signalled lost within a renewal
/// interval or so, and its release reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_permit_is_signalled() {
    let (server, _log, prefix) = shared_scene("sem-loss");
    let backend = backend_at(&server.url(), &prefix).await;
    let permits = testkit::names::permits(&prefix, &LockKey::from("k"));
    let l = locker(backend, Duration::from_millis(900));
    let permit = l.semaphore("k", 2).acquire().await.unwrap();
    let signal = permit.loss_signal();
    assert!(!permit.is_lost());
    let mut con = server.connection().await;
    let removed: i64 = redis::cmd("DEL")
        .arg(&permits)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(removed, 1);
    let changed = Instant::now();
    within(Duration::from_secs(3), "lost()", permit.lost()).await;
    println!("loss noticed {:?} after the removal", changed.elapsed());
    assert!(permit.is_lost() && signal.is_lost());
    assert!(signal.reason().is_some());
    assert!(l.stats().leases_lost >= 1);
    match permit.release().await {
        Err(Error::LeaseLost { phase, .. }) => assert_eq!(phase, Phase::Releasing),
        other => panic!("release of a lost permit: {other:?}"),
    }
}

/// Every future of the semaphore API is `Send` (usable from `tokio::spawn`).
#[test]
fn futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn check(sem: lockflight::semaphore::Semaphore, permit: Permit) {
        send(&sem.acquire());
        send(&sem.acquire_with_options(
            lockflight::LockOptions::new().wait_timeout(Duration::from_secs(1)),
        ));
        send(&sem.try_acquire());
        send(&permit.lost());
        send(&permit.release());
    }
    let _ = check;
}

/// The minimal ACL rules documented on `RedisBackend` suffice for semaphores:
/// every script command (acquire, wait, renew, release with its wake-up, leave)
/// runs under them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rules_suffice() {
    // The minimal line without the two commands only the lock's scripts use.
    let rules: Vec<&str> = MINIMAL_ACL_RULES
        .iter()
        .copied()
        .filter(|r| !["+zremrangebyscore", "+zcount"].contains(r))
        .collect();
    let server = testkit::RedisServer::start();
    let _log = server.log_on_panic();
    let mut admin = server.connection().await;
    set_acl_user(&mut admin, "app", &rules).await;
    let url = format!("redis://app:pw@127.0.0.1:{}/", server.port());
    let a = locker(backend_at(&url, "lfacl").await, Duration::from_millis(300));
    let b = locker(backend_at(&url, "lfacl").await, Duration::from_millis(300));
    let held = a.semaphore("k", 1).acquire().await.expect("acquire");
    // b waits, gives up (leave), then waits again and is woken by the release.
    let gave_up = b
        .semaphore("k", 1)
        .acquire_with_options(
            lockflight::LockOptions::new().wait_timeout(Duration::from_millis(200)),
        )
        .await;
    assert!(matches!(gave_up, Err(Error::Timeout { .. })), "{gave_up:?}");
    wait_idle(std::slice::from_ref(&b)).await;
    let waiting = tokio::spawn({
        let sem = b.semaphore("k", 1);
        async move { sem.acquire().await }
    });
    // Renewals run (every 100 ms) while b waits: three of them, past the first TTL.
    let renewed = a.stats().renewals;
    eventually(
        "three renewals of the held permit under the ACL",
        || async { a.stats().renewals >= renewed + 3 },
    )
    .await;
    assert!(!held.is_lost(), "renewed under the ACL");
    held.release().await.expect("release");
    let p = within(Duration::from_secs(5), "b's permit", waiting)
        .await
        .unwrap()
        .expect("b acquires");
    assert!(b.semaphore("k", 1).try_acquire().await.unwrap().is_none());
    p.release().await.unwrap();
}
