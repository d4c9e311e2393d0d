//! A holder process killed with SIGKILL: its permit comes back at its TTL.

use super::*;

const CHILD_ENV: &str = "LOCKFLIGHT_SEM_CHILD";
const CHILD_LEASE_TTL: Duration = Duration::from_secs(2);

/// Not a test: the child process of [`killed_holder_permit_returns_within_its_ttl`].
/// It takes the only permit, prints `HELD`, and waits to be killed.
#[tokio::test]
#[ignore = "child process of killed_holder_permit_returns_within_its_ttl"]
async fn child_permit_holder() {
    let Some((backend, key)) = holder_child_target(CHILD_ENV).await else {
        return;
    };
    let locker = locker(backend, CHILD_LEASE_TTL);
    let permit = locker
        .semaphore(key, 1)
        .acquire()
        .await
        .expect("child: acquire");
    tell_parent(&format!("HELD {}", permit.key()));
    std::future::pending::<()>().await;
}

/// A holder process killed with SIGKILL (no release, no more renewals): its permit
/// comes back when its TTL runs out, not before, and not much later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_permit_returns_within_its_ttl() {
    let (server, _log, prefix) = shared_scene("sem-killed");
    let key = "k";
    let (mut child, mut lines) = spawn_holder_child(
        &testkit::test_path(module_path!(), "child_permit_holder"),
        CHILD_ENV,
        server.url(),
        &prefix,
        key,
    );
    child_line(&mut lines, "HELD ").await;

    let backend = backend_at(&server.url(), &prefix).await;
    let permits = testkit::names::permits(&prefix, &LockKey::from(key));
    let locker = locker(backend, Duration::from_secs(30));
    let sem = locker.semaphore(key, 1);
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "the child holds the permit"
    );
    let mut con = server.connection().await;

    child.kill().await.expect("SIGKILL the child");
    let killed = Instant::now();
    // The child's permit expiry, against the server's clock.
    let (_, expiry): (String, i64) = redis::cmd("ZRANGE")
        .arg(&permits)
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .query_async::<Vec<(String, i64)>>(&mut con)
        .await
        .expect("ZRANGE")
        .pop()
        .expect("the child's permit is in the set");
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut con)
        .await
        .expect("TIME");
    let left = Duration::from_millis((expiry - (secs * 1000 + micros / 1000)).max(0) as u64);
    assert!(!left.is_zero(), "the permit must still live after the kill");
    let permit = sem
        .acquire()
        .await
        .expect("the permit comes back at its TTL");
    let blocked = killed.elapsed();
    println!("killed holder's permit came back after {blocked:?} (it had {left:?} left)");
    assert!(
        blocked < CHILD_LEASE_TTL + Duration::from_millis(1500),
        "a killed holder kept its permit for {blocked:?}"
    );
    assert!(
        blocked + Duration::from_millis(50) >= left,
        "the permit was taken {blocked:?} after the kill, before its TTL ({left:?} left) ran out"
    );
    permit.release().await.unwrap();
    assert_eq!(zcard(&mut con, &permits).await, 0);
}
