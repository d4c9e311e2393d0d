//! `IdempotencyLayer` with a first executor paused past its lease: the first
//! instance is a child process (this test binary, re-executed) whose lease TTL
//! is 1 s; it gets the request, says so, and is stopped (`SIGSTOP`) while its
//! handler waits. The retry, sent to a second instance (this process), waits
//! for the stopped lease to end, runs and stores its response. The child, once
//! continued and told to answer, finds its store refused by the record's fence
//! (its lease was lost: it runs on under `LossPolicy::Signal`) and answers the
//! retry's response; a third request gets that response replayed, byte for byte.
//!
//! Waits are bounded only to fail instead of hanging.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use http::StatusCode;
use lockflight::guard::LockInfo;
use lockflight::layer::IdempotencyLayer;
use lockflight::{Locker, LossPolicy, RedisBackend};
use testkit::nemesis::{continue_process, stop_process};
use testkit::{child_line, shared_scene, spawn_test_child, tell_parent, test_path, within};
use tokio::sync::Notify;

use super::idempotency_fleet::post_keyed;
use super::support::serve;

/// A limit that only a hang reaches.
const TOLD: Duration = Duration::from_secs(60);
const CHILD_ENV: &str = "LOCKFLIGHT_IDEMPOTENCY_CHILD";
const KEY: &str = "paused-1";
const BODY: &str = "{\"pay\":5}";

async fn backend(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect the backend")
}

/// The app of both instances: `POST /pay` behind the layer, its handler named
/// `who`; it calls `ran` with its lease, then waits for `go` before it answers.
fn app(
    locker: Locker,
    who: &'static str,
    ran: impl Fn(&LockInfo) + Clone + Send + Sync + 'static,
    go: Arc<Notify>,
) -> Router {
    let pay = move |Extension(lock): Extension<LockInfo>, body: String| {
        let (ran, go) = (ran.clone(), Arc::clone(&go));
        async move {
            ran(&lock);
            go.notified().await;
            format!("{who} ran under {}: {body}", lock.fencing_token)
        }
    };
    Router::new().route("/pay", post(pay)).route_layer(
        IdempotencyLayer::new(locker)
            .required()
            .wait(Duration::from_secs(30))
            .handle_errors(),
    )
}

/// Not a test: the first instance. Serves `/pay` with a 1 s lease (renewed as
/// the locker does, running on when it is lost) and `/go`, which lets the held
/// handler answer; prints `LFIDEM LISTENING <addr>`, and `LFIDEM RUNNING
/// <token>` when its handler has the request. Serves for 60 s at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the paused idempotency test"]
async fn idempotency_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let locker = Locker::builder(backend(&var("LF_URL"), &var("LF_PREFIX")).await)
        .lease_ttl(Duration::from_secs(1))
        .on_loss(LossPolicy::Signal)
        .build()
        .unwrap();
    let go = Arc::new(Notify::new());
    let ran = |lock: &LockInfo| tell_parent(&format!("LFIDEM RUNNING {}", lock.fencing_token));
    let release = Arc::clone(&go);
    let app = app(locker, "child", ran, Arc::clone(&go)).route(
        "/go",
        post(move || {
            release.notify_one();
            async { "going" }
        }),
    );
    let served = serve(app).await;
    tell_parent(&format!("LFIDEM LISTENING {}", served.addr));
    tokio::time::sleep(TOLD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_executor_paused_past_its_lease_cannot_overwrite_the_retry() {
    let (server, _log, prefix) = shared_scene("idem-paused");
    let (mut child, mut lines) = spawn_test_child(
        &test_path(module_path!(), "idempotency_child"),
        &[
            (CHILD_ENV, "1".to_owned()),
            ("LF_URL", server.url()),
            ("LF_PREFIX", prefix.clone()),
        ],
    );
    let pid = child.id().expect("the child runs");
    let at = child_line(&mut lines, "LFIDEM LISTENING ").await;
    let child_url = |path: &str| format!("http://{at}{path}");

    let first = tokio::spawn({
        let url = child_url("/pay");
        async move { post_keyed(&url, KEY, BODY).await }
    });
    let child_token = child_line(&mut lines, "LFIDEM RUNNING ").await;
    assert!(stop_process(pid), "the child stopped");

    // The second instance: its own backend, the same prefix and route.
    let locker = Locker::builder(backend(&server.url(), &prefix).await)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(Notify::new());
    go.notify_one();
    let counted = Arc::clone(&runs);
    let parent = serve(app(
        locker,
        "parent",
        move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        },
        go,
    ))
    .await;
    // It waits for the stopped child's lease to end (1 s after its last
    // renewal), then runs.
    let retry = post_keyed(&parent.url("/pay"), KEY, BODY).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.text());
    assert!(retry.text().starts_with("parent ran"), "{}", retry.text());
    assert!(!retry.headers.contains_key("idempotent-replayed"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    continue_process(pid);
    let going = post_keyed(&child_url("/go"), "go", "").await;
    assert_eq!(going.status, StatusCode::OK, "{}", going.text());
    let late = within(TOLD, "the child's answer", first).await.unwrap();
    assert_eq!(late.status, StatusCode::OK, "{}", late.text());
    assert_eq!(
        late.body,
        retry.body,
        "the child (lease {child_token}) answers the retry's stored response, its own store refused: {}",
        late.text()
    );
    assert_eq!(late.headers["idempotent-replayed"], "true");

    let third = post_keyed(&parent.url("/pay"), KEY, BODY).await;
    assert_eq!(third.status, StatusCode::OK, "{}", third.text());
    assert_eq!(third.headers["idempotent-replayed"], "true");
    assert_eq!(
        third.body, retry.body,
        "the retry's response, byte for byte"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the parent ran once");
    child.kill().await.expect("kill the child");
}
