//! A future that asks again for a lock it runs under gets `Error::Reentrant` at
//! once — behind the tower layer and inside `with_lock` — instead of waiting
//! behind itself until its wait timeout; sibling futures of the same task are not
//! mistaken for holders.

use std::time::{Duration, Instant};

use http::Request;
use lockflight::layer::LockLayer;
use lockflight::{Error, LockKey, Locker, RedisBackend, layer::KeyFrom};
use testkit::{shared, unique_prefix};
use tower::{Layer, ServiceExt, service_fn};

/// Generous against a loaded machine, far below the wait timeout.
const AT_ONCE: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(20);

async fn redis_locker(name: &str) -> Locker {
    let backend = RedisBackend::builder(shared().url())
        .prefix(unique_prefix(name))
        .connect()
        .await
        .unwrap();
    Locker::builder(backend).wait_timeout(WAIT).build().unwrap()
}

fn assert_reentrant(result: lockflight::Result<impl std::fmt::Debug>, key: &str) {
    match result {
        Err(Error::Reentrant { key: k }) => assert_eq!(k, LockKey::from(key)),
        other => panic!("expected Error::Reentrant for {key:?}, got {other:?}"),
    }
}

/// The case: a route behind `LockLayer` whose handler calls `with_lock`
/// on the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_and_with_lock_on_the_same_key_fail_at_once() {
    let locker = redis_locker("reentry-layer").await;
    let inner_locker = locker.clone();
    let handler = service_fn(move |req: Request<()>| {
        let locker = inner_locker.clone();
        async move {
            let sku = req.headers()["x-sku"].to_str().unwrap().to_owned();
            let started = Instant::now();
            let same = locker.with_lock(sku.as_str(), |_| async {}).await;
            let other = locker.with_lock("another-sku", |_| async { "ok" }).await;
            Ok::<_, std::convert::Infallible>((started.elapsed(), same, other))
        }
    });
    let svc = LockLayer::new(
        locker.clone(),
        KeyFrom::header(http::HeaderName::from_static("x-sku")),
    )
    .layer(handler);
    let req = Request::builder()
        .header("x-sku", "sku:1")
        .body(())
        .unwrap();
    let (elapsed, same, other) = svc.oneshot(req).await.unwrap();
    assert_reentrant(same, "sku:1");
    assert!(elapsed < AT_ONCE, "answered after {elapsed:?}");
    assert_eq!(other.unwrap(), "ok", "another key is not affected");
    // The layer's own lock is released (in the background, as the response
    // future completed).
    let free = testkit::wait_until(AT_ONCE, || {
        let locker = locker.clone();
        async move { locker.try_lock("sku:1").await.unwrap().is_some() }
    })
    .await;
    assert!(free, "the layer's lock was not released");
}

/// Every entry point of the locker answers at once from inside `with_lock`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_point_answers_at_once_inside_with_lock() {
    let locker = redis_locker("reentry-entry-points").await;
    let inner = locker.clone();
    let started = Instant::now();
    locker
        .with_lock("k", |_| async move {
            assert_reentrant(inner.lock("k").await, "k");
            assert_reentrant(
                inner
                    .lock_with_options("k", lockflight::LockOptions::new().wait_timeout(WAIT))
                    .await,
                "k",
            );
            assert_reentrant(inner.try_lock("k").await, "k");
            assert_reentrant(inner.with_lock("k", |_| async {}).await, "k");
            assert_reentrant(inner.singleflight("k", || async { 1u8 }).await, "k");
            // Nested scopes accumulate: inside a second key's lock, both count.
            let nested = inner.clone();
            inner
                .with_lock("k2", |_| async move {
                    assert_reentrant(nested.try_lock("k").await, "k");
                    assert_reentrant(nested.try_lock("k2").await, "k2");
                })
                .await
                .unwrap();
        })
        .await
        .unwrap();
    assert!(started.elapsed() < AT_ONCE, "took {:?}", started.elapsed());
    assert_eq!(
        locker.stats().timeouts,
        0,
        "nothing waited for its own lock"
    );
}

/// Two independent futures of one task (`join!`) both lock the same key: the
/// second waits for the first, as it should — holding is scoped to the future
/// that runs under the lock, not to the task or the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sibling_futures_of_one_task_are_not_holders() {
    let locker = redis_locker("reentry-siblings").await;
    let task = tokio::spawn({
        let locker = locker.clone();
        async move {
            let one = locker.with_lock("k", |info| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                info.fencing_token
            });
            let two = locker.with_lock("k", |info| async move { info.fencing_token });
            let (a, b) = tokio::join!(one, two);
            (a.unwrap(), b.unwrap())
        }
    });
    let (a, b) = task.await.unwrap();
    assert_ne!(a, b, "two critical sections, one after the other");
    // A different locker (another service instance) is not this one's holder
    // either: it waits in line instead of failing.
    let other = redis_locker("reentry-siblings-other").await;
    let inner = other.clone();
    locker
        .with_lock("k", |_| async move {
            inner
                .with_lock("k", |_| async { "other prefix, other lock" })
                .await
        })
        .await
        .unwrap()
        .unwrap();
}
