//! The tower layers with mock inner services: readiness, guard lifetime, key
//! policies, error mapping, lease loss, and response sharing.

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use lockflight::layer::{LockLayer, MissingKey, SharedResponseLayer};
use lockflight::{
    Error, LockKey, Locker, MemoryBackend, RedisBackend, guard::LockInfo, layer::HeaderKey,
    layer::PathSegment,
};
use support::{is_free, wait_until};
use tower::{Layer, Service, ServiceExt, service_fn};

fn memory_locker() -> Locker {
    Locker::builder(MemoryBackend::new())
        .wait_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

fn sku_header() -> HeaderKey {
    HeaderKey::new(http::HeaderName::from_static("x-sku"))
}

fn request(sku: Option<&str>) -> Request<()> {
    let mut b = Request::builder().uri("/items");
    if let Some(sku) = sku {
        b = b.header("x-sku", sku);
    }
    b.body(()).unwrap()
}

/// Waits (up to 2 s) until `key` is free: a finished request releases in the
/// background.
async fn becomes_free(locker: &Locker, key: &str) -> bool {
    wait_until(Duration::from_secs(2), || async {
        is_free(locker, key).await
    })
    .await
}

/// Waits (up to 2 s) until the locker keeps no per-key state: slots go when the
/// background release that follows a request is done.
async fn no_active_keys(locker: &Locker) -> bool {
    wait_until(Duration::from_secs(2), || async {
        locker.active_keys() == 0
    })
    .await
}

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

/// An inner service that becomes ready only after `pending` polls, and refuses
/// calls on an instance that was not polled ready.
#[derive(Clone)]
struct Picky {
    pending: usize,
    ready: bool,
    polls: Arc<AtomicUsize>,
}

impl Service<Request<()>> for Picky {
    type Response = &'static str;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<&'static str, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        if self.pending > 0 {
            self.pending -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        assert!(self.ready, "called an instance that was not polled ready");
        self.ready = false;
        Box::pin(async { Ok("ok") })
    }
}

#[tokio::test]
async fn readiness_is_immediate_and_the_inner_clone_is_driven_ready_under_the_lock() {
    let locker = memory_locker();
    let polls = Arc::new(AtomicUsize::new(0));
    let inner = Picky {
        pending: 2,
        ready: false,
        polls: polls.clone(),
    };
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

/// An inner service whose readiness fails.
#[derive(Clone)]
struct Broken;

impl Service<Request<()>> for Broken {
    type Response = ();
    type Error = &'static str;
    type Future = std::future::Ready<Result<(), &'static str>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        Poll::Ready(Err("inner not ready"))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        unreachable!("never ready")
    }
}

#[tokio::test]
async fn an_inner_readiness_error_fails_the_call_and_releases_the_lock() {
    let locker = memory_locker();
    let svc = LockLayer::new(locker.clone(), sku_header()).layer(Broken);
    let err = svc.clone().oneshot(request(Some("k"))).await.unwrap_err();
    assert_eq!(err.to_string(), "inner not ready");
    assert!(becomes_free(&locker, "k").await, "lock still held");
    let err = svc.oneshot(request(None)).await.unwrap_err();
    assert_eq!(err.to_string(), "inner not ready");
}

/// `tower::limit::ConcurrencyLimit` with one permit (the crate is built without
/// tower's `limit` feature): `poll_ready` takes the permit, the call's future keeps
/// it, clones start without one.
struct OnePermit<S> {
    inner: S,
    semaphore: tokio_util::sync::PollSemaphore,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<S> OnePermit<S> {
    fn new(inner: S) -> Self {
        OnePermit {
            inner,
            semaphore: tokio_util::sync::PollSemaphore::new(Arc::new(tokio::sync::Semaphore::new(
                1,
            ))),
            permit: None,
        }
    }
}

impl<S: Clone> Clone for OnePermit<S> {
    fn clone(&self) -> Self {
        OnePermit {
            inner: self.inner.clone(),
            semaphore: self.semaphore.clone(),
            permit: None,
        }
    }
}

impl<S, Req> Service<Req> for OnePermit<S>
where
    S: Service<Req>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if self.permit.is_none() {
            match self.semaphore.poll_acquire(cx) {
                Poll::Ready(permit) => self.permit = permit,
                Poll::Pending => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let permit = self.permit.take().expect("called before poll_ready");
        let fut = self.inner.call(req);
        Box::pin(async move {
            let out = fut.await;
            drop(permit);
            out
        })
    }
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

/// If the lock cannot be taken, the inner service is never polled nor called.
#[tokio::test]
async fn a_failed_lock_never_touches_the_inner_service() {
    let locker = memory_locker();
    let polls = Arc::new(AtomicUsize::new(0));
    let inner = Picky {
        pending: 0,
        ready: false,
        polls: polls.clone(),
    };
    let held = locker.lock("busy").await.unwrap();
    let err = LockLayer::new(locker.clone(), sku_header())
        .layer(inner)
        .oneshot(request(Some("busy")))
        .await
        .unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::Timeout { .. })),
        "{err}"
    );
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
    let pass = LockLayer::new(locker.clone(), sku_header()).layer(inner.clone());
    assert!(
        !pass.oneshot(request(None)).await.unwrap(),
        "no lock info without a key"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    let reject = LockLayer::new(locker.clone(), sku_header())
        .missing_key(MissingKey::Reject)
        .layer(inner);
    let err = reject.oneshot(request(None)).await.unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::InvalidKey { .. })),
        "{err}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the handler ran for a rejected request"
    );
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
async fn axum_maps_a_timeout_to_503_with_retry_after_and_a_bare_code() {
    use axum::error_handling::HandleErrorLayer;
    use lockflight::layer::handle_error;

    let locker = memory_locker();
    let held = locker.lock("busy").await.unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(HandleErrorLayer::new(handle_error))
        .layer(LockLayer::new(locker.clone(), sku_header()))
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(axum::response::Response::new(axum::body::Body::empty()))
        }));
    let res = svc.oneshot(request(Some("busy"))).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[http::header::RETRY_AFTER], "1");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "lock_timeout", "the body is the code alone");
    held.release().await.unwrap();
}

/// Sets a flag when dropped: proves the handler's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_loss_drops_the_handler_and_fails_with_lease_lost() {
    let server = support::shared();
    let prefix = support::unique_prefix("layer-loss");
    let backend = RedisBackend::builder(server.url())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let lock_name = backend.lock_name(&LockKey::from("k"));
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_millis(300))
        .build()
        .unwrap();
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
    let mut con = server.connection().await;
    let deleted: u64 = redis::cmd("DEL")
        .arg(&lock_name)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let err = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the loss was not noticed")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::LeaseLost { .. })),
        "{err}"
    );
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
    use axum::error_handling::HandleErrorLayer;
    use lockflight::layer::{PathParam, handle_error};

    let server = support::shared();
    let backend = RedisBackend::builder(server.url())
        .prefix(support::unique_prefix("layer-signal"))
        .connect()
        .await
        .unwrap();
    let lock_name = backend.lock_name(&LockKey::from("k"));
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_millis(300))
        .on_loss(policy)
        .build()
        .unwrap();
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
        .route_layer(
            tower::ServiceBuilder::new()
                .layer(HandleErrorLayer::new(handle_error))
                .layer(LockLayer::new(locker, PathParam::new("sku"))),
        );
    (app, lock_name, started, dropped, finished)
}

/// Deletes the lock behind its holder's back once the handler runs, and returns the
/// response with its body.
#[cfg(feature = "axum")]
async fn steal_while_handling(
    app: axum::Router,
    lock_name: &[u8],
    started: &tokio::sync::Notify,
) -> (StatusCode, Bytes) {
    let req = Request::post("/items/k")
        .body(axum::body::Body::empty())
        .unwrap();
    let call = tokio::spawn(app.oneshot(req));
    started.notified().await;
    let mut con = support::shared().connection().await;
    let deleted: u64 = redis::cmd("DEL")
        .arg(lock_name)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the lock was not held while the handler ran");
    let res = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("no response")
        .unwrap()
        .unwrap();
    let status = res.status();
    (status, res.into_body().collect().await.unwrap().to_bytes())
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_signal_the_handler_sees_the_loss_and_its_response_completes() {
    let (app, lock_name, started, _dropped, finished) =
        loss_app(lockflight::LossPolicy::Signal).await;
    let (status, body) = steal_while_handling(app, &lock_name, &started).await;
    assert!(finished.load(Ordering::SeqCst), "the handler was aborted");
    assert_eq!(status, StatusCode::CONFLICT, "{body:?}");
    assert_eq!(body, "not written: lease lost");
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_abort_the_handler_is_dropped_and_the_client_gets_lease_lost() {
    let (app, lock_name, started, dropped, finished) =
        loss_app(lockflight::LossPolicy::Abort).await;
    let (status, body) = steal_while_handling(app, &lock_name, &started).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "lease_lost");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler future was not dropped"
    );
    assert!(
        !finished.load(Ordering::SeqCst),
        "the handler ran to its end"
    );
}

fn get(sku: &str) -> Request<()> {
    Request::builder()
        .uri(format!("/items/{sku}"))
        .body(())
        .unwrap()
}

#[tokio::test]
async fn coalesce_layer_gives_identical_gets_one_execution() {
    let locker = memory_locker();
    let runs = Arc::new(AtomicUsize::new(0));
    // The handler finishes only when the test opens the gate, after every request
    // has joined the flight: sharing does not depend on timing.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let inner = {
        let (runs, gate) = (runs.clone(), gate.clone());
        service_fn(move |req: Request<()>| {
            let (runs, gate) = (runs.clone(), gate.clone());
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let _open = gate.acquire().await.unwrap();
                let body = format!("{} run {n}", req.uri().path());
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(StatusCode::OK)
                        .header("x-run", n.to_string())
                        .body(Full::new(Bytes::from(body)))
                        .unwrap(),
                )
            }
        })
    };
    let svc = SharedResponseLayer::new(locker.clone(), PathSegment::new(1)).layer(inner);
    let mut calls: Vec<_> = (0..100)
        .map(|_| Box::pin(svc.clone().oneshot(get("555"))))
        .collect();
    // One poll each: the first leads (and waits at the gate), the others join.
    for call in &mut calls {
        assert!(futures::poll!(call.as_mut()).is_pending());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    gate.add_permits(1);
    for res in futures::future::join_all(calls).await {
        let res = res.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-run"], "1");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "/items/555 run 1");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(no_active_keys(&locker).await, "a slot remained");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesce_layer_does_not_share_bodies_over_the_limit() {
    let locker = memory_locker();
    let runs = Arc::new(AtomicUsize::new(0));
    let inner = {
        let runs = runs.clone();
        service_fn(move |_req: Request<()>| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(vec![b'x'; 2048]))))
            }
        })
    };
    let svc = SharedResponseLayer::new(locker, PathSegment::new(1))
        .max_body(1024)
        .layer(inner);
    let mut calls = Vec::new();
    for _ in 0..5 {
        calls.push(tokio::spawn(svc.clone().oneshot(get("big"))));
    }
    for c in calls {
        let body = c
            .await
            .unwrap()
            .unwrap()
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body.len(), 2048);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        5,
        "large bodies must not be shared"
    );
}

/// As for [`LockLayer`]: a read waiting for a held key holds no inner readiness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_read_waiting_for_its_lock_holds_no_inner_readiness() {
    let locker = Locker::builder(MemoryBackend::new())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let inner = OnePermit::new(service_fn(|req: Request<()>| async move {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
            req.uri().path().to_owned(),
        ))))
    }));
    let svc = SharedResponseLayer::new(locker.clone(), PathSegment::new(1)).layer(inner);

    let held = locker.lock("a").await.unwrap();
    let waits = locker.stats().local_waits;
    let a = tokio::spawn(svc.clone().oneshot(get("a")));
    assert!(
        wait_until(Duration::from_secs(2), || async {
            locker.stats().local_waits > waits
        })
        .await,
        "read A never waited for key a"
    );
    let b = tokio::time::timeout(Duration::from_secs(2), svc.clone().oneshot(get("b")))
        .await
        .expect("read B was blocked by read A's wait for another key")
        .unwrap();
    assert_eq!(
        b.into_body().collect().await.unwrap().to_bytes(),
        "/items/b"
    );
    assert!(!a.is_finished(), "A ran while key a was held");
    held.release().await.unwrap();
    let a = a.await.unwrap().unwrap();
    assert_eq!(
        a.into_body().collect().await.unwrap().to_bytes(),
        "/items/a"
    );
}
