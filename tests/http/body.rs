//! The lock is taken when the request is ready: `Locked<T>` receives and validates
//! the body first, so a slow upload holds no lock and a malformed one takes none.

use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Json, Router};
use bytes::Bytes;
use http::StatusCode;
use lockflight::guard::LockInfo;
use lockflight::layer::{KeyFrom, LockLayer, Locked};
use lockflight::{Error, Locker};
use serde::Deserialize;

use super::support::{redis_locker, serve};

#[derive(Debug, Deserialize)]
struct Debit {
    cents: u64,
}

async fn debit_in_handler(Locked(Json(debit), lock): Locked<Json<Debit>>) -> String {
    format!("{} {}", lock.key, debit.cents)
}

/// The body-aware form: the lock after the body.
fn in_handler(locker: &Locker) -> Router {
    Router::new()
        .route("/accounts/{id}/debit", post(debit_in_handler))
        .route_layer(
            LockLayer::new(locker.clone(), KeyFrom::path_param("id"))
                .key_prefix("account:")
                .lock_in_handler()
                .handle_errors(),
        )
}

/// The layer alone: the lock before the body.
fn before_handler(locker: &Locker) -> Router {
    async fn debit(Extension(lock): Extension<LockInfo>, Json(debit): Json<Debit>) -> String {
        format!("{} {}", lock.key, debit.cents)
    }
    Router::new()
        .route("/accounts/{id}/debit", post(debit))
        .route_layer(
            LockLayer::new(locker.clone(), KeyFrom::path_param("id"))
                .key_prefix("account:")
                .handle_errors(),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_holds_no_lock_with_locked() {
    let locker = redis_locker("http-slow", Duration::from_millis(500)).await;
    let served = serve(in_handler(&locker)).await;

    // A client starts its upload and stalls in the middle of the body.
    let (body, slow) = served.slow_post("/accounts/alice/debit");
    body.send(Bytes::from_static(b"{\"cents\":")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Meanwhile the same account is debited at once, more than once.
    for _ in 0..3 {
        let reply = served.post("/accounts/alice/debit", r#"{"cents":5}"#).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.text(), "account:alice 5");
    }
    assert!(
        testkit::wait_until(Duration::from_secs(5), || testkit::is_free(
            &locker,
            "account:alice"
        ))
        .await,
        "the stalled upload holds the lock"
    );

    // The upload completes, then locks, and succeeds.
    body.send(Bytes::from_static(b"7}")).await.unwrap();
    drop(body);
    let reply = slow.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.text(), "account:alice 7");
}

/// The contrast that shows what `Locked` buys: the layer alone holds the lock
/// while the body trickles in, and the other request times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_holds_the_lock_when_the_layer_locks_before_the_body() {
    let locker = redis_locker("http-slow-layer", Duration::from_millis(300)).await;
    let served = serve(before_handler(&locker)).await;
    let (body, slow) = served.slow_post("/accounts/alice/debit");
    body.send(Bytes::from_static(b"{\"cents\":")).await.unwrap();
    assert!(
        testkit::wait_until(Duration::from_secs(5), || async {
            !testkit::is_free(&locker, "account:alice").await
        })
        .await,
        "the stalled upload never took the lock"
    );
    let reply = served.post("/accounts/alice/debit", r#"{"cents":5}"#).await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert_eq!(reply.problem_code(), "lock_timeout");
    body.send(Bytes::from_static(b"7}")).await.unwrap();
    drop(body);
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn a_malformed_request_takes_no_lock_and_gets_a_problem() {
    let locker = redis_locker("http-malformed", Duration::from_secs(5)).await;
    let served = serve(in_handler(&locker)).await;
    let before = locker.stats();
    for (body, status) in [
        ("{\"cents\":", StatusCode::BAD_REQUEST),
        ("{\"cents\":-1}", StatusCode::UNPROCESSABLE_ENTITY),
        ("[]", StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let reply = served.post("/accounts/alice/debit", body).await;
        assert_eq!(reply.status, status, "{body}: {}", reply.text());
        assert_eq!(reply.problem_code(), "invalid_request", "{body}");
        let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert!(v["detail"].as_str().is_some_and(|d| !d.is_empty()), "{v}");
    }
    // Not JSON at all: 415 from axum's Json, as a problem too.
    let reply = served
        .send(http::Method::POST, "/accounts/alice/debit", None)
        .await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(reply.problem_code(), "invalid_request");
    let spent = locker.stats() - before;
    assert_eq!(
        (spent.acquire_attempts, spent.local_waits, spent.handoffs),
        (0, 0, 0),
        "a malformed request touched the lock"
    );
    // A good one locks once.
    let reply = served.post("/accounts/alice/debit", r#"{"cents":1}"#).await;
    assert_eq!(reply.text(), "account:alice 1");
    assert_eq!((locker.stats() - before).acquire_attempts, 1);
}

#[tokio::test]
async fn locked_without_lock_in_handler_refuses_and_never_runs_unlocked() {
    let locker = redis_locker("http-nolayer", Duration::from_secs(5)).await;
    let app = Router::new()
        .route("/accounts/{id}/debit", post(debit_in_handler))
        .route_layer(LockLayer::new(locker, KeyFrom::path_param("id")).handle_errors());
    let served = serve(app).await;
    let reply = served.post("/accounts/alice/debit", r#"{"cents":1}"#).await;
    assert_eq!(
        reply.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        reply.text()
    );
    assert_eq!(reply.problem_code(), "invalid_config");
}

/// Inside a handler holding its lock through `Locked`, locking the same key again
/// fails at once instead of waiting behind itself.
#[tokio::test]
async fn locking_the_same_key_inside_a_locked_handler_is_reentrant() {
    let locker = redis_locker("http-reentrant", Duration::from_secs(5)).await;
    let inner = locker.clone();
    let handler = move |Locked(Json(_), lock): Locked<Json<serde_json::Value>>| {
        let inner = inner.clone();
        async move {
            match inner.lock(lock.key.clone()).await {
                Err(Error::Reentrant { .. }) => "reentrant",
                Err(_) => "other error",
                Ok(_) => "locked twice",
            }
        }
    };
    let app = Router::new()
        .route("/accounts/{id}/debit", post(handler))
        .route_layer(
            LockLayer::new(locker, KeyFrom::path_param("id"))
                .lock_in_handler()
                .handle_errors(),
        );
    let served = serve(app).await;
    let reply = served.post("/accounts/alice/debit", "{}").await;
    assert_eq!(reply.text(), "reentrant");
}

/// A lease lost while a `Locked` handler runs: the layer drops the handler before
/// it can finish, and the client gets `503 lease_lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_in_a_locked_handler_drops_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let prefix = testkit::unique_prefix("http-locked-loss");
    let backend = lockflight::RedisBackend::builder(testkit::shared().url())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let lock_name = testkit::names::lock(&prefix, &lockflight::LockKey::from("account:alice"));
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_millis(300))
        .build()
        .unwrap();
    let started = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(AtomicBool::new(false));
    let handler = {
        let (started, finished) = (Arc::clone(&started), Arc::clone(&finished));
        move |Locked(Json(_), lock): Locked<Json<serde_json::Value>>| async move {
            started.notify_one();
            let _ = tokio::time::timeout(Duration::from_secs(5), lock.loss.lost()).await;
            // Under LossPolicy::Abort the layer drops this future first.
            tokio::time::sleep(Duration::from_millis(500)).await;
            finished.store(true, Ordering::SeqCst);
            "written"
        }
    };
    let app = Router::new()
        .route("/accounts/{id}/debit", post(handler))
        .route_layer(
            LockLayer::new(locker, KeyFrom::path_param("id"))
                .key_prefix("account:")
                .lock_in_handler()
                .handle_errors(),
        );
    let served = Arc::new(serve(app).await);
    let call = {
        let served = Arc::clone(&served);
        tokio::spawn(async move { served.post("/accounts/alice/debit", "{}").await })
    };
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the handler never ran");
    let mut con = testkit::shared().connection().await;
    let deleted: u64 = testkit::query(&mut con, redis::cmd("DEL").arg(&lock_name)).await;
    assert_eq!(deleted, 1, "the lock was not held while the handler ran");
    let reply = call.await.unwrap();
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert_eq!(reply.problem_code(), "lease_lost");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the handler ran to its end"
    );
}
