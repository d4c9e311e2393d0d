//! `IdempotencyLayer` across two instances (two lockers, each on its own
//! backend, on one Redis under one prefix) through real HTTP.
//!
//! * 1,000 concurrent requests over 50 keys, spread at random over both
//!   instances with random duplicates: the handler runs once per key, every
//!   response for a key is byte for byte the same (each run answers a body of
//!   its own), and the duplicates inside an instance send nothing to Redis: each
//!   instance makes at most one leader's requests per key. The handler holds
//!   every run until each request has joined its instance's flight (its body read
//!   to the end, which the layer does right before it joins, in the same poll on
//!   this single-threaded runtime), so no request comes late.
//! * A reused key with another body is `422`; a duplicate on the other
//!   instance while the first is held is `409` with `Retry-After` once its
//!   (short) wait has passed, and once the first is released, a duplicate gets
//!   the stored response.
//!
//! Waits are bounded only to fail instead of hanging.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lockflight::layer::IdempotencyLayer;
use lockflight::{Locker, RedisBackend};
use testkit::{Counting, Counts, shared_scene, within};
use tokio::sync::{Notify, watch};
use tower::util::MapRequestLayer;

use super::support::{Body, Reply, Served, serve};

/// A limit that only a hang reaches.
const TOLD: Duration = Duration::from_secs(60);
const REQUESTS: usize = 1000;
const KEYS: usize = 50;

/// Opens once `total` request bodies have been read to their end.
struct Gate {
    ended: AtomicUsize,
    total: usize,
    open: watch::Sender<bool>,
}

impl Gate {
    fn new(total: usize) -> Arc<Gate> {
        Arc::new(Gate {
            ended: AtomicUsize::new(0),
            total,
            open: watch::Sender::new(false),
        })
    }

    fn ended(&self) {
        if self.ended.fetch_add(1, Ordering::SeqCst) + 1 == self.total {
            self.open.send_replace(true);
        }
    }

    async fn opened(&self) {
        let mut open = self.open.subscribe();
        open.wait_for(|open| *open).await.expect("the gate lives");
    }
}

/// A request body that tells its gate when it has been read to its end.
struct Told {
    inner: axum::body::Body,
    gate: Option<Arc<Gate>>,
}

impl http_body::Body for Told {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if frame.is_none()
            && let Some(gate) = self.gate.take()
        {
            gate.ended();
        }
        Poll::Ready(frame)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What the handlers of both instances share.
struct Handlers {
    gate: Arc<Gate>,
    /// Runs of `/pay`, per key.
    runs: Vec<AtomicUsize>,
    /// Runs of both instances' handlers, for a body that differs per run.
    all_runs: AtomicU64,
    /// `/hold` has its request.
    entered: Notify,
    /// `/hold` may answer.
    release: Notify,
}

/// One instance: a locker on its own counted backend, serving `/pay` (waits
/// long for a duplicate on the other instance) and `/hold` (waits 200 ms).
async fn instance(url: &str, prefix: &str, handlers: &Arc<Handlers>) -> (Served, Arc<Counts>) {
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect the backend");
    let (backend, counts) = Counting::new(backend);
    let locker = Locker::builder(backend).build().unwrap();
    let h = Arc::clone(handlers);
    let pay = move |headers: HeaderMap, body: String| {
        let h = Arc::clone(&h);
        async move {
            let key: usize = headers["idempotency-key"]
                .to_str()
                .unwrap()
                .trim_start_matches("key-")
                .parse()
                .unwrap();
            h.runs[key].fetch_add(1, Ordering::SeqCst);
            let n = h.all_runs.fetch_add(1, Ordering::SeqCst);
            h.gate.opened().await;
            format!("run {n} for key {key}: {body}")
        }
    };
    let h = Arc::clone(handlers);
    let hold = move |body: String| {
        let h = Arc::clone(&h);
        async move {
            let n = h.all_runs.fetch_add(1, Ordering::SeqCst);
            h.entered.notify_one();
            h.release.notified().await;
            format!("held run {n}: {body}")
        }
    };
    let gate = Arc::clone(&handlers.gate);
    let tell = MapRequestLayer::new(move |req: Request<axum::body::Body>| {
        let gate = Some(Arc::clone(&gate));
        req.map(|inner| axum::body::Body::new(Told { inner, gate }))
    });
    let layer = |wait| {
        IdempotencyLayer::new(locker.clone())
            .required()
            .wait(wait)
            .handle_errors()
    };
    let app = Router::new()
        .route("/pay", post(pay))
        .route_layer(layer(TOLD))
        .merge(
            Router::new()
                .route("/hold", post(hold))
                .route_layer(layer(Duration::from_millis(200))),
        )
        .layer(tell);
    (serve(app).await, counts)
}

/// POSTs `body` to `url` with idempotency key `key`, through a client of its
/// own (bounded by [`TOLD`] only).
pub(crate) async fn post_keyed(url: &str, key: &str, body: &str) -> Reply {
    static CLIENT: OnceLock<Client<HttpConnector, Body>> = OnceLock::new();
    let client = CLIENT.get_or_init(|| Client::builder(TokioExecutor::new()).build_http());
    let req = Request::post(url)
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body.to_owned())).boxed())
        .unwrap();
    let call = async {
        let res = client.request(req).await.expect("the HTTP request");
        let (parts, body) = res.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.expect("the response body").to_bytes(),
        }
    };
    within(TOLD, "an HTTP request", call).await
}

async fn send(served: &Served, path: &str, key: &str, body: &str) -> Reply {
    post_keyed(&served.url(path), key, body).await
}

/// A small deterministic generator (SplitMix64), seeded per run.
struct Mix(u64);

impl Mix {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

#[tokio::test]
async fn two_instances_run_a_thousand_requests_once_per_key() {
    let (server, _log, prefix) = shared_scene("idem-fleet");
    let handlers = Arc::new(Handlers {
        gate: Gate::new(REQUESTS),
        runs: (0..KEYS).map(|_| AtomicUsize::new(0)).collect(),
        all_runs: AtomicU64::new(0),
        entered: Notify::new(),
        release: Notify::new(),
    });
    let url = server.url();
    let instances = [
        instance(&url, &prefix, &handlers).await,
        instance(&url, &prefix, &handlers).await,
    ];
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("seed {seed}");
    let mut mix = Mix(seed);
    // Every key at least once, then duplicates at random; each on a random instance.
    let plan: Vec<(usize, usize)> = (0..REQUESTS)
        .map(|i| {
            let key = if i < KEYS { i } else { mix.below(KEYS) };
            (key, mix.below(2))
        })
        .collect();
    let instances = Arc::new(instances);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, &(key, at)) in plan.iter().enumerate() {
        let instances = Arc::clone(&instances);
        tasks.spawn(async move {
            let key = format!("key-{key}");
            let reply = send(
                &instances[at].0,
                "/pay",
                &key,
                &format!("{{\"pay\":\"{key}\"}}"),
            )
            .await;
            (i, reply)
        });
    }
    let mut replies: Vec<Option<Reply>> = (0..REQUESTS).map(|_| None).collect();
    while let Some(done) = tasks.join_next().await {
        let (i, reply) = done.expect("a request task");
        replies[i] = Some(reply);
    }
    for (key, runs) in handlers.runs.iter().enumerate() {
        assert_eq!(runs.load(Ordering::SeqCst), 1, "key-{key} ran once");
    }
    let mut first: Vec<Option<&Bytes>> = vec![None; KEYS];
    for (reply, &(key, _)) in replies.iter().zip(&plan) {
        let reply = reply.as_ref().unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let body = first[key].get_or_insert(&reply.body);
        assert_eq!(*body, &reply.body, "key-{key}: byte for byte");
    }
    // One leader per key per instance: it reads the record, and if it takes the
    // lease, fences it and (if it ran) stores the response: at most 3 record
    // requests, and 2 on the instance that found the response stored; it
    // releases once; its acquire asks again only when woken or at the busy
    // reply's retry time: a few times, never once per duplicate (each instance
    // gets about 500 requests). In-process duplicates add nothing.
    let seen = |at: usize| {
        let mut keys: Vec<usize> = plan.iter().filter(|p| p.1 == at).map(|p| p.0).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len() as u64
    };
    let both = (0..KEYS)
        .filter(|&k| (0..2).all(|at| plan.contains(&(k, at))))
        .count() as u64;
    let mut records = 0;
    for (at, (_, counts)) in instances.iter().enumerate() {
        let record = counts.record.load(Ordering::SeqCst);
        let [acquire, release, _, leave] = counts.snapshot();
        println!(
            "instance {at}: {} keys, {record} record, {acquire} acquire, {release} release, {leave} leave",
            seen(at)
        );
        assert!(
            record <= 3 * seen(at),
            "instance {at}: {record} record requests"
        );
        assert!(acquire <= 6 * seen(at), "instance {at}: {acquire} acquires");
        assert!(release <= seen(at), "instance {at}: {release} releases");
        records += record;
    }
    assert!(
        records <= 3 * KEYS as u64 + 2 * both,
        "{records} record requests for {KEYS} keys, {both} on both instances"
    );

    // A reused key with another body.
    let reused = send(&instances[1].0, "/pay", "key-0", "{\"pay\":\"other\"}").await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reused.text()
    );
    assert_eq!(reused.problem_code(), "idempotency_key_reused");

    // A duplicate on the other instance while the first is held: 409 once its
    // 200 ms wait has passed (the first is held until released, whatever the
    // machine's speed), then the stored response once it is released.
    let held = {
        let instances = Arc::clone(&instances);
        tokio::spawn(async move { send(&instances[0].0, "/hold", "held", "{}").await })
    };
    within(TOLD, "the held handler starts", handlers.entered.notified()).await;
    let busy = send(&instances[1].0, "/hold", "held", "{}").await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{}", busy.text());
    assert_eq!(busy.problem_code(), "idempotency_request_in_progress");
    assert!(
        busy.headers.contains_key(http::header::RETRY_AFTER),
        "{busy:?}"
    );
    handlers.release.notify_one();
    let first = within(TOLD, "the held request", held).await.unwrap();
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let after = send(&instances[1].0, "/hold", "held", "{}").await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.text());
    assert_eq!(after.headers["idempotent-replayed"], "true");
    assert_eq!(after.body, first.body, "the stored response, byte for byte");
}
