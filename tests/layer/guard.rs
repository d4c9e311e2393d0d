//! The guard's lifetime: the handler sees the lock, which is held until the
//! response future completes or is dropped.

use super::*;

#[tokio::test]
async fn handler_sees_lock_info_and_the_lock_is_released_on_completion() {
    let locker = memory_locker();
    let inner = service_fn(|req: Request<()>| async move {
        let info = req.extensions().get::<LockInfo>().cloned();
        Ok::<_, Infallible>(info)
    });
    let svc = LockLayer::new(locker.clone(), sku_header()).layer(inner);
    let info = svc.oneshot(request(Some("555"))).await.unwrap().unwrap();
    assert_eq!(info.key, LockKey::from("555"));
    assert!(info.fencing_token.epoch > 0);
    assert!(becomes_free(&locker, "555").await, "lock still held");
    assert!(no_active_keys(&locker).await, "a slot remained");
}

#[tokio::test]
async fn the_guard_lives_until_the_response_future_completes_or_is_dropped() {
    let locker = memory_locker();
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let inner = {
        let (release, started) = (release.clone(), started.clone());
        service_fn(move |_req: Request<()>| {
            let (release, started) = (release.clone(), started.clone());
            async move {
                started.notify_one();
                release.notified().await;
                Ok::<_, Infallible>("done")
            }
        })
    };
    let mut svc = LockLayer::new(locker.clone(), sku_header()).layer(inner);

    // Completed: held while pending, free afterwards.
    let fut = svc.ready().await.unwrap().call(request(Some("a")));
    let task = tokio::spawn(fut);
    started.notified().await;
    assert!(
        !is_free(&locker, "a").await,
        "lock not held while the handler runs"
    );
    release.notify_one();
    assert_eq!(task.await.unwrap().unwrap(), "done");
    assert!(becomes_free(&locker, "a").await, "lock still held");

    // Dropped: the lock is released too.
    let fut = svc.ready().await.unwrap().call(request(Some("a")));
    let task = tokio::spawn(fut);
    started.notified().await;
    assert!(!is_free(&locker, "a").await);
    task.abort();
    let _ = task.await;
    assert!(becomes_free(&locker, "a").await, "lock still held");
    assert!(no_active_keys(&locker).await, "a slot remained");
}
