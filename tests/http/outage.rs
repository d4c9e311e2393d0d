//! An outage is not contention: an unreachable backend answers
//! `503 lock_backend_unavailable`, logs its start and end at `WARN` once each,
//! counts backend errors, and fails the health probe; a held lock still answers
//! `503 lock_timeout`.

use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use http::StatusCode;
use lockflight::Error;
use lockflight::guard::LockInfo;
use lockflight::layer::{KeyFrom, LockLayer};
use testkit::{CountingProxy, RedisServer};

use testkit::Logs;

use super::support::{locker_at, serve};

async fn key_of(Extension(lock): Extension<LockInfo>) -> String {
    lock.key.to_string()
}

fn app(locker: &lockflight::Locker) -> Router {
    Router::new()
        .route("/accounts/{id}", post(key_of))
        .route_layer(LockLayer::new(locker.clone(), KeyFrom::path_param("id")).handle_errors())
}

/// A partition (the proxy black-holes every byte): 503 lock_backend_unavailable,
/// one WARN for the start and one for the end, the probe fails, and everything
/// works again once the partition heals.
#[tokio::test]
async fn a_partitioned_backend_is_503_lock_backend_unavailable_not_a_timeout() {
    let (logs, _guard) = Logs::capture();
    let server = RedisServer::start();
    let proxy = CountingProxy::start(&server).await;
    let locker = locker_at(&proxy.url(), Duration::from_millis(800)).await;
    let served = serve(app(&locker)).await;
    assert_eq!(served.post("/accounts/alice", "{}").await.text(), "alice");
    let round_trip = locker.check_backend(Duration::from_secs(5)).await;
    assert!(round_trip.is_ok(), "{round_trip:?}");

    proxy.blackhole(true);
    for i in 0..3 {
        let reply = served.post(&format!("/accounts/k{i}"), "{}").await;
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            reply.text()
        );
        assert_eq!(reply.problem_code(), "lock_backend_unavailable");
        assert_eq!(reply.headers[http::header::RETRY_AFTER], "1");
    }
    let probe = locker.check_backend(Duration::from_millis(300)).await;
    assert!(matches!(probe, Err(Error::Backend { .. })), "{probe:?}");
    assert_eq!(
        logs.lines_with(&["WARN", "lock backend unavailable"]),
        1,
        "{}",
        logs.text()
    );

    proxy.blackhole(false);
    let mut healed = false;
    for _ in 0..50 {
        let reply = served.post("/accounts/alice", "{}").await;
        if reply.status == StatusCode::OK {
            healed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(healed, "the service did not come back: {}", logs.text());
    assert_eq!(
        logs.lines_with(&["WARN", "lock backend available again"]),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(logs.lines_with(&["WARN", "lock backend unavailable"]), 1);
}

/// The server is gone (connections refused): the same answer, never lock_timeout.
#[tokio::test]
async fn a_stopped_server_is_503_lock_backend_unavailable() {
    let server = RedisServer::start();
    let locker = locker_at(&server.url(), Duration::from_millis(800)).await;
    let served = serve(app(&locker)).await;
    assert_eq!(
        served.post("/accounts/alice", "{}").await.status,
        StatusCode::OK
    );
    server.kill();
    for i in 0..3 {
        let reply = served.post(&format!("/accounts/k{i}"), "{}").await;
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            reply.text()
        );
        assert_eq!(reply.problem_code(), "lock_backend_unavailable");
    }
    assert!(locker.check_backend(Duration::from_secs(1)).await.is_err());
}

/// A held lock with a healthy backend is contention: lock_timeout, no outage WARN.
#[tokio::test]
async fn a_held_lock_is_still_a_timeout() {
    let (logs, _guard) = Logs::capture();
    let server = RedisServer::start();
    let locker = locker_at(&server.url(), Duration::from_millis(300)).await;
    let served = serve(app(&locker)).await;
    let held = locker.lock("alice").await.unwrap();
    let reply = served.post("/accounts/alice", "{}").await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert_eq!(reply.problem_code(), "lock_timeout");
    assert_eq!(
        logs.lines_with(&["WARN", "lock backend"]),
        0,
        "{}",
        logs.text()
    );
    held.release().await.unwrap();
}

/// With the `metrics` feature, backend errors are counted and availability is a
/// gauge.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn backend_errors_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let proxy = CountingProxy::start(&server).await;
    let locker = locker_at(&proxy.url(), Duration::from_millis(500)).await;
    let served = serve(app(&locker)).await;
    proxy.blackhole(true);
    let reply = served.post("/accounts/alice", "{}").await;
    assert_eq!(reply.problem_code(), "lock_backend_unavailable");
    proxy.blackhole(false);
    assert!(locker.check_backend(Duration::from_secs(5)).await.is_ok());

    let mut errors = 0;
    let mut gauge = None;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        match (key.key().name(), value) {
            ("lockflight_backend_errors_total", DebugValue::Counter(n)) => errors = n,
            ("lockflight_backend_available", DebugValue::Gauge(g)) => gauge = Some(g.into_inner()),
            _ => {}
        }
    }
    assert!(errors >= 1, "no backend error counted");
    assert_eq!(gauge, Some(1.0), "available again after the probe");
}
