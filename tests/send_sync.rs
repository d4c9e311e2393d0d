//! Pins `Send` (and `Sync` where it matters) on every public future and handle, so a
//! change that makes one `!Send` fails to compile here instead of in users' code.

use std::convert::Infallible;
use std::future::Future;

use lockflight::layer::{LockLayer, SharedResponseLayer};
use lockflight::{LockGuard, Locker, MemoryBackend, RedisBackend, layer::KeyFrom, stats::Stats};
use tower::{Layer, Service, service_fn};

fn send<T: Send>(_: &T) {}
fn send_sync<T: Send + Sync>() {}
fn send_future<F: Future + Send>(_: F) {}

#[test]
fn handles_are_send_and_sync() {
    send_sync::<Locker>();
    send_sync::<LockGuard>();
    send_sync::<MemoryBackend>();
    send_sync::<RedisBackend>();
    send_sync::<lockflight::Error>();
    send_sync::<Stats>();
    send_sync::<lockflight::election::Election>();
    send_sync::<lockflight::election::Leadership>();
}

#[tokio::test]
async fn every_public_future_is_send() {
    let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
    send_future(RedisBackend::connect("redis://127.0.0.1:1"));
    send_future(locker.lock("k"));
    send_future(locker.lock_with_options(
        "k",
        lockflight::LockOptions::new().wait_timeout(std::time::Duration::from_secs(1)),
    ));
    send_future(locker.try_lock("k"));
    send_future(locker.with_lock("k", |_info| async { 1 }));
    send_future(locker.singleflight("k", || async { 1 }));
    let election = locker.election("e").identity("me");
    send_future(election.campaign());
    send_future(election.leader());
    send_future(election.run(|_leader, _loss| async {}));
    let leadership = election.campaign().await.unwrap();
    send(&leadership.lost());
    send_future(leadership.resign());
    let guard = locker.lock("k").await.unwrap();
    send(&guard.lost());
    send_future(guard.release());

    let inner = service_fn(|_req: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::new(),
        )))
    });
    let mut lock_svc = LockLayer::new(
        locker.clone(),
        KeyFrom::header(http::HeaderName::from_static("x")),
    )
    .layer(inner);
    send_future(lock_svc.call(http::Request::new(())));
    let mut coalesce_svc = SharedResponseLayer::new(locker, KeyFrom::path_segment(0)).layer(inner);
    send_future(coalesce_svc.call(http::Request::new(())));
}
