//! A guarded request whose key cannot be found is refused, its route logged;
//! running unlocked is an explicit opt-in.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use lockflight::guard::LockInfo;
use lockflight::layer::{KeyFrom, LockLayer};

use testkit::Logs;

use super::support::{redis_locker, serve};

/// A handler that counts its runs and says whether it ran under a lock.
fn counted(runs: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(move |req: axum::extract::Request| {
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if req.extensions().get::<LockInfo>().is_some() {
                "locked"
            } else {
                "UNLOCKED"
            }
        }
    })
}

#[tokio::test]
async fn a_route_that_yields_no_key_is_refused_with_500_and_logged_with_its_route() {
    let (logs, _guard) = Logs::capture();
    let locker = redis_locker("http-nokey", Duration::from_secs(5)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        // The parameter is `{id}`, the layer asks for `sku`.
        .route("/items/{id}/reserve", counted(&runs))
        .route_layer(LockLayer::new(locker.clone(), KeyFrom::path_param("sku")).handle_errors())
        // Around the router as a service, the layer runs before routing: no
        // parameters there.
        .nest_service(
            "/carts",
            tower::Layer::layer(
                &LockLayer::new(locker.clone(), KeyFrom::path_param("sku")).handle_errors(),
                Router::new().route("/{sku}", counted(&runs)),
            ),
        );
    let served = serve(app).await;
    let before = locker.stats();
    for path in ["/items/7/reserve", "/carts/7"] {
        let reply = served.post(path, "{}").await;
        assert_eq!(
            reply.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{path}: {}",
            reply.text()
        );
        assert_eq!(reply.problem_code(), "invalid_config", "{path}");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a handler ran without its lock"
    );
    assert_eq!((locker.stats() - before).acquire_attempts, 0);
    let text = logs.text();
    assert_eq!(
        logs.lines_with(&["WARN", "POST /items/{id}/reserve"]),
        2,
        "the refusal and its response, naming the route: {text}"
    );
    assert!(text.contains("no path parameter `sku`"), "{text}");
    assert!(text.contains("Router::route_layer"), "{text}");
    assert!(text.contains("POST /carts/7"), "{text}");
}

#[tokio::test]
async fn a_request_without_its_key_is_refused_with_400_unless_unlocked_is_asked_for() {
    let (logs, _guard) = Logs::capture();
    let locker = redis_locker("http-noheader", Duration::from_secs(5)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let header = || KeyFrom::header(http::HeaderName::from_static("x-account"));
    let app = Router::new()
        .route("/strict", counted(&runs))
        .route_layer(LockLayer::new(locker.clone(), header()).handle_errors())
        .merge(
            Router::new().route("/lenient", counted(&runs)).route_layer(
                LockLayer::new(locker.clone(), header())
                    .run_unlocked_without_key()
                    .handle_errors(),
            ),
        );
    let served = serve(app).await;

    let reply = served.post("/strict", "{}").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(reply.problem_code(), "invalid_key");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        logs.lines_with(&["INFO", "POST /strict"]),
        1,
        "{}",
        logs.text()
    );
    assert!(
        logs.text().contains("no `x-account` header"),
        "{}",
        logs.text()
    );

    // With the header, it runs locked.
    let req = Request::builder()
        .method(Method::POST)
        .uri(served.url("/strict"))
        .header("x-account", "7")
        .body(Full::from("{}").boxed())
        .unwrap();
    assert_eq!(served.request(req).await.text(), "locked");

    // The explicit opt-in runs it unlocked.
    let reply = served.post("/lenient", "{}").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "UNLOCKED");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// An in-handler route whose handler forgot `Locked<_>` runs unlocked (nothing can
/// stop a handler that never asks), but says so at `WARN`, once per route.
#[tokio::test]
async fn an_in_handler_route_without_locked_is_logged_once() {
    let (logs, _guard) = Logs::capture();
    let locker = redis_locker("http-forgot-locked", Duration::from_secs(5)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/items/{sku}", counted(&runs))
        .route_layer(
            LockLayer::new(locker.clone(), KeyFrom::path_param("sku"))
                .lock_in_handler()
                .handle_errors(),
        );
    let served = serve(app).await;
    for _ in 0..3 {
        assert_eq!(served.post("/items/7", "{}").await.text(), "UNLOCKED");
    }
    assert_eq!(
        logs.lines_with(&["WARN", "ran UNLOCKED"]),
        1,
        "{}",
        logs.text()
    );
    assert!(logs.text().contains("POST /items/{sku}"), "{}", logs.text());
}

/// An empty or blank path segment is no key: `/items//reserve` is refused with
/// `400 invalid_key`, with and without a `key_prefix` (where the key would
/// otherwise be the prefix alone, one lock for every such request), before and
/// in the handler (`Locked`), and nothing reaches the backend or the handler.
#[tokio::test]
async fn an_empty_or_blank_key_segment_is_refused_with_400() {
    let locker = redis_locker("http-blank", Duration::from_secs(5)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let in_handler = {
        let runs = Arc::clone(&runs);
        post(
            move |lockflight::layer::Locked(_, _): lockflight::layer::Locked<String>| {
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    "locked"
                }
            },
        )
    };
    let sku = || KeyFrom::path_param("sku");
    let app = Router::new()
        .route("/plain/{sku}/reserve", counted(&runs))
        .route_layer(LockLayer::new(locker.clone(), sku()).handle_errors())
        .merge(
            Router::new()
                .route("/prefixed/{sku}/reserve", counted(&runs))
                .route_layer(
                    LockLayer::new(locker.clone(), sku())
                        .key_prefix("sku:")
                        .handle_errors(),
                ),
        )
        .merge(
            Router::new()
                .route("/body/{sku}/reserve", in_handler)
                .route_layer(
                    LockLayer::new(locker.clone(), sku())
                        .key_prefix("sku:")
                        .lock_in_handler()
                        .handle_errors(),
                ),
        );
    let served = serve(app).await;
    let before = locker.stats();
    for route in ["plain", "prefixed", "body"] {
        for segment in ["", "%20", "%20%09", "%E3%80%80"] {
            let path = format!("/{route}/{segment}/reserve");
            let reply = served.post(&path, "{}").await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{path}: {}",
                reply.text()
            );
            assert_eq!(reply.problem_code(), "invalid_key", "{path}");
        }
        // A key that names something still locks.
        let path = format!("/{route}/7/reserve");
        let reply = served.post(&path, "{}").await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "a handler ran without a key"
    );
    assert_eq!(
        (locker.stats() - before).acquire_attempts,
        3,
        "a request without a key reached the backend"
    );
    locker.shutdown().await;
}
