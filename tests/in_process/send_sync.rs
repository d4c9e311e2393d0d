//! Pins `Send` (and `Sync` where it matters) on every public future and handle, of
//! every lock kind, so a change that makes one `!Send` fails to compile here
//! instead of in users' code.

use std::convert::Infallible;
use std::future::Future;

use lockflight::layer::{IdempotencyLayer, LockLayer, SharedResponseLayer};
use lockflight::{LockGuard, Locker, MemoryBackend, RedisBackend, layer::KeyFrom, stats::Stats};
use tower::{Layer, Service, service_fn};

fn send<T: Send>(_: &T) {}
fn send_sync<T: Send + Sync>() {}
fn send_only<T: Send>() {}
fn send_future<F: Future + Send>(_: F) {}

#[test]
fn handles_are_send_and_sync() {
    send_sync::<Locker>();
    send_sync::<LockGuard>();
    send_sync::<lockflight::rwlock::ReadGuard>();
    send_sync::<lockflight::rwlock::WriteGuard>();
    send_sync::<lockflight::semaphore::Permit>();
    send_sync::<lockflight::guard::MultiGuard>();
    send_sync::<lockflight::guard::LossSignal>();
    send_sync::<MemoryBackend>();
    send_sync::<RedisBackend>();
    send_sync::<lockflight::Error>();
    send_sync::<Stats>();
    send_sync::<lockflight::election::Election>();
    send_sync::<lockflight::election::Leadership>();
    send_sync::<lockflight::fence::FencedKey>();
    send_sync::<lockflight::rwlock::RwLock>();
    send_sync::<lockflight::semaphore::Semaphore>();
    send_only::<lockflight::guard::Loss>();
    send_sync::<lockflight::guard::LockInfo>();
    send_sync::<lockflight::FencingToken>();
    send_sync::<lockflight::LockOptions>();
    send_sync::<lockflight::backend::RedlockBackend>();
    send_only::<lockflight::election::Observation>();
    #[cfg(feature = "inspect")]
    send_sync::<lockflight::inspect::Inspector>();
    #[cfg(feature = "testing")]
    {
        send_sync::<lockflight::testing::SimServer>();
        send_sync::<lockflight::testing::SimBackend>();
    }
}

/// The futures and loss signals of every lock kind, and of the election's
/// observation and the locker's end.
#[tokio::test]
async fn every_kind_s_futures_are_send() {
    let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
    let rw = locker.rwlock("rw");
    send_future(rw.read());
    send_future(rw.write());
    send_future(rw.try_read());
    send_future(rw.try_write());
    let read = rw.read().await.unwrap();
    send(&read.lost());
    send_future(read.release());
    let write = rw.write().await.unwrap();
    send(&write.lost());
    send_future(write.release());
    let semaphore = locker.semaphore("sem", 2);
    send_future(semaphore.acquire());
    send_future(semaphore.try_acquire());
    let permit = semaphore.acquire().await.unwrap();
    send(&permit.lost());
    send_future(permit.release());
    send_future(locker.lock_many(["a", "b"]));
    let many = locker.lock_many(["a", "b"]).await.unwrap();
    send(&many.lost());
    send_future(many.release());
    let election = locker.election("observed").identity("me");
    let mut observation = election.observe();
    send_future(observation.next());
    send_future(election.run_with_stop(|_leader, _loss| async {}, |_stopped| async {}));
    send_future(locker.shutdown());
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
    let mut coalesce_svc =
        SharedResponseLayer::new(locker.clone(), KeyFrom::path_segment(0)).layer(inner);
    send_future(coalesce_svc.call(http::Request::new(())));
    let buffered = service_fn(
        |_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
            Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
                bytes::Bytes::new(),
            )))
        },
    );
    let mut idempotent_svc = IdempotencyLayer::new(locker).layer(buffered);
    send_future(idempotent_svc.call(http::Request::new(Default::default())));
}

/// The fenced writes' futures, over any `Send` connection: checked when this
/// compiles (it is never called).
#[allow(dead_code)]
fn fenced_writes_are_send<C: lockflight::redis::aio::ConnectionLike + Send>(
    key: &lockflight::fence::FencedKey,
    conn: &mut C,
) {
    use lockflight::fence::WriteId;
    let token = lockflight::FencingToken::new(1, 0);
    send_future(key.set(conn, token, "v"));
    send_future(key.set_once(conn, token, "v", WriteId::next()));
    send_future(key.set_with_ttl(conn, token, "v", std::time::Duration::from_secs(1)));
    send_future(key.set_with_ttl_once(
        conn,
        token,
        "v",
        std::time::Duration::from_secs(1),
        WriteId::next(),
    ));
    send_future(key.incr_by(conn, token, 1));
    send_future(key.incr_by_once(conn, token, 1, WriteId::next()));
    send_future(key.hset(conn, token, [("f", "v")]));
    send_future(key.hset_once(conn, token, [("f", "v")], WriteId::next()));
    send_future(key.delete(conn, token));
    send_future(key.delete_once(conn, token, WriteId::next()));
    send_future(key.advance(conn, token));
    send_future(key.last_token(conn));
    send_future(key.forget(conn));
}

/// The operator's reads and forced release, over any `Send` connection.
#[cfg(feature = "inspect")]
#[allow(dead_code)]
fn inspect_futures_are_send<C: lockflight::redis::aio::ConnectionLike + Send>(
    inspector: &lockflight::inspect::Inspector,
    conn: &mut C,
) {
    send_future(inspector.key(conn, "k"));
    send_future(inspector.list(conn, "", 10));
    send_future(inspector.instance(conn, "0000000000000000"));
    send_future(inspector.force_release(conn, "k", &[]));
}
