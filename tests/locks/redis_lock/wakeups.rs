//! Wake-ups.

use super::*;
use lockflight::backend::LockKind;

/// The waiter's fallback timer: a third of its queue entry TTL (30 s).
const LONG_FALLBACK: Duration = Duration::from_secs(10);

/// A backend whose waiters ask again only every [`LONG_FALLBACK`] unless woken:
/// one that gets the lock well before that was woken, however slow the machine.
async fn slow_polling_backend_at(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .queue_entry_ttl(3 * LONG_FALLBACK)
        .connect()
        .await
        .expect("connect the backend")
}

/// A waiting instance is woken by the release (pub/sub), not by polling: with a
/// 30 s lease and a 10 s fallback timer, it holds the lock within a few ms (the
/// bound is half the fallback, so that a loaded machine cannot fail it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_by_release() {
    let (server, _log, prefix) = shared_scene("wakeup");
    let key = LockKey::from("k");
    let holder_backend = backend_at(&server.url(), &prefix).await;
    let waiter_backend = slow_polling_backend_at(&server.url(), &prefix).await;
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
        // its wake-up (or, failing that, its 10 s fallback timer).
        assert!(
            wait_queued(
                &con,
                &prefix,
                &waiter_backend,
                &key,
                true,
                Duration::from_secs(10)
            )
            .await,
            "the waiter never queued"
        );
        eventually("the waiter watches for its wake-up", || async {
            waiter_backend
                .signals()
                .watchers(LockKind::Mutex, key.as_bytes())
                >= 1
        })
        .await;
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
            *after_release < LONG_FALLBACK / 2,
            "the waiter was not woken by the release (polling?): {latencies:?}"
        );
    }
    wait_idle(&[holder, waiter], IDLE).await;
}

/// With 8 instances waiting, each release grants the key to exactly one of them,
/// the head of the queue, on the server: the granted instance takes the lease
/// from the message with no acquire request of its own, and nobody else asks (no
/// thundering herd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_grants_the_key_to_one_waiting_instance_which_asks_nothing() {
    const WAITERS: usize = 8;
    let (server, _log, prefix) = shared_scene("one-of-eight");
    let key = LockKey::from("k");
    // Long queue entries and leases make every fallback timer 20 s: within this
    // test, an acquire attempt can only come from a wake-up.
    let connect = || async {
        RedisBackend::builder(server.url())
            .prefix(&prefix)
            .queue_entry_ttl(Duration::from_secs(60))
            .connect()
            .await
            .unwrap()
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
    for _ in 0..WAITERS {
        waiters.push(build(connect().await));
    }
    let queue = testkit::names::queue(&prefix, &key);
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
        let grants_before: u64 = waiters.iter().map(|w| w.stats().grants).sum();
        current.release().await.unwrap();
        let (i, guard) = within(Duration::from_secs(10), "the next waiter", rx.recv())
            .await
            .unwrap();
        // Give any herd time to show up.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let after = total_attempts(&waiters);
        let grants: u64 = waiters.iter().map(|w| w.stats().grants).sum();
        assert_eq!(
            (after - before, grants - grants_before),
            (0, 1),
            "release #{step} caused {} acquire attempts and {} grants, expected one grant \
             and no attempt: {:?}",
            after - before,
            grants - grants_before,
            waiters.iter().map(Locker::stats).collect::<Vec<_>>()
        );
        order.push(i);
        current = guard;
    }
    current.release().await.unwrap();
    join_all(tasks).await;
    order.sort_unstable();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>());
    assert_eq!(total_attempts(&waiters), WAITERS as u64);
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
    let queue = testkit::names::queue(&prefix, &key);
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
    // Every waiter got the lock (none timed out): the lost wake-up was made up for.
    // How soon is a benchmark's question, not this test's.
    println!("after killing the pub/sub connections, all waiters held the lock within {slowest:?}");

    // CLIENT KILL dropped every subscriber: one on a channel now is a new one.
    for backend in &backends {
        let channel = testkit::names::channel(&prefix, backend.instance_id());
        assert!(
            testkit::channel_subscribed(&con, &channel, 1, Duration::from_secs(10)).await,
            "{backend:?} did not resubscribe to {channel}"
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
    assert!(
        wait_queued(
            &con,
            &prefix,
            &backends[0],
            &key,
            true,
            Duration::from_secs(10)
        )
        .await
    );
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

/// The other lock of the same key string that instance B waits for in the tests
/// below.
#[derive(Clone, Copy, Debug)]
enum Beside {
    /// A semaphore waiter (`Locker::semaphore(key, 1).acquire()`).
    Semaphore,
    /// A read waiter of the read-write lock (`Locker::read(key)`).
    Read,
}

/// Wake-ups are registered per lock kind (issue 20, defect 7). The mutex, the
/// read-write lock and the semaphore of one key string are independent locks, but
/// wake-ups used to be registered by the key's bytes only: instance B's waiter of
/// `beside` counted as a waiter of the mutex, so B's mutex waiter that gave up did
/// not leave the mutex queue ("another local task still waits for the key"), the
/// release gave B the claim, and B's notifier did not pass it on (somebody
/// "watched" the key). C waited out the claim and its retry timer: about 800 ms
/// instead of about 1 ms; in fair mode, until B's stale entry expired.
async fn a_mutex_waiter_that_gives_up_leaves_the_queue(beside: Beside, fair: bool) {
    let (server, _log, prefix) = shared_scene("kinds");
    let url = server.url();
    let key = LockKey::from("k");
    let build = |backend: RedisBackend| {
        Locker::builder(backend)
            .contention(if fair {
                Contention::Fair
            } else {
                Contention::Coalesced
            })
            .wait_timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let a = build(backend_at(&url, &prefix).await);
    let b_backend = backend_at(&url, &prefix).await;
    let b = build(b_backend.clone());
    // C asks again only every 10 s unless woken: a release that wakes it is told
    // from one that does not, however slow the machine.
    let c_backend = slow_polling_backend_at(&url, &prefix).await;
    let c = build(c_backend.clone());
    let con = server.connection().await;

    // A holds the mutex of `key`, and the lock of `beside` of the same key string.
    let held = a.lock(&key).await.unwrap();
    let (beside_held, beside_queue): (Box<dyn Send>, &str) = match beside {
        Beside::Semaphore => (
            Box::new(a.semaphore(&key, 1).acquire().await.unwrap()),
            ":semq",
        ),
        Beside::Read => (Box::new(a.rwlock(&key).write().await.unwrap()), ":rwq"),
    };
    // B waits for the `beside` lock (and keeps waiting throughout).
    let b_beside = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            match beside {
                Beside::Semaphore => drop(b.semaphore(&key, 1).acquire().await.expect("permit")),
                Beside::Read => drop(b.rwlock(&key).read().await.expect("read")),
            }
        }
    });
    let beside_queue = testkit::suffixed(&testkit::names::lock(&prefix, &key), beside_queue);
    let b_id = b_backend.instance_id().to_owned();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (mut con, queue, b_id) = (con.clone(), &beside_queue, &b_id);
            async move { hexists(&mut con, queue, b_id).await }
        })
        .await,
        "B's {beside:?} waiter never queued"
    );
    // B also waits for the mutex, first in line, and gives up; C waits behind it.
    let b_gives_up = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            b.lock_with_options(
                &key,
                lockflight::LockOptions::new().wait_timeout(Duration::from_millis(400)),
            )
            .await
            .map(drop)
        }
    });
    assert!(
        wait_queued(
            &con,
            &prefix,
            &b_backend,
            &key,
            true,
            Duration::from_secs(10)
        )
        .await,
        "B's mutex waiter never queued"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    let c_waits = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move {
            let guard = c.lock(&key).await.expect("C gets the mutex");
            (guard, Instant::now())
        }
    });
    assert!(
        wait_queued(
            &con,
            &prefix,
            &c_backend,
            &key,
            true,
            Duration::from_secs(10)
        )
        .await,
        "C never queued"
    );
    let gave_up = within(Duration::from_secs(10), "B's mutex waiter", b_gives_up)
        .await
        .unwrap();
    assert!(matches!(gave_up, Err(Error::Timeout { .. })), "{gave_up:?}");
    // B's mutex entry goes at once: B's `beside` waiter does not wait for the mutex.
    assert!(
        wait_queued(
            &con,
            &prefix,
            &b_backend,
            &key,
            false,
            Duration::from_millis(500)
        )
        .await,
        "B's mutex waiter gave up but B stayed in the mutex queue, kept there by its \
         {beside:?} waiter of the same key string"
    );
    // So the release wakes C, at once.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (guard, got) = within(Duration::from_secs(10), "C", c_waits).await.unwrap();
    let waited = got.saturating_duration_since(released);
    println!("{beside:?}, fair {fair}: C got the mutex {waited:?} after the release");
    assert!(
        waited < LONG_FALLBACK / 2,
        "C got the mutex {waited:?} after the release: it was not woken"
    );
    guard.release().await.unwrap();
    drop(beside_held);
    within(Duration::from_secs(10), "B's other waiter", b_beside)
        .await
        .unwrap();
    wait_idle(&[a, b, c], IDLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_waiter_that_gives_up_leaves_the_queue_beside_a_semaphore_waiter() {
    a_mutex_waiter_that_gives_up_leaves_the_queue(Beside::Semaphore, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_waiter_that_gives_up_leaves_the_queue_beside_a_read_waiter() {
    a_mutex_waiter_that_gives_up_leaves_the_queue(Beside::Read, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_mutex_waiter_that_gives_up_leaves_the_queue_beside_a_semaphore_waiter() {
    a_mutex_waiter_that_gives_up_leaves_the_queue(Beside::Semaphore, true).await;
}
