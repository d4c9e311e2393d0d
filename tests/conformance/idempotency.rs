//! The idempotency column: `IdempotencyLayer`'s records on every topology
//! (Redlock, which keeps no records, refuses the first request with
//! `Error::Unsupported`).
//!
//! * `one_instance_runs_the_others_replay`: instance A runs a request with an
//!   idempotency key while B's duplicate waits for A's lease; A's release wakes
//!   B, which replays A's stored response byte for byte; C, later, replays it
//!   too, and C's request with another body under the key is `422`. The handler
//!   ran once. (The record's fence refusing a stale executor's store:
//!   `tests/layer/idempotency.rs` on one server, the memory backend's unit
//!   tests; the script is the same on every Redis topology, one key in the
//!   lock's hash tag.)

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use lockflight::Error;
use lockflight::layer::IdempotencyLayer;
use testkit::{wait_until, within};
use tower::{Layer, ServiceExt, service_fn};

use crate::{Topology, matrix};

/// A limit that only a hang reaches.
const TOLD: Duration = Duration::from_secs(30);

fn post(body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", "order-1")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn one_instance_runs_the_others_replay(topology: Topology) {
    let (lockers, _) = topology
        .instances("idempotency-replay", 3, Duration::from_secs(10))
        .await;
    let runs = Arc::new(AtomicUsize::new(0));
    let (entered, open) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let handler = {
        let (runs, entered, open) = (runs.clone(), entered.clone(), open.clone());
        service_fn(move |req: Request<Full<Bytes>>| {
            let (runs, entered, open) = (runs.clone(), entered.clone(), open.clone());
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                entered.add_permits(1);
                let _open = open.acquire().await.unwrap();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                    "run {n}: {body:?}"
                )))))
            }
        })
    };
    let svc = |i: usize| IdempotencyLayer::new(lockers[i].clone()).layer(handler.clone());
    if topology == Topology::Redlock {
        open.add_permits(1);
        let refused = svc(0).oneshot(post("a")).await.unwrap_err();
        assert!(
            matches!(refused.downcast_ref(), Some(Error::Unsupported { .. })),
            "{refused}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        return;
    }
    let a = tokio::spawn(svc(0).oneshot(post("a")));
    within(TOLD, "A's handler runs", entered.acquire())
        .await
        .unwrap()
        .forget();
    let b = tokio::spawn(svc(1).oneshot(post("a")));
    // B found no record and asked for A's lease: it waits for A's release.
    let asked = wait_until(TOLD, || async { lockers[1].stats().acquire_attempts >= 1 }).await;
    assert!(asked, "B asks for the lease");
    open.add_permits(1);
    let a = within(TOLD, "A answers", a).await.unwrap().unwrap();
    let first = a.into_body().collect().await.unwrap().to_bytes();
    let b = within(TOLD, "B replays", b).await.unwrap().unwrap();
    assert_eq!(b.headers()["idempotent-replayed"], "true");
    assert_eq!(b.into_body().collect().await.unwrap().to_bytes(), first);
    let c = svc(2).oneshot(post("a")).await.unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    assert_eq!(c.into_body().collect().await.unwrap().to_bytes(), first);
    let other = svc(2).oneshot(post("b")).await.unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}
matrix!(one_instance_runs_the_others_replay: every topology, no kind);
