//! Per-call settings (`Locker::lock_with_options`) and per-route settings
//! (`LockLayer::options`) against a real Redis: a wait timeout, a lease TTL, and
//! fail-fast (`try_only`).

use std::time::{Duration, Instant};

use http::Request;
use lockflight::layer::LockLayer;
use lockflight::{Error, LockKey, LockOptions, Locker, RedisBackend, layer::KeyFrom};
use testkit::{eventually, shared, unique_prefix};
use tower::{Layer, ServiceExt, service_fn};

const LOCKER_WAIT: Duration = Duration::from_secs(30);

async fn redis_locker(name: &str) -> (Locker, String) {
    let prefix = unique_prefix(name);
    let backend = RedisBackend::builder(shared().url())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let locker = Locker::builder(backend)
        .wait_timeout(LOCKER_WAIT)
        .build()
        .unwrap();
    (locker, prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_wait_timeout_replaces_the_lockers() {
    let (locker, _) = redis_locker("options-wait").await;
    let guard = locker.lock("k").await.unwrap();
    let started = Instant::now();
    let err = locker
        .lock_with_options(
            "k",
            LockOptions::new().wait_timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(10),
        "waited {waited:?}, the per-call timeout is 300 ms (the locker's is 30 s)"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_only_fails_fast_with_busy_and_one_request() {
    let prefix = unique_prefix("options-try-shared");
    let connect = || async {
        let backend = RedisBackend::builder(shared().url())
            .prefix(prefix.clone())
            .connect()
            .await
            .unwrap();
        Locker::builder(backend)
            .wait_timeout(LOCKER_WAIT)
            .build()
            .unwrap()
    };
    let (one, two) = (connect().await, connect().await);

    // Held by another instance: one backend request, Busy at once.
    let held = one.lock("k").await.unwrap();
    let before = two.stats();
    let started = Instant::now();
    let err = two
        .lock_with_options("k", LockOptions::new().try_only())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Busy { ref key } if *key == LockKey::from("k")),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!((two.stats() - before).acquire_attempts, 1);

    // Held by another task of this process: no backend request at all.
    let before = one.stats();
    let err = one
        .lock_with_options("k", LockOptions::new().try_only())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err}");
    assert_eq!((one.stats() - before).acquire_attempts, 0);

    held.release().await.unwrap();
    let guard = two
        .lock_with_options("k", LockOptions::new().try_only())
        .await
        .expect("free: taken at once");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_lease_ttl_is_what_redis_holds() {
    let (locker, prefix) = redis_locker("options-ttl").await;
    let key = LockKey::from("k");
    let con = shared().connection().await;
    let pttl = |mut con: redis::aio::MultiplexedConnection, name: Vec<u8>| async move {
        redis::cmd("PTTL")
            .arg(name)
            .query_async::<i64>(&mut con)
            .await
            .unwrap()
    };
    let guard = locker
        .lock_with_options(&key, LockOptions::new().lease_ttl(Duration::from_secs(90)))
        .await
        .unwrap();
    let left = pttl(con.clone(), testkit::names::lock(&prefix, &key)).await;
    assert!(
        (60_000..=90_000).contains(&left),
        "PTTL {left} ms, the call asked for 90 s (the locker's TTL is 30 s)"
    );
    guard.release().await.unwrap();

    // A TTL the locker cannot renew in time (renewal every 10 s) is refused.
    let err = locker
        .lock_with_options(&key, LockOptions::new().lease_ttl(Duration::from_secs(2)))
        .await
        .unwrap_err();
    match &err {
        Error::InvalidConfig { reason } => {
            assert!(
                reason.contains("renew_every") && reason.contains('k'),
                "{reason}"
            );
        }
        other => panic!("expected InvalidConfig, got {other}"),
    }
}

/// A fail-fast route answers at once while the key is held; a normal route on the
/// same locker waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_fast_route_answers_at_once_when_busy() {
    let (locker, _) = redis_locker("options-route").await;
    let sku = || KeyFrom::header(http::HeaderName::from_static("x-sku"));
    let handler =
        service_fn(|_req: Request<()>| async { Ok::<_, std::convert::Infallible>("done") });
    let fail_fast = LockLayer::new(locker.clone(), sku())
        .options(LockOptions::new().try_only())
        .layer(handler);
    let patient = LockLayer::new(locker.clone(), sku())
        .options(LockOptions::new().wait_timeout(Duration::from_secs(20)))
        .layer(handler);
    let req = || {
        Request::builder()
            .header("x-sku", "sku:9")
            .body(())
            .unwrap()
    };

    let held = locker.lock("sku:9").await.unwrap();
    let started = Instant::now();
    let err = fail_fast.clone().oneshot(req()).await.unwrap_err();
    let err = err.downcast::<Error>().expect("a lockflight error");
    assert!(matches!(*err, Error::Busy { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));

    let local_waits = locker.stats().local_waits;
    let waiting = tokio::spawn(patient.oneshot(req()));
    // It waits (behind this task's hold), then a window for a wrong grant to show.
    eventually("the patient route waits for the lock", || async {
        locker.stats().local_waits > local_waits
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "the patient route waits for the lock"
    );
    held.release().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), "done");
    // Once the patient route's lock is released (in the background, as its
    // response completed), the fail-fast route goes through.
    let through = testkit::wait_until(Duration::from_secs(5), || {
        let svc = fail_fast.clone();
        async move { svc.oneshot(req()).await.is_ok() }
    })
    .await;
    assert!(through, "the fail-fast route never got the free lock");
}

/// A locker with a 400 ms hold limit and leases of `ttl` renewed every 200 ms,
/// and a second instance without a limit, under one fresh prefix.
async fn limited_pair(name: &str, ttl: Duration) -> (Locker, Locker) {
    let (limited, other, _) = limited_pair_in(name, ttl).await;
    (limited, other)
}

/// [`limited_pair`], and their prefix.
async fn limited_pair_in(name: &str, ttl: Duration) -> (Locker, Locker, String) {
    let prefix = unique_prefix(name);
    let connect = || async {
        RedisBackend::builder(shared().url())
            .prefix(&prefix)
            .connect()
            .await
            .unwrap()
    };
    let limited = Locker::builder(connect().await)
        .lease_ttl(ttl)
        .renew_every(Duration::from_millis(200))
        .hold_limit(Duration::from_millis(400))
        .build()
        .unwrap();
    let other = Locker::builder(connect().await)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    (limited, other, prefix)
}

/// `with_lock` over work that would run for a minute: at the hold limit the lease
/// is lost, the work is dropped, the call returns `LeaseLost` saying why, and the
/// key is free for another instance at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hold_limit_ends_a_runaway_with_lock() {
    // A long TTL: the key is free soon only if the aborted work's lease is
    // released, not because it expired.
    let (limited, other) = limited_pair("hold-limit-with-lock", Duration::from_secs(30)).await;
    let started = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        limited.with_lock("k", |_| tokio::time::sleep(Duration::from_secs(60))),
    )
    .await
    .expect("the runaway work was not stopped by the hold limit");
    match out {
        Err(e @ Error::LeaseLost { .. }) => {
            assert!(e.to_string().contains("hold limit"), "{e}");
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(400));
    // The aborted work's guard is released in the background.
    let g = tokio::time::timeout(
        Duration::from_secs(5),
        other.lock_with_options("k", LockOptions::new().wait_timeout(Duration::from_secs(5))),
    )
    .await
    .expect("the aborted work's lease was not released")
    .unwrap();
    drop(g);
}

/// A stuck holder that never releases (its guard stays alive): at the limit its
/// lease is lost and no longer renewed, and it ends at the server then too (no
/// renewal asked for a TTL past the limit), so another instance gets the key, for
/// the mutex, a write lease, a read lease and a permit alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_holder_loses_every_kind_of_lease_at_the_hold_limit() {
    let (limited, other, prefix) =
        limited_pair_in("hold-limit-stuck", Duration::from_secs(1)).await;
    let mutex = limited.lock("m").await.unwrap();
    let write = limited.rwlock("rw").write().await.unwrap();
    let read = limited.rwlock("rd").read().await.unwrap();
    let permit = limited.semaphore("sem", 1).acquire().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        mutex.lost().await;
        write.lost().await;
        read.lost().await;
        permit.lost().await;
    })
    .await
    .expect("the hold limit did not end the leases");
    assert!(
        mutex
            .loss_signal()
            .reason()
            .unwrap_or_default()
            .contains("hold limit"),
        "{:?}",
        mutex.loss_signal().reason()
    );
    // At the server each lease ends by the limit (plus the drift allowance), not
    // a TTL after its last renewal (800 ms later here): read after the losses,
    // so a slow machine only finds less left.
    let mut conn = shared().connection().await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let bound = 300;
    for name in ["{m}", "{rw}:wr"] {
        let left: i64 = redis::cmd("PTTL")
            .arg(format!("{prefix}:{name}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(left <= bound, "{name} still has {left} ms at the server");
    }
    for name in ["{rd}:rd", "{sem}:sem"] {
        let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(format!("{prefix}:{name}"))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .unwrap();
        for (_, expiry) in members {
            let left = expiry as i64 - now_ms;
            assert!(left <= bound, "{name} still has {left} ms at the server");
        }
    }
    // The guards are still alive: the keys are free for another instance.
    let sem = other.semaphore("sem", 1);
    let (m, w, r, p) = tokio::join!(
        other.lock("m"),
        other.rwlock("rw").write(),
        other.rwlock("rd").write(),
        sem.acquire()
    );
    let taken = (
        m.expect("the mutex"),
        w.expect("the write lease"),
        r.expect("a write lease over the stuck read lease"),
        p.expect("the permit"),
    );
    drop((mutex, write, read, permit, taken));
}

/// Lease caching needs handoff and coalescing: a non-zero cache where a lease
/// cannot be cached is refused, the default is off there, and zero is accepted.
#[test]
fn lease_caching_where_it_cannot_apply_is_a_clear_error() {
    use lockflight::{Contention, Handoff, MemoryBackend};
    let builder = || Locker::builder(MemoryBackend::new());
    let cache = Duration::from_millis(20);
    for (what, b) in [
        ("handoff", builder().handoff(Handoff::disabled())),
        ("fair", builder().contention(Contention::Fair)),
        ("PerTask", builder().contention(Contention::PerTask)),
    ] {
        let e = b.cache_leases_for(cache).build().unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
        assert!(e.to_string().contains("cache_leases_for"), "{e}");
        assert!(e.to_string().contains(what), "{e}");
    }
    builder().handoff(Handoff::disabled()).build().unwrap();
    builder().contention(Contention::Fair).build().unwrap();
    builder()
        .contention(Contention::PerTask)
        .cache_leases_for(Duration::ZERO)
        .build()
        .unwrap();
    builder()
        .cache_leases_for(Duration::from_secs(1))
        .build()
        .unwrap();
}

#[test]
fn a_zero_hold_limit_is_a_clear_error() {
    let e = Locker::builder(lockflight::MemoryBackend::new())
        .hold_limit(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
    assert!(e.to_string().contains("hold_limit"), "{e}");
}

/// `Locker::from_vars`: the topology, prefix and lease TTL come from
/// `LOCKFLIGHT_*` variables; the lock lands under that prefix with that TTL, and a
/// bad variable is an error naming it, before anything connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_from_variables_uses_them() {
    let prefix = unique_prefix("from-vars");
    let locker = Locker::from_vars([
        ("LOCKFLIGHT_REDIS_URL", shared().url()),
        ("LOCKFLIGHT_PREFIX", prefix.clone()),
        ("LOCKFLIGHT_LEASE_TTL", "5s".to_owned()),
        ("LOCKFLIGHT_RESPONSE_TIMEOUT", "3s".to_owned()),
        ("HOME", "/root".to_owned()),
    ])
    .await
    .unwrap();
    let guard = locker.lock("k").await.unwrap();
    let mut con = shared().connection().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(format!("{prefix}:{{k}}"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        (1..=5_000).contains(&pttl),
        "the lease under the prefix has PTTL {pttl}"
    );
    guard.release().await.unwrap();

    let e = Locker::from_vars([
        ("LOCKFLIGHT_REDIS_URL", shared().url()),
        ("LOCKFLIGHT_WAIT_TIMEOUT", "soon".to_owned()),
    ])
    .await
    .unwrap_err();
    assert!(e.to_string().contains("LOCKFLIGHT_WAIT_TIMEOUT"), "{e}");
}

/// `RedisBackend::from_client`: a backend through the application's own
/// `redis::Client`, whose database number it keeps (the lock lands in database 3,
/// not 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_from_an_existing_client_keeps_its_settings() {
    let prefix = unique_prefix("from-client");
    let client = redis::Client::open(format!("{}/3", shared().url().trim_end_matches('/')))
        .expect("a valid url");
    let backend = RedisBackend::from_client(client.clone())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let locker = Locker::builder(backend).build().unwrap();
    let guard = locker.lock("k").await.unwrap();
    let name = format!("{prefix}:{{k}}");
    let mut db3 = client.get_multiplexed_async_connection().await.unwrap();
    let mut db0 = shared().connection().await;
    let exists = |con: &mut redis::aio::MultiplexedConnection| {
        let mut con = con.clone();
        let name = name.clone();
        async move {
            redis::cmd("EXISTS")
                .arg(&name)
                .query_async::<bool>(&mut con)
                .await
                .unwrap()
        }
    };
    assert!(
        exists(&mut db3).await,
        "the lease is not in the client's database"
    );
    assert!(!exists(&mut db0).await, "the lease went to database 0");
    guard.release().await.unwrap();
    assert!(!exists(&mut db3).await);
}

/// A bad instance name is refused by `connect` before it connects, naming the
/// setting and the problem.
#[tokio::test]
async fn a_bad_instance_name_is_a_clear_error() {
    for (name, problem) in [
        ("", "is empty"),
        ("billing\n7", "control character"),
        (&*"x".repeat(201), "longer than 200 bytes"),
    ] {
        let e = lockflight::RedisBackend::builder("redis://127.0.0.1:1")
            .instance_name(name)
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
        assert!(e.to_string().contains("instance_name"), "{e}");
        assert!(e.to_string().contains(problem), "{e}");
    }
}
