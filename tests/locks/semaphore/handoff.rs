//! Local permit handoff against a real Redis: a released permit passes to the next
//! local waiter without a request (the same permit in Redis), its turns are
//! bounded while another instance waits, and fair mode hands on nothing while
//! another instance waits.

use std::sync::Mutex;

use super::*;

/// The members of a semaphore's permit set (the permit tokens).
async fn permit_tokens(con: &mut redis::aio::MultiplexedConnection, set: &[u8]) -> Vec<Vec<u8>> {
    redis::cmd("ZRANGE")
        .arg(set)
        .arg(0)
        .arg(-1)
        .query_async(con)
        .await
        .expect("ZRANGE")
}

/// A released permit goes to the local waiter in memory: no acquire request, and
/// Redis holds the same permit token before and after; it is returned to Redis
/// when nobody waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_passes_to_a_local_waiter_without_a_request() {
    let (server, _log, prefix) = shared_scene("sem-handoff");
    let backend = backend_at(&server.url(), &prefix).await;
    let set = testkit::names::permits(&prefix, &LockKey::from("k"));
    let waiting_set = suffixed(&set, "q");
    let l = locker(backend, Duration::from_secs(30));
    let mut con = server.connection().await;
    let sem = l.semaphore("k", 1);
    let held = sem.acquire().await.unwrap();
    let before = permit_tokens(&mut con, &set).await;
    assert_eq!(before.len(), 1);
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    // The waiter's request was refused: this instance is in the waiting set.
    assert!(
        wait_until(Duration::from_secs(5), || {
            let (mut con, q) = (con.clone(), waiting_set.clone());
            async move { zcard(&mut con, &q).await == 1 }
        })
        .await
    );
    let stats = l.stats();
    held.release().await.unwrap();
    let next = within(Duration::from_secs(5), "the handed-off permit", waiter)
        .await
        .unwrap()
        .expect("the waiter gets the permit");
    let after = l.stats();
    assert_eq!(after.handoffs - stats.handoffs, 1, "handed off");
    assert_eq!(after.acquire_attempts, stats.acquire_attempts, "no request");
    assert_eq!(
        permit_tokens(&mut con, &set).await,
        before,
        "the same permit"
    );
    // Nobody waits: the instance left the waiting set, and the release returns it.
    assert!(
        wait_until(Duration::from_secs(5), || {
            let (mut con, q) = (con.clone(), waiting_set.clone());
            async move { zcard(&mut con, &q).await == 0 }
        })
        .await
    );
    next.release().await.unwrap();
    assert!(permit_tokens(&mut con, &set).await.is_empty());
    wait_idle(&[l]).await;
}

/// Eight busy tasks of one instance share two permits by handoff (several critical
/// sections per request), yet a task of another instance that asks meanwhile gets
/// a permit within a few handoff budgets (125 ms each while it waits), not when
/// the busy instance stops (20 s here). Never more than two holders at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_turns_are_bounded_while_another_instance_waits() {
    let (server, _log, prefix) = shared_scene("sem-handoff-turns");
    let lockers = instances(&server.url(), &prefix, 2).await;
    let (busy, other) = (&lockers[0], &lockers[1]);
    let inside = Arc::new(Inside {
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    });
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sections = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    let cap = Instant::now() + Duration::from_secs(20);
    for _ in 0..8 {
        let (sem, inside, stopped, sections) = (
            busy.semaphore("pool", 2),
            Arc::clone(&inside),
            Arc::clone(&stopped),
            Arc::clone(&sections),
        );
        set.spawn(async move {
            while !stopped.load(Ordering::SeqCst) && Instant::now() < cap {
                let permit = sem.acquire().await.expect("acquire");
                let entered = inside.enter(2);
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(entered);
                sections.fetch_add(1, Ordering::Relaxed);
                permit.release().await.expect("release");
            }
        });
    }
    // The busy instance's tasks pass its permits among themselves.
    eventually("the busy instance ran 50 sections", || async {
        sections.load(Ordering::Relaxed) >= 50
    })
    .await;
    let asked = Instant::now();
    let permit = other
        .semaphore("pool", 2)
        .acquire()
        .await
        .expect("the other instance's permit");
    let waited = asked.elapsed();
    let entered = inside.enter(2);
    drop(entered);
    permit.release().await.unwrap();
    stopped.store(true, Ordering::SeqCst);
    within(Duration::from_secs(30), "the busy tasks", join_all(set)).await;
    let (n, requests) = (
        sections.load(Ordering::Relaxed),
        busy.stats().acquire_attempts,
    );
    println!("other instance waited {waited:?}; busy: {n} sections, {requests} requests");
    assert!(
        waited < Duration::from_secs(5),
        "the other instance waited {waited:?}: handoff starved it"
    );
    assert!(
        n as u64 >= 3 * requests,
        "{n} sections for {requests} requests: permits were not handed off"
    );
    assert!(inside.max.load(Ordering::SeqCst) <= 2);
    wait_idle(&lockers).await;
}

/// In fair mode a permit passes to a local waiter only while no other instance
/// waits: with instance C queued behind A, A's released permit goes back to Redis,
/// which gives it to C before A's second task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_returns_a_permit_while_another_instance_waits() {
    let (server, _log, prefix) = shared_scene("sem-handoff-fair");
    // Long waiting entries: each instance's retry timer stays far away, so the
    // order comes from the releases' wake-ups alone.
    let backend = || {
        let (url, prefix) = (server.url(), prefix.clone());
        async move {
            RedisBackend::builder(url)
                .prefix(prefix)
                .queue_entry_ttl(Duration::from_secs(60))
                .connect()
                .await
                .unwrap()
        }
    };
    let holder = locker(backend().await, Duration::from_secs(30));
    let bb = backend().await;
    let waiting_set = suffixed(&testkit::names::permits(&prefix, &LockKey::from("k")), "q");
    let a = Locker::builder(bb)
        .lease_ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(60))
        .contention(Contention::Fair)
        .build()
        .unwrap();
    let c = locker(backend().await, Duration::from_secs(30));
    let mut con = server.connection().await;
    let held = holder.semaphore("k", 1).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut set = JoinSet::new();
    let queued = |n: i64| {
        let (con, q) = (con.clone(), waiting_set.clone());
        async move {
            assert!(
                wait_until(Duration::from_secs(5), || {
                    let (mut con, q) = (con.clone(), q.clone());
                    async move { zcard(&mut con, &q).await == n }
                })
                .await,
                "{n} instances waiting"
            );
        }
    };
    for (name, l, n) in [("a", &a, Some(1)), ("c", &c, Some(2)), ("a", &a, None)] {
        let local_waits = a.stats().local_waits;
        let (sem, order) = (l.semaphore("k", 1), Arc::clone(&order));
        set.spawn(async move {
            let p = sem.acquire().await.expect("acquire");
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(20)).await;
            p.release().await.expect("release");
        });
        match n {
            Some(n) => queued(n).await,
            // A's second task joins A's local queue.
            None => {
                eventually("A's second task waits in A's local queue", || async {
                    a.stats().local_waits > local_waits
                })
                .await
            }
        }
    }
    held.release().await.unwrap();
    within(Duration::from_secs(20), "three sections", join_all(set)).await;
    assert_eq!(*order.lock().unwrap(), ["a", "c", "a"]);
    assert_eq!(a.stats().handoffs, 0);
    assert_eq!(zcard(&mut con, &waiting_set).await, 0, "nobody waits");
    wait_idle(&[holder, a, c]).await;
}
