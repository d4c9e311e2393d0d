//! Failures: a failed lock, inner errors, requests without a key, wait timeouts
//! and their HTTP mapping.

use super::*;

/// If the lock cannot be taken, the inner service is never polled nor called.
#[tokio::test]
async fn a_failed_lock_never_touches_the_inner_service() {
    let locker = memory_locker();
    let (inner, polls) = Picky::new(0);
    let held = locker.lock("busy").await.unwrap();
    let err = LockLayer::new(locker.clone(), sku_header())
        .layer(inner)
        .oneshot(request(Some("busy")))
        .await
        .unwrap_err();
    assert_lockflight_error(&err, |e| matches!(e, Error::Timeout { .. }));
    assert_eq!(
        polls.load(Ordering::SeqCst),
        0,
        "the inner service was polled"
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn inner_errors_propagate() {
    let locker = memory_locker();
    let inner = service_fn(|_req: Request<()>| async { Err::<(), _>("inner failed") });
    let err = LockLayer::new(locker, sku_header())
        .layer(inner)
        .oneshot(request(Some("k")))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "inner failed");
}

#[tokio::test]
async fn requests_without_a_key_follow_the_policy() {
    let locker = memory_locker();
    let ran = Arc::new(AtomicUsize::new(0));
    let inner = {
        let ran = ran.clone();
        service_fn(move |req: Request<()>| {
            let ran = ran.clone();
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(req.extensions().get::<LockInfo>().is_some())
            }
        })
    };
    // Refused by default, naming what is missing.
    let reject = LockLayer::new(locker.clone(), sku_header()).layer(inner.clone());
    let err = reject.oneshot(request(None)).await.unwrap_err();
    assert_lockflight_error(
        &err,
        |e| matches!(e, Error::InvalidKey { reason, .. } if reason.contains("x-sku")),
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the handler ran for a rejected request"
    );

    // Unlocked only when asked for.
    let pass = LockLayer::new(locker.clone(), sku_header())
        .run_unlocked_without_key()
        .layer(inner);
    assert!(
        !pass.oneshot(request(None)).await.unwrap(),
        "no lock info without a key"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // A present but empty key is rejected by validation, not locked.
    let empty = LockLayer::new(locker, sku_header())
        .layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(true)
        }))
        .oneshot(request(Some("")))
        .await
        .unwrap_err();
    assert!(matches!(
        empty.downcast_ref::<Error>(),
        Some(Error::InvalidKey { .. })
    ));
}

#[tokio::test]
async fn a_wait_timeout_is_an_error_naming_the_key() {
    let locker = memory_locker();
    let held = locker.lock("busy").await.unwrap();
    let svc =
        LockLayer::new(locker.clone(), sku_header()).layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(())
        }));
    let err = svc.oneshot(request(Some("busy"))).await.unwrap_err();
    match err.downcast_ref::<Error>() {
        Some(Error::Timeout { key, .. }) => assert_eq!(key, &LockKey::from("busy")),
        other => panic!("expected a timeout, got {other:?}"),
    }
    held.release().await.unwrap();
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_maps_a_timeout_to_503_with_retry_after_and_a_problem() {
    let locker = memory_locker();
    let held = locker.lock("busy").await.unwrap();
    let svc = LockLayer::new(locker.clone(), sku_header())
        .handle_errors()
        .layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(axum::response::Response::new(axum::body::Body::empty()))
        }));
    let res = svc.oneshot(request(Some("busy"))).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(
        res.headers()[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["code"], "lock_timeout", "{body}");
    assert_eq!(body["status"], 503, "{body}");
    held.release().await.unwrap();
}
