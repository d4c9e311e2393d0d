//! Readiness: immediate, the inner clone driven ready under the lock, errors, and
//! no inner readiness held while waiting for a lock.

use super::*;

#[tokio::test]
async fn readiness_is_immediate_and_the_inner_clone_is_driven_ready_under_the_lock() {
    let locker = memory_locker();
    let (inner, polls) = Picky::new(2);
    let mut svc = LockLayer::new(locker.clone(), sku_header()).layer(inner);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    assert_eq!(
        polls.load(Ordering::SeqCst),
        0,
        "poll_ready reached the inner"
    );
    // The future polls its clone until ready (two pending polls, then ready) and
    // calls that same instance.
    assert_eq!(svc.call(request(Some("k"))).await.unwrap(), "ok");
    assert_eq!(polls.load(Ordering::SeqCst), 3);
    assert_eq!(svc.call(request(Some("k"))).await.unwrap(), "ok");
    assert!(becomes_free(&locker, "k").await, "lock still held");
}

#[tokio::test]
async fn an_inner_readiness_error_fails_the_call_and_releases_the_lock() {
    let locker = memory_locker();
    let svc = LockLayer::new(locker.clone(), sku_header()).layer(Broken);
    let err = svc.clone().oneshot(request(Some("k"))).await.unwrap_err();
    assert_eq!(err.to_string(), "inner not ready");
    assert!(becomes_free(&locker, "k").await, "lock still held");
    // Run unlocked (an explicit opt-in), the inner service is still driven ready.
    let unlocked = LockLayer::new(locker.clone(), sku_header())
        .run_unlocked_without_key()
        .layer(Broken);
    let err = unlocked.oneshot(request(None)).await.unwrap_err();
    assert_eq!(err.to_string(), "inner not ready");
}

/// A request waiting for a hot key must not hold the inner service's readiness
/// (here a concurrency permit): requests for other keys go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_its_lock_holds_no_inner_readiness() {
    let locker = Locker::builder(MemoryBackend::new())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let inner = OnePermit::new(service_fn(|req: Request<()>| async move {
        Ok::<_, Infallible>(req.headers()["x-sku"].to_str().unwrap().to_owned())
    }));
    let svc = LockLayer::new(locker.clone(), sku_header()).layer(inner);

    let held = locker.lock("a").await.unwrap();
    let waits = locker.stats().local_waits;
    let a = tokio::spawn(svc.clone().oneshot(request(Some("a"))));
    assert!(
        wait_until(Duration::from_secs(2), || async {
            locker.stats().local_waits > waits
        })
        .await,
        "request A never waited for key a"
    );
    let b = tokio::time::timeout(
        Duration::from_secs(2),
        svc.clone().oneshot(request(Some("b"))),
    )
    .await
    .expect("request B was blocked by request A's wait for another key")
    .unwrap();
    assert_eq!(b, "b");
    assert!(!a.is_finished(), "A ran while key a was held");
    held.release().await.unwrap();
    assert_eq!(a.await.unwrap().unwrap(), "a");
}
