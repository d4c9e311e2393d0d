//! The inventory example (`examples/inventory/`) against real Redis: instances that
//! share one Redis and one SQLite file never oversell, a handler whose lease is lost
//! is dropped before it writes, the database's fencing guard rejects stale writers,
//! the plain mode's plain Redis lock keeps the stock correct without lockflight,
//! the tower layers map timeouts, missing keys and concurrent reads as
//! documented, and the leader-only job runs on one instance at a time, its killed
//! leader replaced in a greater term.

use inventory::{app, client, gateway};

mod job;
mod plain;
mod reserve;
mod shapes;
mod startup;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use app::{AppState, Hooks, WriteOutcome};
use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::routing::post;
use client::Http;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use lockflight::layer::{KeyFrom, LockLayer};
use lockflight::{FencingToken, LockKey, Locker, MemoryBackend, RedisBackend, guard::LockInfo};
use serde_json::json;
use tower::ServiceExt;

/// A Redis backend on the shared test server, under `prefix`.
pub(crate) async fn redis_backend(prefix: &str) -> RedisBackend {
    RedisBackend::builder(testkit::shared().url())
        .prefix(prefix)
        .connect()
        .await
        .expect("connect to the test Redis")
}

/// An inventory instance's state: its own Redis backend and locker (as a separate
/// process would have), the given database.
pub(crate) async fn instance(
    name: &str,
    prefix: &str,
    db: sqlx::SqlitePool,
    configure: impl FnOnce(lockflight::LockerBuilder) -> lockflight::LockerBuilder,
) -> AppState {
    let locker = configure(Locker::builder(redis_backend(prefix).await))
        .build()
        .expect("locker");
    AppState::new(db, locker, name).describe("redis", "test")
}

/// Serves `router` on 127.0.0.1:0; returns its base URL. The server lives as long
/// as the test's runtime.
pub(crate) async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

pub(crate) async fn create_item(http: &Http, base: &str, sku: &str, stock: i64) {
    let res = http
        .post(
            &format!("{base}/items"),
            &json!({ "sku": sku, "name": sku, "stock": stock }),
        )
        .await
        .expect("POST /items");
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.text());
}

pub(crate) async fn file_db(dir: &Path) -> sqlx::SqlitePool {
    app::open_db(Some(&dir.join("inventory.db")))
        .await
        .expect("open the database")
}

/// `POST {base}/items/{sku}/reserve` of one unit.
pub(crate) async fn reserve_one(http: &Http, base: &str, sku: &str) -> client::Reply {
    http.post(&format!("{base}/items/{sku}/reserve"), &json!({ "qty": 1 }))
        .await
        .expect("request")
}

/// Asserts `res` is a 503 with `Retry-After: 1`: a lock wait that timed out.
pub(crate) fn assert_busy(res: &client::Reply) {
    assert_eq!(
        res.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        res.text()
    );
    assert_eq!(
        res.headers.get(header::RETRY_AFTER).map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
}

/// `n` concurrent reservations of one unit of `sku`, request `i` sent to
/// `urls[i % len]`: the bodies of the accepted ones and how many were refused
/// as out of stock. Any other reply fails the test.
pub(crate) async fn reserve_concurrently(
    http: &Http,
    urls: &[String],
    sku: &str,
    n: usize,
) -> (Vec<serde_json::Value>, usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let url = format!("{}/items/{sku}/reserve", urls[i % urls.len()]);
        let http = http.clone();
        tasks.spawn(async move { http.post(&url, &json!({ "qty": 1 })).await });
    }
    let mut reserved = Vec::new();
    let mut out_of_stock = 0;
    while let Some(res) = tasks.join_next().await {
        let res = res.expect("task").expect("request");
        match res.status {
            StatusCode::OK => reserved.push(res.json()),
            StatusCode::CONFLICT => {
                assert_eq!(res.error_code().as_deref(), Some("out_of_stock"));
                out_of_stock += 1;
            }
            other => panic!("unexpected reply {other}: {}", res.text()),
        }
    }
    (reserved, out_of_stock)
}
