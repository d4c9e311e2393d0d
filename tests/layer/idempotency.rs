//! `IdempotencyLayer` against a real `redis-server`: replay byte for byte, the
//! refusals, in-process duplicates coalesced (counted), the failure policy, and
//! the record's fence refusing a stale executor's store.

use lockflight::backend::{LockBackend, RecordState};
use lockflight::layer::idempotency::future::ResponseFuture;
use lockflight::layer::{IdempotencyLayer, IdempotencyService};
use testkit::Counting;

use super::*;

type Body = Full<Bytes>;

/// A locker on the shared server under its own prefix, its backend counted.
async fn counted_locker(name: &str) -> (Locker, Arc<testkit::Counts>) {
    let prefix = testkit::unique_prefix(name);
    let backend = testkit::backend_at(&testkit::shared().url(), &prefix).await;
    let (backend, counts) = Counting::new(backend);
    let locker = Locker::builder(backend)
        .wait_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    (locker, counts)
}

fn post(key: &str, body: &'static str) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

/// The handler's gate: it adds a permit to `entered` when it starts, then
/// waits for a permit of `open`.
#[derive(Clone)]
struct Gate {
    entered: Arc<tokio::sync::Semaphore>,
    open: Arc<tokio::sync::Semaphore>,
}

/// Answers `status` with its run number and the request's body; passes `gate`
/// first when given.
fn handler(
    status: StatusCode,
    runs: Arc<AtomicUsize>,
    gate: Option<Gate>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future = impl Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |req: Request<Body>| {
        let (runs, gate) = (Arc::clone(&runs), gate.clone());
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(gate) = gate {
                gate.entered.add_permits(1);
                let _open = gate.open.acquire().await.unwrap();
            }
            let body = req.into_body().collect().await.unwrap().to_bytes();
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(format!(
                        r#"{{"run":{n},"body":{body:?}}}"#
                    ))))
                    .unwrap(),
            )
        }
    })
}

async fn bytes_of<B: http_body::Body>(res: Response<B>) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    res.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn idempotency_on_redis_replays_refuses_and_stores_only_final_answers() {
    let _log = testkit::shared().log_on_panic();
    let (locker, counts) = counted_locker("idem_replay").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::new(locker.clone())
        .required()
        .max_body(16)
        .layer(handler(StatusCode::CREATED, Arc::clone(&runs), None));
    let first = svc.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = bytes_of(first).await;
    let before = counts.record.load(Ordering::Relaxed);
    let again = svc.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(
        counts.record.load(Ordering::Relaxed) - before,
        1,
        "a replay is one round trip"
    );
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["content-type"], "application/json");
    assert_eq!(bytes_of(again).await, first, "byte for byte");

    let refusals = [
        (post("k", "b"), StatusCode::UNPROCESSABLE_ENTITY),
        (
            post("big", "0123456789abcdefg"),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (post(&"x".repeat(256), "a"), StatusCode::BAD_REQUEST),
        (
            Request::post("/orders").body(Full::default()).unwrap(),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (req, status) in refusals {
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), status);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A 5xx is not stored: the retry runs again.
    let failing = Arc::new(AtomicUsize::new(0));
    let svc5 = IdempotencyLayer::new(locker.clone()).layer(handler(
        StatusCode::BAD_GATEWAY,
        Arc::clone(&failing),
        None,
    ));
    for _ in 0..2 {
        let res = svc5.clone().oneshot(post("5xx", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
        assert!(res.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(failing.load(Ordering::SeqCst), 2);

    // A panic is not stored either, and its lease is released.
    let panics = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&panics);
    let panicking = service_fn(move |_req: Request<Body>| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            assert!(n > 0, "the first run panics");
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let svcp = IdempotencyLayer::new(locker.clone()).layer(panicking);
    let first = tokio::spawn(svcp.clone().oneshot(post("panic", "a")));
    assert!(first.await.unwrap_err().is_panic());
    let res = svcp.clone().oneshot(post("panic", "a")).await.unwrap();
    assert_eq!(bytes_of(res).await, "ok", "the retry ran");
    assert!(no_active_keys(&locker).await, "a slot remained");
}

#[tokio::test]
async fn idempotency_on_redis_coalesces_duplicates_in_flight() {
    let _log = testkit::shared().log_on_panic();
    let (locker, counts) = counted_locker("idem_dups").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Gate {
        entered: Arc::new(tokio::sync::Semaphore::new(0)),
        open: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let svc = IdempotencyLayer::new(locker.clone()).layer(handler(
        StatusCode::OK,
        Arc::clone(&runs),
        Some(gate.clone()),
    ));
    let mut calls: Vec<_> = (0..50)
        .map(|_| Box::pin(svc.clone().oneshot(post("dup", "same"))))
        .collect();
    // The first leads: drive it until its handler runs (it then waits at the
    // gate); the others then join its flight.
    let mut first = calls.remove(0);
    tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            _ = first.as_mut() => panic!("the first request ended before its handler ran"),
            entered = gate.entered.acquire() => drop(entered),
        }
    })
    .await
    .expect("the first request reaches its handler");
    for call in &mut calls {
        assert!(futures::poll!(call.as_mut()).is_pending());
    }
    gate.open.add_permits(1);
    let first = bytes_of(first.await.unwrap()).await;
    for res in futures::future::join_all(calls).await {
        let res = res.unwrap();
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        assert_eq!(bytes_of(res).await, first);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        locker.stats().acquire_attempts,
        1,
        "one lease for the flight"
    );
    assert_eq!(counts.acquire.load(Ordering::Relaxed), 1);
    assert_eq!(
        counts.record.load(Ordering::Relaxed),
        3,
        "the leader's read, fence and store; nothing from the duplicates"
    );
}

#[tokio::test]
async fn idempotency_on_redis_the_fence_refuses_a_stale_executors_store() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("idem_fence");
    let backend = testkit::backend_at(&testkit::shared().url(), &prefix).await;
    let locker = Locker::builder(backend.clone()).build().unwrap();
    let key = LockKey::from("idempotency:POST /orders k");
    let day = Duration::from_secs(86_400);
    // The first executor takes the lease and fences the record, then stalls
    // past its lease: its lease ends (here: released) and a newer one runs.
    let stalled = locker.lock(key.clone()).await.unwrap();
    let old = stalled.fencing_token();
    let state = backend.fence_record(&key, (old.epoch, old.seq), day).await;
    assert_eq!(state.unwrap(), RecordState::Fenced);
    stalled.release().await.unwrap();
    let newer = locker.lock(key.clone()).await.unwrap();
    let new = newer.fencing_token();
    assert!(new > old);
    let state = backend.fence_record(&key, (new.epoch, new.seq), day).await;
    assert_eq!(state.unwrap(), RecordState::Fenced);
    // The stalled one is stale from the newer fence on, before and after the
    // newer store.
    let stale = backend.store_record(&key, (old.epoch, old.seq), b"old", day);
    assert!(!stale.await.unwrap());
    let state = backend.fence_record(&key, (old.epoch, old.seq), day).await;
    assert_eq!(state.unwrap(), RecordState::Stale);
    assert!(
        backend
            .store_record(&key, (new.epoch, new.seq), b"new", day)
            .await
            .unwrap()
    );
    let stale = backend.store_record(&key, (old.epoch, old.seq), b"old", day);
    assert!(!stale.await.unwrap());
    newer.release().await.unwrap();
    assert_eq!(
        backend.read_record(&key).await.unwrap().as_deref(),
        Some(&b"new"[..])
    );
    let state = backend.fence_record(&key, (new.epoch + 1, 0), day).await;
    assert_eq!(state.unwrap(), RecordState::Stored(b"new".to_vec()));
    // The record lives in the lock's hash tag, with the retention as its TTL.
    let record = [&testkit::names::lock(&prefix, &key)[..], b":idem"].concat();
    let mut con = testkit::shared().connection().await;
    let ttl: i64 = testkit::query(&mut con, redis::cmd("PTTL").arg(&record)).await;
    assert!(ttl > 86_000_000 && ttl <= 86_400_000, "{ttl}");
}

/// An inner service whose type can be named, with a field to reach through the
/// accessors.
#[derive(Clone)]
struct Named {
    answer: &'static str,
}

impl Service<Request<Body>> for Named {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from(self.answer)))))
    }
}

#[tokio::test]
async fn the_idempotency_service_s_future_is_named_send_and_debug() {
    fn send<T: Send>(_: &T) {}
    let locker = memory_locker();
    let mut svc: IdempotencyService<Named, KeyFrom> = IdempotencyLayer::new(locker.clone())
        .required()
        .layer(Named { answer: "a" });
    let keyed: ResponseFuture<Named, Body, Body> = svc.call(post("named", "x"));
    send(&keyed);
    assert!(format!("{keyed:?}").contains("keyed"), "{keyed:?}");
    assert_eq!(bytes_of(keyed.await.unwrap()).await, "a");
    let refused = svc.call(Request::new(Body::default()));
    assert!(format!("{refused:?}").contains("refused"), "{refused:?}");
    assert_eq!(refused.await.unwrap().status(), StatusCode::BAD_REQUEST);
    assert_eq!(svc.get_ref().answer, "a");
    svc.get_mut().answer = "b";
    let mut alone = IdempotencyLayer::new(locker.clone()).layer(svc.into_inner());
    let passing = alone.call(Request::new(Body::default()));
    assert!(format!("{passing:?}").contains("alone"), "{passing:?}");
    assert_eq!(bytes_of(passing.await.unwrap()).await, "b");
    assert!(no_active_keys(&locker).await, "a slot remained");
}
