//! Permit requests: N is fixed per key, local waiters share one request, and a
//! release wakes one waiting instance.

use redis::aio::MultiplexedConnection;

use super::*;

/// N is fixed at first use: another instance asking with another N gets
/// PermitMismatch at once; once every permit is gone, the key may be used anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_permit_count_is_a_mismatch() {
    let (server, _log, prefix) = shared_scene("sem-mismatch");
    let ab = backend_at(&server.url(), &prefix).await;
    let count = suffixed(&testkit::names::permits(&prefix, &LockKey::from("k")), "n");
    let a = locker(ab, Duration::from_secs(30));
    let b = locker(
        backend_at(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let held = a.semaphore("k", 2).acquire().await.unwrap();
    let con = server.connection().await;
    let pttl = |mut con: MultiplexedConnection, name: Vec<u8>| async move {
        redis::cmd("PTTL")
            .arg(name)
            .query_async::<i64>(&mut con)
            .await
            .unwrap()
    };
    let left = pttl(con.clone(), count.clone()).await;
    assert!(
        (1..=30_000).contains(&left),
        "N is stored with the permits' lifetime: PTTL {left}"
    );
    let started = Instant::now();
    for result in [
        b.semaphore("k", 3).acquire().await.map(Some),
        b.semaphore("k", 3).try_acquire().await,
    ] {
        match result {
            Err(Error::PermitMismatch {
                key,
                permits: 2,
                requested: 3,
            }) => assert_eq!(key, LockKey::from("k")),
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once, not at the wait timeout"
    );
    wait_idle(std::slice::from_ref(&b)).await;
    held.release().await.unwrap();
    assert_eq!(
        pttl(con.clone(), count.clone()).await,
        -2,
        "N goes with the last permit"
    );
    let p = b.semaphore("k", 3).acquire().await.unwrap();
    p.release().await.unwrap();
    // Bad input is refused with the key named.
    let e = b.semaphore("k", 0).acquire().await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }) && e.to_string().contains("semaphore k:"));
}

/// k local waiters that arrive while a request is in flight cost one more request,
/// not k: counted at the proxy, 8 (and 32) waiters cost 2 requests (the first
/// waiter's, and one for all the others), and each release one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiters_share_one_request() {
    let server = shared();
    let _log = server.log_on_panic();
    let proxy = CountingProxy::start(server).await;
    let prefix = unique_prefix("sem-coalesce");
    let l = locker(
        backend_at(&proxy.url(), &prefix).await,
        Duration::from_secs(30),
    );
    for k in [8usize, 32] {
        let sem = l.semaphore(format!("pool-{k}"), k as u32);
        // Loads the scripts (NOSCRIPT, SCRIPT LOAD) once.
        sem.acquire().await.unwrap().release().await.unwrap();
        let attempts = l.stats().acquire_attempts;
        proxy.reset();
        proxy.set_delay(Duration::from_millis(300));
        let mut set = JoinSet::new();
        let first = sem.clone();
        set.spawn(async move { first.acquire().await.unwrap() });
        // The first waiter's request is in flight (delayed by the proxy).
        eventually("the first waiter's request was sent", || async {
            l.stats().acquire_attempts > attempts
        })
        .await;
        for _ in 1..k {
            let sem = sem.clone();
            set.spawn(async move { sem.acquire().await.unwrap() });
        }
        let held = within(Duration::from_secs(10), "k permits", join_all(set)).await;
        let requests = proxy.commands();
        proxy.set_delay(Duration::ZERO);
        println!("{k} local waiters: {requests} Redis commands");
        assert_eq!(l.stats().acquire_attempts - attempts, 2);
        assert_eq!(
            requests, 2,
            "one request in flight, one for all who came meanwhile"
        );
        proxy.reset();
        for p in held {
            p.release().await.unwrap();
        }
        assert_eq!(proxy.commands(), k as u64, "one command per release");
    }
}

/// A waiting instance is woken by the release's message, well before its retry
/// timer (20 s here) and the holder's TTL (30 s); one release wakes one waiting
/// instance (the oldest), not every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_one_waiting_instance() {
    let (server, _log, prefix) = shared_scene("sem-wake");
    let slow_timer = |url: String| {
        let prefix = prefix.clone();
        async move {
            RedisBackend::builder(url)
                .prefix(prefix)
                .queue_entry_ttl(Duration::from_secs(60))
                .connect()
                .await
                .unwrap()
        }
    };
    let holder = locker(slow_timer(server.url()).await, Duration::from_secs(30));
    let bb = slow_timer(server.url()).await;
    let waiting_set = suffixed(&testkit::names::permits(&prefix, &LockKey::from("k")), "q");
    let b = locker(bb, Duration::from_secs(30));
    let c = locker(slow_timer(server.url()).await, Duration::from_secs(30));
    let held = holder.semaphore("k", 1).acquire().await.unwrap();
    let mut con = server.connection().await;

    // b waits first, then c.
    let mut waiting = Vec::new();
    for (l, n) in [(&b, 1), (&c, 2)] {
        let sem = l.semaphore("k", 1);
        waiting.push(tokio::spawn(async move { sem.acquire().await }));
        assert!(
            wait_until(Duration::from_secs(5), || {
                let mut con = con.clone();
                let q = waiting_set.clone();
                async move { zcard(&mut con, &q).await == n }
            })
            .await
        );
    }
    let [b_wait, c_wait]: [_; 2] = waiting.try_into().unwrap();
    let (b0, c0) = (b.stats().acquire_attempts, c.stats().acquire_attempts);
    assert_eq!((b0, c0), (1, 1), "each waiting instance asked once");

    let released = Instant::now();
    held.release().await.unwrap();
    let permit = within(Duration::from_secs(5), "b's permit", b_wait)
        .await
        .unwrap()
        .expect("b acquires");
    let woken_after = released.elapsed();
    println!("the oldest waiting instance got the permit {woken_after:?} after the release");
    assert!(woken_after < Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.stats().acquire_attempts, b0 + 1);
    assert_eq!(
        c.stats().acquire_attempts,
        c0,
        "the release woke one instance, not every one"
    );
    // b's release wakes c, the next one.
    permit.release().await.unwrap();
    let p = within(Duration::from_secs(5), "c's permit", c_wait)
        .await
        .unwrap()
        .expect("c acquires");
    p.release().await.unwrap();
    assert_eq!(zcard(&mut con, &waiting_set).await, 0);
}
