//! The test harness's Redis names (`testkit::names`) are the ones the backend
//! writes: every other test reads and writes lockflight's records by them.

use super::*;

/// A held mutex, write lease and permit, and a waiting instance's queue entry,
/// each under the name `testkit::names` gives it (with a key that needs escaping);
/// a connected backend's channel has its subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_names_what_the_backend_writes() {
    let (server, _log, prefix) = shared_scene("names");
    let mut con = server.connection().await;
    let holder_backend = backend_at(&server.url(), &prefix).await;
    let waiter_backend = backend_at(&server.url(), &prefix).await;
    for backend in [&holder_backend, &waiter_backend] {
        let channel = testkit::names::channel(&prefix, backend.instance_id());
        assert_eq!(testkit::numsub(&mut con, &channel).await, 1, "{channel}");
    }
    let holder = Locker::builder(holder_backend).build().unwrap();
    let key = LockKey::from("a{b}%c");

    let guard = holder.lock(&key).await.unwrap();
    let lock = testkit::names::lock(&prefix, &key);
    assert!(
        exists(&mut con, &lock).await,
        "{}",
        String::from_utf8_lossy(&lock)
    );
    let write = holder.rwlock(&key).write().await.unwrap();
    assert!(exists(&mut con, &testkit::suffixed(&lock, ":wr")).await);
    let permit = holder.semaphore(&key, 1).acquire().await.unwrap();
    assert_eq!(
        zcard(&mut con, &testkit::names::permits(&prefix, &key)).await,
        1
    );

    let waiter = Locker::builder(waiter_backend.clone())
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).await.map(drop) })
    };
    assert!(
        wait_queued(
            &con,
            &prefix,
            &waiter_backend,
            &key,
            true,
            Duration::from_secs(10)
        )
        .await,
        "the waiter never showed in {}",
        String::from_utf8_lossy(&testkit::names::queue(&prefix, &key))
    );
    guard.release().await.unwrap();
    within(Duration::from_secs(10), "the waiter", waiting)
        .await
        .unwrap()
        .unwrap();
    write.release().await.unwrap();
    permit.release().await.unwrap();
}
