//! Wake-ups.

use super::*;

/// A waiting instance is woken by the release (pub/sub), not by polling: with a
/// 30 s lease and a 1 s fallback timer, it holds the lock within a few ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_by_release() {
    let (server, _log, prefix) = shared_scene("wakeup");
    let key = LockKey::from("k");
    let holder_backend = backend_at(&server.url(), &prefix).await;
    let waiter_backend = backend_at(&server.url(), &prefix).await;
    let holder = Locker::builder(holder_backend.clone())
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let waiter = Locker::builder(waiter_backend.clone())
        .lease_ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let con = server.connection().await;

    let mut latencies = Vec::new();
    for _ in 0..5 {
        let held = holder.lock(&key).await.unwrap();
        let task = {
            let (waiter, key) = (waiter.clone(), key.clone());
            tokio::spawn(async move {
                let guard = waiter.lock(&key).await.expect("the waiter gets the lock");
                (guard, Instant::now())
            })
        };
        // The waiter has been told "busy" and is queued in Redis: it now sleeps on
        // its wake-up (or, failing that, its 1 s fallback timer).
        assert!(
            wait_queued(&con, &waiter_backend, &key, true, Duration::from_secs(10)).await,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before_release = Instant::now();
        held.release().await.unwrap();
        let released = Instant::now();
        let (guard, acquired) = within(Duration::from_secs(10), "waiter", task)
            .await
            .unwrap();
        latencies.push((
            acquired.saturating_duration_since(released),
            acquired.saturating_duration_since(before_release),
        ));
        guard.release().await.unwrap();
    }
    println!(
        "wake-up latency (after release returned / including the release round trip): {latencies:?}"
    );
    for (after_release, _) in &latencies {
        assert!(
            *after_release <= Duration::from_millis(250),
            "the waiter was not woken by the release (polling?): {latencies:?}"
        );
    }
    wait_idle(&[holder, waiter], IDLE).await;
}

/// With 8 instances waiting, each release wakes exactly one of them: one acquire
/// attempt per release, no thundering herd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_one_waiting_instance_not_all() {
    const WAITERS: usize = 8;
    let (server, _log, prefix) = shared_scene("one-of-eight");
    let key = LockKey::from("k");
    // Long queue entries and leases make every fallback timer 20 s: within this
    // test, an acquire attempt can only come from a wake-up.
    let connect = || async {
        subscribed(
            RedisBackend::builder(server.url())
                .prefix(&prefix)
                .queue_entry_ttl(Duration::from_secs(60))
                .connect()
                .await
                .unwrap(),
        )
        .await
    };
    let build = |backend: RedisBackend| {
        Locker::builder(backend)
            .lease_ttl(Duration::from_secs(60))
            .wait_timeout(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let holder = build(connect().await);
    let mut waiters = Vec::new();
    let mut probe = None;
    for _ in 0..WAITERS {
        let backend = connect().await;
        probe.get_or_insert_with(|| backend.clone());
        waiters.push(build(backend));
    }
    let queue = queue_name(probe.as_ref().unwrap(), &key);
    let con = server.connection().await;

    let mut current = holder.lock(&key).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, LockGuard)>();
    let mut tasks = JoinSet::new();
    for (i, waiter) in waiters.iter().enumerate() {
        let (waiter, key, tx) = (waiter.clone(), key.clone(), tx.clone());
        tasks.spawn(async move {
            let guard = waiter.lock(&key).await.expect("lock");
            tx.send((i, guard)).expect("the test receives");
        });
    }
    assert!(
        wait_until(Duration::from_secs(10), || {
            let attempts: Vec<u64> = waiters.iter().map(|w| w.stats().acquire_attempts).collect();
            let mut con = con.clone();
            let queue = &queue;
            async move { attempts.iter().all(|&n| n == 1) && zcard(&mut con, queue).await == 8 }
        })
        .await,
        "the 8 waiters did not all queue with one attempt each: {:?}",
        waiters.iter().map(Locker::stats).collect::<Vec<_>>()
    );

    let mut order = Vec::new();
    for step in 0..WAITERS {
        let before = total_attempts(&waiters);
        current.release().await.unwrap();
        let (i, guard) = within(Duration::from_secs(10), "the next waiter", rx.recv())
            .await
            .unwrap();
        // Give any herd time to show up.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let after = total_attempts(&waiters);
        assert_eq!(
            after - before,
            1,
            "release #{step} caused {} acquire attempts, expected exactly 1 (the woken waiter): {:?}",
            after - before,
            waiters.iter().map(Locker::stats).collect::<Vec<_>>()
        );
        order.push(i);
        current = guard;
    }
    current.release().await.unwrap();
    join_all(tasks).await;
    order.sort_unstable();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>());
    assert_eq!(total_attempts(&waiters), 2 * WAITERS as u64);
    let mut all = waiters.clone();
    all.push(holder);
    wait_idle(&all, IDLE).await;
}

/// The pub/sub connections are killed while waiters are parked: they still get
/// the lock (a lost wake-up is covered by the resubscription's wake-all or the
/// fallback timer), the subscriptions come back, and wake-ups work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_killed_pubsub_connection() {
    const WAITERS: usize = 3;
    let server = RedisServer::start();
    let prefix = unique_prefix("pubsub-kill");
    let key = LockKey::from("k");
    let holder_backend = backend_at(&server.url(), &prefix).await;
    let holder = Locker::builder(holder_backend.clone())
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut backends = Vec::new();
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let backend = backend_at(&server.url(), &prefix).await;
        waiters.push(
            Locker::builder(backend.clone())
                .lease_ttl(Duration::from_secs(30))
                .wait_timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        );
        backends.push(backend);
    }
    let subscriptions_before: Vec<u64> = backends.iter().map(|b| b.subscriptions()).collect();
    let queue = queue_name(&holder_backend, &key);
    let mut con = server.connection().await;

    let held = holder.lock(&key).await.unwrap();
    let mut tasks = JoinSet::new();
    for waiter in &waiters {
        let (waiter, key) = (waiter.clone(), key.clone());
        tasks.spawn(async move {
            let guard = waiter.lock(&key).await.expect("a waiter gets the lock");
            guard.release().await.expect("release");
            Instant::now()
        });
    }
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (mut con, queue) = (con.clone(), &queue);
            async move { zcard(&mut con, queue).await == WAITERS as i64 }
        })
        .await,
        "the waiters never queued"
    );

    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        killed,
        WAITERS as i64 + 1,
        "one pub/sub connection per backend"
    );
    held.release().await.unwrap();
    let released = Instant::now();

    let done = within(Duration::from_secs(15), "the waiters", join_all(tasks)).await;
    let slowest = done
        .iter()
        .map(|t| t.saturating_duration_since(released))
        .max()
        .unwrap();
    println!("after killing the pub/sub connections, all waiters held the lock within {slowest:?}");
    // The fallback timer is queue_entry_ttl / 3 = 1 s; allow a wide margin.
    assert!(
        slowest < Duration::from_millis(2500),
        "waiters took {slowest:?} after a lost wake-up"
    );

    for (backend, before) in backends.iter().zip(&subscriptions_before) {
        let channel = backend.channel();
        let resubscribed = wait_until(Duration::from_secs(10), || {
            let again = backend.subscriptions() > *before && backend.is_subscribed();
            let (mut con, channel) = (con.clone(), &channel);
            async move {
                let numsub: (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(channel)
                    .query_async(&mut con)
                    .await
                    .expect("PUBSUB NUMSUB");
                again && numsub.1 == 1
            }
        })
        .await;
        assert!(
            resubscribed,
            "{backend:?} did not resubscribe: subscriptions {} (before {before})",
            backend.subscriptions()
        );
    }

    // Wake-ups work again through the new subscription.
    let held = holder.lock(&key).await.unwrap();
    let task = {
        let (waiter, key) = (waiters[0].clone(), key.clone());
        tokio::spawn(async move {
            let guard = waiter.lock(&key).await.expect("lock");
            (guard, Instant::now())
        })
    };
    assert!(wait_queued(&con, &backends[0], &key, true, Duration::from_secs(10)).await);
    held.release().await.unwrap();
    let released = Instant::now();
    let (guard, acquired) = within(Duration::from_secs(10), "waiter", task)
        .await
        .unwrap();
    let latency = acquired.saturating_duration_since(released);
    assert!(
        latency <= Duration::from_millis(250),
        "no wake-up after resubscribing: {latency:?}"
    );
    guard.release().await.unwrap();
}
