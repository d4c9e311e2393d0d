//! `IdempotencyLayer` through real HTTP with axum: the key scoped by the matched
//! route (the handler reads the lease in its extensions), replay byte for byte,
//! `422` on another body, and an outage answered `503 lock_backend_unavailable`
//! without running the handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use lockflight::guard::LockInfo;
use lockflight::layer::IdempotencyLayer;
use testkit::{CountingProxy, RedisServer};

use super::support::{locker_at, redis_locker, serve};

fn app(locker: &lockflight::Locker, runs: Arc<AtomicUsize>) -> Router {
    let pay = move |Extension(lock): Extension<LockInfo>, body: String| {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            format!(
                "run {n} of {body} under {} as {}",
                lock.fencing_token, lock.key
            )
        }
    };
    Router::new()
        .route("/orders/{id}/pay", post(pay))
        .route_layer(
            IdempotencyLayer::new(locker.clone())
                .required()
                .handle_errors(),
        )
}

fn pay(id: &str, key: &str, body: &'static str) -> Request<super::support::Body> {
    Request::post(format!("/orders/{id}/pay"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(body.as_bytes())).boxed())
        .unwrap()
}

#[tokio::test]
async fn an_idempotent_route_runs_once_and_replays_over_http() {
    let locker = redis_locker("idem-http", Duration::from_secs(2)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let served = serve(app(&locker, Arc::clone(&runs))).await;
    let with_url = |mut req: Request<_>| {
        *req.uri_mut() = served.url(&req.uri().to_string()).parse().unwrap();
        req
    };
    let first = served
        .request(with_url(pay("7", "k1", "{\"eur\":5}")))
        .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert!(
        first
            .text()
            .ends_with("as idempotency:POST /orders/{id}/pay k1"),
        "scoped by the matched route: {}",
        first.text()
    );
    let again = served
        .request(with_url(pay("7", "k1", "{\"eur\":5}")))
        .await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body, first.body, "byte for byte");
    // Another order under the same key and route is another request.
    let other = served
        .request(with_url(pay("8", "k1", "{\"eur\":5}")))
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem_code(), "idempotency_key_reused");
    let missing = served.post("/orders/7/pay", "{}").await;
    assert_eq!(missing.problem_code(), "idempotency_key_missing");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_outage_is_503_and_the_handler_does_not_run() {
    let server = RedisServer::start();
    let proxy = CountingProxy::start(&server).await;
    let locker = locker_at(&proxy.url(), Duration::from_millis(800)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let served = serve(app(&locker, Arc::clone(&runs))).await;
    let with_url = |mut req: Request<_>| {
        *req.uri_mut() = served.url(&req.uri().to_string()).parse().unwrap();
        req
    };
    proxy.blackhole(true);
    let reply = served.request(with_url(pay("7", "k1", "{}"))).await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert_eq!(reply.problem_code(), "lock_backend_unavailable");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "never ran without idempotency"
    );
    proxy.blackhole(false);
}
