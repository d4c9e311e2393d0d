//! The layer on the memory backend: replay, refusals, coalescing, the failure
//! policy and the wait for another instance, on a paused clock where time
//! matters.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt, service_fn};

use super::IdempotencyLayer;
use crate::backend::MemoryBackend;
use crate::guard::LockInfo;
use crate::locker::Locker;

type Body = Full<Bytes>;

fn locker(backend: &MemoryBackend) -> Locker {
    Locker::builder(backend.clone()).build().unwrap()
}

fn post(key: Option<&str>, body: &'static str) -> Request<Body> {
    let mut b = Request::post("/payments");
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

/// A handler that counts its runs, waits for `gate` (when given), and answers
/// `status` with its run number, the body it got and its fencing token.
#[allow(clippy::type_complexity)]
fn handler(
    status: StatusCode,
    gate: Option<Arc<tokio::sync::Semaphore>>,
) -> (
    impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future = impl Send>
    + Clone
    + Send
    + 'static,
    Arc<AtomicUsize>,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let svc = service_fn(move |req: Request<Body>| {
        let (runs, gate) = (Arc::clone(&counted), gate.clone());
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(gate) = gate {
                let _open = gate.acquire().await.unwrap();
            }
            let token = req.extensions().get::<LockInfo>().map(|i| i.fencing_token);
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let text = format!("run {n} of {body:?} under {token:?}");
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header("content-type", "text/plain")
                    .header("x-run", n.to_string())
                    .body(Full::new(Bytes::from(text)))
                    .unwrap(),
            )
        }
    });
    (svc, runs)
}

async fn text<B: http_body::Body>(res: Response<B>) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    res.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn a_later_request_replays_the_stored_response_byte_for_byte() {
    let backend = MemoryBackend::new();
    let (inner, runs) = handler(StatusCode::CREATED, None);
    let svc = IdempotencyLayer::new(locker(&backend)).layer(inner);
    let first = svc.clone().oneshot(post(Some("k1"), "a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(
        first.headers()["x-run"],
        "1",
        "the first gets all its headers"
    );
    let first = text(first).await;
    assert!(first.starts_with(b"run 1 of b\"a\" under Some(FencingToken"));
    // Another locker on the same backend is another instance: it replays too.
    let other = IdempotencyLayer::new(locker(&backend)).layer(handler(StatusCode::OK, None).0);
    for svc in [svc.clone(), other] {
        let again = svc.oneshot(post(Some("k1"), "a")).await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()["content-type"], "text/plain");
        assert!(
            again.headers().get("x-run").is_none(),
            "not a stored header"
        );
        assert_eq!(text(again).await, first);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The same key on another route or method is another scope.
    let put = Request::put("/payments")
        .header("idempotency-key", "k1")
        .body(Full::new(Bytes::from_static(b"a")))
        .unwrap();
    let res = svc.clone().oneshot(put).await.unwrap();
    assert!(res.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn refusals_are_problems_with_stable_codes() {
    let backend = MemoryBackend::new();
    let (inner, runs) = handler(StatusCode::OK, None);
    let svc = IdempotencyLayer::new(locker(&backend))
        .required()
        .max_body(8)
        .max_key_len(10)
        .layer(inner);
    let code = |res: Response<_>| async move {
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let status = res.status();
        let body: serde_json::Value = serde_json::from_slice(&text(res).await).unwrap();
        (status, body["code"].as_str().unwrap().to_string())
    };
    svc.clone().oneshot(post(Some("k"), "first")).await.unwrap();
    let cases = [
        (
            post(Some("k"), "second"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
        ),
        (
            post(None, "x"),
            StatusCode::BAD_REQUEST,
            "idempotency_key_missing",
        ),
        (
            post(Some("0123456789a"), "x"),
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
        ),
        (
            post(Some("  "), "x"),
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
        ),
        (
            post(Some("k2"), "123456789"),
            StatusCode::PAYLOAD_TOO_LARGE,
            "idempotency_body_too_large",
        ),
    ];
    for (req, status, want) in cases {
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(code(res).await, (status, want.to_string()));
    }
    let mut declared = post(Some("k3"), "1");
    declared
        .headers_mut()
        .insert("content-length", http::HeaderValue::from(100));
    let res = svc.clone().oneshot(declared).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no refused request ran");
}

#[tokio::test]
async fn without_required_a_request_without_key_passes_untouched() {
    let backend = MemoryBackend::new();
    let (inner, runs) = handler(StatusCode::OK, None);
    let svc = IdempotencyLayer::new(locker(&backend)).layer(inner);
    for _ in 0..2 {
        let res = svc.clone().oneshot(post(None, "x")).await.unwrap();
        assert!(text(res).await.ends_with(b"under None"), "no lease");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn duplicates_in_flight_share_the_first_response_without_requests() {
    let backend = MemoryBackend::new();
    let locker = locker(&backend);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (inner, runs) = handler(StatusCode::OK, Some(Arc::clone(&gate)));
    let svc = IdempotencyLayer::new(locker.clone()).layer(inner);
    let mut calls: Vec<_> = (0..20)
        .map(|_| Box::pin(svc.clone().oneshot(post(Some("dup"), "same"))))
        .collect();
    let mut other = Box::pin(svc.clone().oneshot(post(Some("dup"), "other body")));
    for call in &mut calls {
        assert!(futures::poll!(call.as_mut()).is_pending());
    }
    assert!(futures::poll!(other.as_mut()).is_pending());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    gate.add_permits(1);
    let mut bodies = Vec::new();
    for res in futures::future::join_all(calls).await {
        bodies.push(text(res.unwrap()).await);
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "one response");
    assert_eq!(
        other.await.unwrap().status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        locker.stats().acquire_attempts,
        1,
        "the duplicates asked nothing"
    );
}

#[tokio::test]
async fn a_retryable_response_or_a_panic_is_not_stored() {
    let backend = MemoryBackend::new();
    let (inner, runs) = handler(StatusCode::SERVICE_UNAVAILABLE, None);
    let svc = IdempotencyLayer::new(locker(&backend)).layer(inner);
    for n in 1..=2 {
        let res = svc.clone().oneshot(post(Some("5xx"), "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()["x-run"], n.to_string(), "ran again");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let panics = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&panics);
    let panicking = service_fn(move |_req: Request<Body>| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            assert!(n > 0, "the first run panics");
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let svc = IdempotencyLayer::new(locker(&backend)).layer(panicking);
    let first = tokio::spawn(svc.clone().oneshot(post(Some("panic"), "a")));
    assert!(first.await.unwrap_err().is_panic());
    let res = svc.clone().oneshot(post(Some("panic"), "a")).await.unwrap();
    assert_eq!(text(res).await, "ok", "the retry ran");
    assert_eq!(panics.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn another_instance_waits_for_the_first_then_replays_or_gets_409() {
    let backend = MemoryBackend::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (inner, runs) = handler(StatusCode::OK, Some(Arc::clone(&gate)));
    let first = IdempotencyLayer::new(locker(&backend)).layer(inner);
    let mut first = Box::pin(first.oneshot(post(Some("x"), "a")));
    assert!(futures::poll!(first.as_mut()).is_pending());
    let (other, _) = handler(StatusCode::OK, None);
    let impatient = IdempotencyLayer::new(locker(&backend))
        .wait(Duration::from_millis(200))
        .retry_after(Duration::from_millis(1500))
        .layer(other.clone());
    let res = impatient.oneshot(post(Some("x"), "a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.headers()["retry-after"], "2");
    let patient = IdempotencyLayer::new(locker(&backend)).layer(other);
    let waiting = tokio::spawn(patient.oneshot(post(Some("x"), "a")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.add_permits(1);
    let first = text(first.await.unwrap()).await;
    let res = waiting.await.unwrap().unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(text(res).await, first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stored_response_is_replayed_for_the_retention_only() {
    let backend = MemoryBackend::new();
    let (inner, runs) = handler(StatusCode::OK, None);
    let svc = IdempotencyLayer::new(locker(&backend))
        .retention(Duration::from_secs(60))
        .layer(inner);
    svc.clone().oneshot(post(Some("r"), "a")).await.unwrap();
    tokio::time::advance(Duration::from_secs(59)).await;
    let res = svc.clone().oneshot(post(Some("r"), "a")).await.unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    tokio::time::advance(Duration::from_secs(1)).await;
    let res = svc.clone().oneshot(post(Some("r"), "b")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "a new request once forgotten");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The test kit stands in for a stall: the first executor's lease is lost while
/// its handler runs, a request in another instance runs and stores, and the
/// first one's late store is refused: it answers with the newer response.
#[cfg(feature = "testing")]
#[tokio::test(start_paused = true)]
async fn a_stalled_executors_late_response_is_refused_by_the_fence() {
    use crate::testing::SimServer;

    let server = SimServer::new();
    // A stalled process does not see its loss: its handler runs on.
    let on_kit = || {
        Locker::builder(server.backend())
            .on_loss(crate::LossPolicy::Signal)
            .build()
            .unwrap()
    };
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (stalled, stalled_runs) = handler(StatusCode::OK, Some(Arc::clone(&gate)));
    let first = IdempotencyLayer::new(on_kit()).layer(stalled);
    let mut first = Box::pin(first.oneshot(post(Some("k"), "a")));
    assert!(futures::poll!(first.as_mut()).is_pending());
    for _ in 0..100 {
        if stalled_runs.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::task::yield_now().await;
        assert!(futures::poll!(first.as_mut()).is_pending());
    }
    assert_eq!(stalled_runs.load(Ordering::SeqCst), 1, "the first one runs");
    assert!(server.lose_lease("idempotency:POST /payments k").unwrap());
    let (newer, newer_runs) = handler(StatusCode::CREATED, None);
    let newer = IdempotencyLayer::new(on_kit()).layer(newer);
    let stored = newer.oneshot(post(Some("k"), "a")).await.unwrap();
    assert_eq!(stored.status(), StatusCode::CREATED);
    let stored = text(stored).await;
    gate.add_permits(1);
    let late = first.await.unwrap();
    assert_eq!(
        late.status(),
        StatusCode::CREATED,
        "the newer executor's outcome"
    );
    assert_eq!(late.headers()["idempotent-replayed"], "true");
    assert_eq!(text(late).await, stored);
    assert_eq!(newer_runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        server.requests().record,
        7,
        "2 reads, 2 fences, 2 stores, 1 read"
    );
}

/// Under the default `LossPolicy::Abort`, a handler whose lease is lost is
/// dropped, as behind the lock layer: `LeaseLost`, nothing stored, and the
/// retry runs.
#[cfg(feature = "testing")]
#[tokio::test(start_paused = true)]
async fn a_lost_lease_aborts_the_handler_under_the_abort_policy() {
    use crate::testing::SimServer;

    let server = SimServer::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (inner, runs) = handler(StatusCode::OK, Some(Arc::clone(&gate)));
    let svc =
        IdempotencyLayer::new(Locker::builder(server.backend()).build().unwrap()).layer(inner);
    let mut first = Box::pin(svc.clone().oneshot(post(Some("k"), "a")));
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(futures::poll!(first.as_mut()).is_pending());
        tokio::task::yield_now().await;
    }
    assert!(server.lose_lease("idempotency:POST /payments k").unwrap());
    let err = first.await.unwrap_err();
    assert!(
        matches!(err.downcast_ref(), Some(crate::Error::LeaseLost { .. })),
        "{err}"
    );
    gate.add_permits(1);
    let retry = svc.oneshot(post(Some("k"), "a")).await.unwrap();
    assert!(
        retry.headers().get("idempotent-replayed").is_none(),
        "ran again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn settings_choose_the_key_its_scope_the_stored_headers_and_the_policy() {
    let backend = MemoryBackend::new();
    let (inner, runs) = handler(StatusCode::CONFLICT, None);
    let layer = |tenant: &str| {
        IdempotencyLayer::new(locker(&backend))
            .key_from(crate::layer::KeyFrom::header(
                http::HeaderName::from_static("x-request-id"),
            ))
            .key_prefix(format!("{tenant}:"))
            .store_headers([http::HeaderName::from_static("x-run")])
            .retryable(|status| status == StatusCode::CONFLICT)
    };
    let req = || {
        Request::post("/payments")
            .header("x-request-id", "r1")
            .body(Full::new(Bytes::from_static(b"a")))
            .unwrap()
    };
    let a = layer("a").layer(inner.clone());
    for n in 1..=2 {
        let res = a.clone().oneshot(req()).await.unwrap();
        assert_eq!(
            res.headers()["x-run"],
            n.to_string(),
            "409 is retryable here"
        );
    }
    let stored = IdempotencyLayer::new(locker(&backend))
        .key_from(crate::layer::KeyFrom::header(
            http::HeaderName::from_static("x-request-id"),
        ))
        .key_prefix("a:")
        .store_headers([http::HeaderName::from_static("x-run")])
        .layer(inner.clone());
    stored.clone().oneshot(req()).await.unwrap();
    let replay = stored.clone().oneshot(req()).await.unwrap();
    assert_eq!(replay.headers()["x-run"], "3", "the stored header");
    assert!(replay.headers().get("content-type").is_none(), "not stored");
    // Another tenant's prefix is another key.
    let b = layer("b").layer(inner);
    let res = b.oneshot(req()).await.unwrap();
    assert!(res.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}
