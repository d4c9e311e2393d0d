//! Lease loss while a handler runs: dropped and failed, or signalled to it.

use lockflight::LockerBuilder;

use super::*;

/// A locker builder on the shared Redis under a new prefix (from `name`) with a
/// 300 ms lease, and the Redis name of its lock `k`.
async fn short_lease(name: &str) -> (LockerBuilder, Vec<u8>) {
    let prefix = testkit::unique_prefix(name);
    let backend = RedisBackend::builder(testkit::shared().url())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let lock_name = testkit::names::lock(&prefix, &LockKey::from("k"));
    let builder = Locker::builder(backend).lease_ttl(Duration::from_millis(300));
    (builder, lock_name)
}

/// Deletes the lock `lock_name` behind its holder's back; it must be held.
async fn delete_lock(lock_name: &[u8]) {
    let mut con = testkit::shared().connection().await;
    let deleted: u64 = testkit::query(&mut con, redis::cmd("DEL").arg(lock_name)).await;
    assert_eq!(deleted, 1, "the lock was not held while the handler ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_loss_drops_the_handler_and_fails_with_lease_lost() {
    let (locker, lock_name) = short_lease("layer-loss").await;
    let locker = locker.build().unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let inner = {
        let (dropped, finished, started) = (dropped.clone(), finished.clone(), started.clone());
        service_fn(move |_req: Request<()>| {
            let flag = DropFlag(dropped.clone());
            let (finished, started) = (finished.clone(), started.clone());
            async move {
                let _flag = flag;
                started.notify_one();
                tokio::time::sleep(Duration::from_secs(10)).await;
                finished.store(true, Ordering::SeqCst);
                Ok::<_, Infallible>(())
            }
        })
    };
    let svc = LockLayer::new(locker, sku_header()).layer(inner);
    let call = tokio::spawn(svc.oneshot(request(Some("k"))));
    started.notified().await;
    delete_lock(&lock_name).await;
    let err = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the loss was not noticed")
        .unwrap()
        .unwrap_err();
    assert_lockflight_error(&err, |e| matches!(e, Error::LeaseLost { .. }));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler future was not dropped"
    );
    assert!(!finished.load(Ordering::SeqCst));
}

/// An axum app on real Redis whose `POST /items/{sku}` handler holds the lock of
/// `sku` and watches `Extension<LockInfo>`: it waits (up to 5 s) for the loss, then
/// answers 409 if the lease is lost, 200 otherwise. Returns the app, the lock's Redis
/// name for "k", a notification when the handler has started, and flags set when
/// the handler's future is dropped and when it finished.
#[cfg(feature = "axum")]
async fn loss_app(
    policy: lockflight::LossPolicy,
) -> (
    axum::Router,
    Vec<u8>,
    Arc<tokio::sync::Notify>,
    Arc<AtomicBool>,
    Arc<AtomicBool>,
) {
    use axum::Extension;
    use lockflight::layer::KeyFrom;

    let (locker, lock_name) = short_lease("layer-signal").await;
    let locker = locker.on_loss(policy).build().unwrap();
    let started = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let handler = {
        let (started, dropped, finished) = (started.clone(), dropped.clone(), finished.clone());
        move |Extension(info): Extension<LockInfo>| async move {
            let _flag = DropFlag(dropped);
            started.notify_one();
            let _ = tokio::time::timeout(Duration::from_secs(5), info.loss.lost()).await;
            finished.store(true, Ordering::SeqCst);
            if info.loss.is_lost() {
                assert!(info.loss.reason().is_some());
                (StatusCode::CONFLICT, "not written: lease lost")
            } else {
                (StatusCode::OK, "written")
            }
        }
    };
    let app = axum::Router::new()
        .route("/items/{sku}", axum::routing::post(handler))
        .route_layer(LockLayer::new(locker, KeyFrom::path_param("sku")).handle_errors());
    (app, lock_name, started, dropped, finished)
}

/// Calls the [`loss_app`] of `policy`, deletes the lock behind its holder's back once
/// the handler runs, and returns the response's status and body, and the flags set
/// when the handler's future was dropped and when it finished.
#[cfg(feature = "axum")]
async fn steal_while_handling(
    policy: lockflight::LossPolicy,
) -> (StatusCode, Bytes, Arc<AtomicBool>, Arc<AtomicBool>) {
    let (app, lock_name, started, dropped, finished) = loss_app(policy).await;
    let req = Request::post("/items/k")
        .body(axum::body::Body::empty())
        .unwrap();
    let call = tokio::spawn(app.oneshot(req));
    started.notified().await;
    delete_lock(&lock_name).await;
    let res = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("no response")
        .unwrap()
        .unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, body, dropped, finished)
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_signal_the_handler_sees_the_loss_and_its_response_completes() {
    let (status, body, _dropped, finished) =
        steal_while_handling(lockflight::LossPolicy::Signal).await;
    assert!(finished.load(Ordering::SeqCst), "the handler was aborted");
    assert_eq!(status, StatusCode::CONFLICT, "{body:?}");
    assert_eq!(body, "not written: lease lost");
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_abort_the_handler_is_dropped_and_the_client_gets_lease_lost() {
    let (status, body, dropped, finished) =
        steal_while_handling(lockflight::LossPolicy::Abort).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["code"], "lease_lost", "{body}");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler future was not dropped"
    );
    assert!(
        !finished.load(Ordering::SeqCst),
        "the handler ran to its end"
    );
}
