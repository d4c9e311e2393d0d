//! A holder process killed with SIGKILL.

use super::*;

const CHILD_ENV: &str = "LOCKFLIGHT_CHILD";
const CHILD_LEASE_TTL: Duration = Duration::from_secs(2);

/// Not a test: the child process of [`killed_holder_blocks_at_most_lease_ttl`]. It
/// takes the lock, prints `HELD <epoch>`, and waits to be killed.
#[tokio::test]
#[ignore = "child process of killed_holder_blocks_at_most_lease_ttl"]
async fn child_holder_process() {
    let Some((backend, key)) = holder_child_target(CHILD_ENV).await else {
        return;
    };
    let locker = Locker::builder(backend)
        .lease_ttl(CHILD_LEASE_TTL)
        .build()
        .expect("child: build");
    let guard = locker.lock(key).await.expect("child: lock");
    tell_parent(&format!("HELD {}", guard.fencing_token().epoch));
    std::future::pending::<()>().await;
}

/// A holder whose process is killed (no release, no more renewals) blocks the
/// others for no longer than its lease TTL, and not shorter than the lock's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_blocks_at_most_lease_ttl() {
    let (server, _log, prefix) = shared_scene("killed-holder");
    let key = "k";
    let (mut child, mut lines) = spawn_holder_child(
        &testkit::test_path(module_path!(), "child_holder_process"),
        CHILD_ENV,
        server.url(),
        &prefix,
        key,
    );
    let child_epoch: u64 = child_line(&mut lines, "HELD ")
        .await
        .parse()
        .expect("HELD <epoch>");

    let backend = backend_at(&server.url(), &prefix).await;
    let lock_name = testkit::names::lock(&prefix, &LockKey::from(key));
    let locker = Locker::builder(backend)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    assert!(
        locker.try_lock(key).await.unwrap().is_none(),
        "the child holds the lock"
    );
    let mut con = server.connection().await;

    child.kill().await.expect("SIGKILL the child");
    let killed = Instant::now();
    let left = pttl(&mut con, &lock_name).await;
    assert!(
        left > 0,
        "the lock key must still live after the kill: PTTL {left}"
    );
    let guard = locker
        .lock(key)
        .await
        .expect("the lock frees up at its TTL");
    let blocked = killed.elapsed();
    println!("killed holder blocked for {blocked:?} (PTTL at the kill: {left} ms)");
    assert!(
        blocked < CHILD_LEASE_TTL + Duration::from_secs(1),
        "a killed holder blocked others for {blocked:?}"
    );
    assert!(
        blocked + Duration::from_millis(50) >= Duration::from_millis(left as u64),
        "the lock was taken {blocked:?} after the kill, before its TTL of {left} ms ran out"
    );
    assert!(guard.fencing_token().epoch > child_epoch);
    guard.release().await.unwrap();
}
