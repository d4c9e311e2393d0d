//! `Locker::lock_many` against a real Redis: overlapping sets in opposite orders
//! never deadlock, a lease lost on one key signals the whole guard, and a
//! cancelled or failed call leaves no key locked.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockflight::{Error, LockKey, Locker, RedisBackend};
use testkit::{is_free, shared, unique_prefix, wait_until};

async fn backend(prefix: &str) -> RedisBackend {
    RedisBackend::builder(shared().url())
        .prefix(prefix)
        .connect()
        .await
        .unwrap()
}

async fn lockers(name: &str, n: usize, ttl: Duration) -> (Vec<Locker>, RedisBackend) {
    lockers_at(&unique_prefix(name), n, ttl).await
}

async fn lockers_at(prefix: &str, n: usize, ttl: Duration) -> (Vec<Locker>, RedisBackend) {
    let mut out = Vec::new();
    let mut first = None;
    for _ in 0..n {
        let b = backend(prefix).await;
        first.get_or_insert_with(|| b.clone());
        out.push(
            Locker::builder(b)
                .lease_ttl(ttl)
                .wait_timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        );
    }
    (out, first.unwrap())
}

/// Two instances lock {a, b} and {b, a} 1,000 times each, with a check that
/// nobody else is inside either key while they hold the pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_never_deadlock() {
    let (lockers, _) = lockers("multi-order", 2, Duration::from_secs(10)).await;
    let inside = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, locker) in lockers.iter().enumerate() {
        let (locker, inside) = (locker.clone(), inside.clone());
        let order: [&str; 2] = if i == 0 { ["a", "b"] } else { ["b", "a"] };
        tasks.push(tokio::spawn(async move {
            for _ in 0..1_000 {
                let guard = locker
                    .lock_many(order)
                    .await
                    .expect("no deadlock, no timeout");
                for slot in inside.iter() {
                    assert_eq!(slot.fetch_add(1, Ordering::SeqCst), 0, "overlap");
                }
                tokio::task::yield_now().await;
                for slot in inside.iter() {
                    slot.fetch_sub(1, Ordering::SeqCst);
                }
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    println!(
        "2 × 1,000 overlapping lock_many calls in {:?}",
        started.elapsed()
    );
    // Leases cached after the last calls go back when their linger ends.
    testkit::wait_idle(&lockers, Duration::from_secs(10)).await;
    assert!(is_free(&lockers[0], "a").await && is_free(&lockers[0], "b").await);
}

/// One key of the set deleted behind the holder's back: the whole guard is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_lost_midway_signals_the_whole_guard() {
    let ttl = Duration::from_millis(900);
    let prefix = unique_prefix("multi-loss");
    let (lockers, _) = lockers_at(&prefix, 1, ttl).await;
    let locker = &lockers[0];
    let guard = locker.lock_many(["x", "y", "z"]).await.unwrap();
    assert!(!guard.is_lost());
    let tokens = guard.fencing_tokens();
    assert_eq!(tokens.len(), 3);
    let mut con = shared().connection().await;
    redis::cmd("DEL")
        .arg(testkit::names::lock(&prefix, &LockKey::from("y")))
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let lost = tokio::time::timeout(ttl * 2, guard.lost()).await;
    assert!(
        lost.is_ok(),
        "loss of one key was not signalled on the guard"
    );
    assert!(guard.is_lost());
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    // The other keys were released anyway.
    for key in ["x", "y", "z"] {
        assert!(is_free(locker, key).await, "{key} left locked");
    }
}

/// A `lock_many` cancelled while it holds its first key and waits for the second
/// releases the first; one that times out does too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_and_failure_release_every_key() {
    let prefix = unique_prefix("multi-cancel");
    let (lockers, _) = lockers_at(&prefix, 2, Duration::from_secs(10)).await;
    let (a, b) = (&lockers[0], &lockers[1]);
    let blocker = b.lock("k2").await.unwrap();

    // Cancelled: holds k1, waits for k2.
    let call = tokio::spawn({
        let a = a.clone();
        async move { a.lock_many(["k2", "k1"]).await }
    });
    assert!(
        wait_until(Duration::from_secs(5), || {
            let b = b.clone();
            async move { b.try_lock("k1").await.unwrap().is_none() }
        })
        .await,
        "lock_many never took k1"
    );
    call.abort();
    let _ = call.await;
    assert!(
        wait_until(Duration::from_secs(5), || {
            let b = b.clone();
            async move { is_free(&b, "k1").await }
        })
        .await,
        "k1 stayed locked after the call was cancelled"
    );

    // Failed (times out on k2): k1 is released too.
    let short = Locker::builder(backend(&prefix).await)
        .wait_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let err = short.lock_many(["k1", "k2"]).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(
        wait_until(Duration::from_secs(5), || {
            let b = b.clone();
            async move { is_free(&b, "k1").await }
        })
        .await,
        "k1 stayed locked after lock_many failed on k2"
    );
    blocker.release().await.unwrap();
    assert!(is_free(b, "k1").await && is_free(b, "k2").await);
    // Leases cached by the checks above go back when their linger ends.
    testkit::wait_idle(&[a.clone(), b.clone(), short], Duration::from_secs(10)).await;
}

#[tokio::test]
async fn an_empty_set_is_invalid() {
    let locker = Locker::builder(lockflight::MemoryBackend::new())
        .build()
        .unwrap();
    let err = locker.lock_many(Vec::<LockKey>::new()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err}");
    let err = locker.lock_many(["ok", ""]).await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err}");
    assert!(
        is_free(&locker, "ok").await,
        "nothing locked before validation"
    );
}
