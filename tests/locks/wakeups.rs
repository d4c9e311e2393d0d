//! A wake-up that races with a Busy reply is not lost: the leader registers for
//! wake-ups only after it is told to wait, and must notice one that arrived while
//! its request was in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockflight::backend::{Acquire, LeaseToken, LockKind, Released, Renewal, Signals, WhenBusy};
use lockflight::{Contention, LockKey, Locker, backend::LockBackend};

/// Answers the first acquire with Busy and a far-away retry time, after waking the
/// key as a release by another instance would at that very moment; grants the next.
#[derive(Debug, Default)]
struct RacingRelease {
    wakeups: Signals,
    acquires: AtomicU32,
}

#[async_trait]
impl LockBackend for RacingRelease {
    async fn acquire(
        &self,
        key: &LockKey,
        _token: LeaseToken,
        _ttl: Duration,
        _when_busy: WhenBusy,
    ) -> lockflight::Result<Acquire> {
        if self.acquires.fetch_add(1, Ordering::SeqCst) == 0 {
            self.wakeups.wake(LockKind::Mutex, key.as_bytes());
            return Ok(Acquire::Busy {
                retry_in: Duration::from_secs(60),
            });
        }
        Ok(Acquire::Acquired {
            epoch: 1,
            waiting: 0,
            earliest_other: None,
        })
    }
    async fn release(&self, _key: &LockKey, _token: LeaseToken) -> lockflight::Result<Released> {
        Ok(Released {
            released: true,
            waiting: 0,
        })
    }
    async fn renew(
        &self,
        _key: &LockKey,
        _token: LeaseToken,
        _ttl: Duration,
    ) -> lockflight::Result<Renewal> {
        Ok(Renewal::Renewed { waiting: 0 })
    }
    async fn leave(&self, _key: &LockKey) -> lockflight::Result<()> {
        Ok(())
    }
    fn signals(&self) -> &Signals {
        &self.wakeups
    }
}

#[tokio::test]
async fn a_wake_up_during_the_busy_reply_is_not_lost() {
    for coalescing in [true, false] {
        let backend = Arc::new(RacingRelease::default());
        let locker = Locker::builder(Arc::clone(&backend))
            .wait_timeout(Duration::from_secs(30))
            .contention(if coalescing {
                Contention::Coalesced
            } else {
                Contention::PerTask
            })
            .build()
            .unwrap();
        let started = Instant::now();
        let guard = locker.lock("k").await.expect("lock");
        // Woken by the missed wake-up's trace, not by the 60 s retry timer.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(backend.acquires.load(Ordering::SeqCst), 2);
        guard.release().await.unwrap();
        assert!(
            backend.signals().is_empty(),
            "the wake-up registration leaked"
        );
    }
}

use lockflight::RedisBackend;

async fn backend(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .claim_ttl(Duration::from_secs(30))
        .queue_entry_ttl(Duration::from_secs(30))
        .connect()
        .await
        .unwrap()
}

/// The key of the claim tests and the TTL of their leases.
const CLAIMED: &str = "k";
const CLAIM_TEST_TTL: Duration = Duration::from_secs(30);

/// A holds [`CLAIMED`], B queues for it through the trait (without watching), then
/// A releases, which gives B a claim. Returns B's lease token.
async fn claim_for_b(a: &RedisBackend, b: &RedisBackend) -> LeaseToken {
    let key = LockKey::from(CLAIMED);
    let held = LeaseToken::random();
    assert!(matches!(
        a.acquire(&key, held, CLAIM_TEST_TTL, WhenBusy::Queue)
            .await
            .unwrap(),
        Acquire::Acquired { .. }
    ));
    let b_token = LeaseToken::random();
    assert!(matches!(
        b.acquire(&key, b_token, CLAIM_TEST_TTL, WhenBusy::Queue)
            .await
            .unwrap(),
        Acquire::Busy { .. }
    ));
    assert!(a.release(&key, held).await.unwrap().released);
    b_token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwanted_claim_is_passed_on() {
    let server = testkit::shared();
    let prefix = testkit::unique_prefix("unwanted-claim");
    let (a, b, c) = (
        backend(&server.url(), &prefix).await,
        backend(&server.url(), &prefix).await,
        backend(&server.url(), &prefix).await,
    );
    let (key, ttl) = (LockKey::from(CLAIMED), CLAIM_TEST_TTL);
    // B queues through the trait but never watches: it will not use a claim.
    claim_for_b(&a, &b).await;
    // The release gave B a 30 s claim; B's notifier gives it up after its grace
    // period, so C gets the lock long before the claim would expire.
    let started = Instant::now();
    let got = testkit::wait_until(Duration::from_secs(10), || async {
        matches!(
            c.acquire(&key, LeaseToken::random(), ttl, WhenBusy::Return)
                .await
                .unwrap(),
            Acquire::Acquired { .. }
        )
    })
    .await;
    assert!(
        got && started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_claim_does_not_cost_a_newer_queue_entry() {
    let server = testkit::shared();
    let prefix = testkit::unique_prefix("used-claim");
    let (a, b) = (
        backend(&server.url(), &prefix).await,
        backend(&server.url(), &prefix).await,
    );
    let (key, ttl) = (LockKey::from(CLAIMED), CLAIM_TEST_TTL);
    let b_token = claim_for_b(&a, &b).await;
    // Within B's grace period, B uses its claim (nobody watches at B, as for a
    // leader whose reply is in flight, so its notifier schedules an unwanted-claim
    // check) and A, which waits properly, queues for the key again.
    assert!(matches!(
        b.acquire(&key, b_token, ttl, WhenBusy::Queue)
            .await
            .unwrap(),
        Acquire::Acquired { .. }
    ));
    let _a_waits = a.signals().watch(LockKind::Mutex, &key);
    assert!(matches!(
        a.acquire(&key, LeaseToken::random(), ttl, WhenBusy::Queue)
            .await
            .unwrap(),
        Acquire::Busy { .. }
    ));
    // B releases (A gets the claim) and B queues again, not yet watching.
    assert!(b.release(&key, b_token).await.unwrap().released);
    assert!(matches!(
        b.acquire(&key, LeaseToken::random(), ttl, WhenBusy::Queue)
            .await
            .unwrap(),
        Acquire::Busy { .. }
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // B's stale check (its claim was used long ago) must not have removed B's newer
    // queue entry.
    let mut con = server.connection().await;
    let entry: Option<String> = redis::cmd("ZSCORE")
        .arg(testkit::names::queue(&prefix, &key))
        .arg(b.instance_id())
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        entry.is_some(),
        "a stale unwanted-claim check deleted a live queue entry"
    );
}

/// The notifier's unwanted-claim check counts only waiters of the mutex (issue 20,
/// defect 7): B is given the claim of the mutex "k", which nobody at B waits for,
/// while a semaphore waiter of B waits on the same key string. The semaphore is
/// another lock: B passes the mutex claim on, so C gets the mutex long before the
/// claim's 30 s expire. (With wake-ups keyed by the key's bytes only, the semaphore
/// waiter "watched" the key and the claim was kept.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwanted_claim_is_passed_on_while_a_semaphore_of_the_key_string_is_waited_for() {
    let server = testkit::shared();
    let _log = server.log_on_panic();
    let prefix = testkit::unique_prefix("unwanted-claim-kinds");
    let (a, b, c) = (
        backend(&server.url(), &prefix).await,
        backend(&server.url(), &prefix).await,
        backend(&server.url(), &prefix).await,
    );
    let (key, ttl) = (LockKey::from(CLAIMED), CLAIM_TEST_TTL);
    // A holds the semaphore "k"; B's locker waits for it.
    let a_locker = Locker::builder(a.clone()).build().unwrap();
    let b_locker = Locker::builder(b.clone())
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let permit = a_locker.semaphore(&key, 1).acquire().await.unwrap();
    let b_waits = tokio::spawn({
        let (b_locker, key) = (b_locker.clone(), key.clone());
        async move { drop(b_locker.semaphore(&key, 1).acquire().await.expect("permit")) }
    });
    let semaphore_queue = testkit::suffixed(&testkit::names::lock(&prefix, &key), ":semq");
    let con = server.connection().await;
    assert!(
        testkit::wait_until(Duration::from_secs(10), || {
            let (mut con, queue, id) = (con.clone(), &semaphore_queue, b.instance_id());
            async move {
                redis::cmd("ZSCORE")
                    .arg(queue)
                    .arg(id)
                    .query_async::<Option<String>>(&mut con)
                    .await
                    .unwrap()
                    .is_some()
            }
        })
        .await,
        "B's semaphore waiter never queued"
    );
    // B queues for the mutex through the trait but never watches it; the release
    // gives B a 30 s claim.
    claim_for_b(&a, &b).await;
    let started = Instant::now();
    let got = testkit::wait_until(Duration::from_secs(10), || async {
        matches!(
            c.acquire(&key, LeaseToken::random(), ttl, WhenBusy::Return)
                .await
                .unwrap(),
            Acquire::Acquired { .. }
        )
    })
    .await;
    assert!(
        got && started.elapsed() < Duration::from_secs(5),
        "the mutex claim was kept for B's semaphore waiter: {:?}",
        started.elapsed()
    );
    drop(permit);
    tokio::time::timeout(Duration::from_secs(10), b_waits)
        .await
        .expect("B's semaphore waiter got the permit")
        .unwrap();
}

/// The wake-up messages on an instance's channel, as a real Redis delivers them: a
/// message tagged with a lock kind wakes only that kind's watchers of the key; a
/// bare key (as an older lockflight publishes it, e.g. during a rolling upgrade)
/// wakes every kind's; the empty probe wakes nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_messages_wake_the_kind_they_name() {
    let server = testkit::shared();
    let _log = server.log_on_panic();
    let prefix = testkit::unique_prefix("kind-messages");
    let b = backend(&server.url(), &prefix).await;
    let key = LockKey::from("k");
    let mut watches: Vec<_> = LockKind::ALL
        .into_iter()
        .map(|kind| b.signals().watch(kind, &key))
        .collect();
    let mut con = server.connection().await;
    let short = Duration::from_millis(100);
    let mut publish = async |message: &[u8]| {
        let receivers: u32 = redis::cmd("PUBLISH")
            .arg(testkit::names::channel(&prefix, b.instance_id()))
            .arg(message)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(receivers, 1, "B is subscribed");
    };
    // The tags: 0xFD mutex, 0xFE read-write, 0xFF semaphore.
    for (i, tag) in [0xFDu8, 0xFE, 0xFF].into_iter().enumerate() {
        publish(&[&[tag][..], b"k"].concat()).await;
        for (j, watch) in watches.iter_mut().enumerate() {
            let woken = tokio::time::timeout(short, watch.woken()).await.is_ok();
            assert_eq!(woken, i == j, "tag {tag:#x} and {:?}", LockKind::ALL[j]);
        }
    }
    publish(b"k").await;
    for watch in &mut watches {
        tokio::time::timeout(Duration::from_secs(5), watch.woken())
            .await
            .expect("a bare key wakes every kind");
    }
    publish(b"").await;
    for watch in &mut watches {
        assert!(tokio::time::timeout(short, watch.woken()).await.is_err());
    }
}

/// In process, a waiter of another lock of the same key string is not a waiter of
/// the mutex: the memory backend counts only the mutex's own waiters in the
/// `waiting` of its replies (which the holder's handoff budget is based on).
#[tokio::test]
async fn the_memory_backend_counts_only_waiters_of_the_same_lock() {
    let backend = lockflight::MemoryBackend::new();
    let holder = Locker::builder(backend.clone()).build().unwrap();
    let locker = Locker::builder(backend.clone())
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let key = LockKey::from("k");
    let permit = holder.semaphore(&key, 1).acquire().await.unwrap();
    let write = holder.rwlock(&key).write().await.unwrap();
    let waiters = [
        tokio::spawn({
            let (locker, key) = (locker.clone(), key.clone());
            async move { drop(locker.semaphore(&key, 1).acquire().await.expect("permit")) }
        }),
        tokio::spawn({
            let (locker, key) = (locker.clone(), key.clone());
            async move { drop(locker.rwlock(&key).read().await.expect("read")) }
        }),
    ];
    // Both wait (each has asked the backend and was told to wait).
    assert!(
        testkit::wait_until(Duration::from_secs(10), || async {
            locker.stats().acquire_attempts >= 2
        })
        .await,
        "{:?}",
        locker.stats()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let token = LeaseToken::random();
    match backend
        .acquire(&key, token, Duration::from_secs(30), WhenBusy::Queue)
        .await
        .unwrap()
    {
        Acquire::Acquired { waiting, .. } => assert_eq!(
            waiting, 0,
            "the semaphore's and the read-write lock's waiters counted as mutex waiters"
        ),
        busy => panic!("{busy:?}"),
    }
    assert!(backend.release(&key, token).await.unwrap().released);
    drop((permit, write));
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter got its lock")
            .unwrap();
    }
}

/// Instance A's locker without coalescing (its backend too), and the key "herd",
/// held by another instance, and the prefix.
async fn naive_waiting_for_a_holder(
    server: &testkit::RedisServer,
    name: &str,
) -> (RedisBackend, Locker, LockKey, lockflight::LockGuard, String) {
    let prefix = testkit::unique_prefix(name);
    let a = backend(&server.url(), &prefix).await;
    let naive = Locker::builder(a.clone())
        .contention(Contention::PerTask)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let holder = Locker::builder(backend(&server.url(), &prefix).await)
        .build()
        .unwrap();
    let key = LockKey::from("herd");
    let held = holder.lock(&key).await.unwrap();
    (a, naive, key, held, prefix)
}

/// Without coalescing every task of an instance competes at Redis on its own; a
/// release still wakes one of them, not all (a task that stops waiting lets the next
/// one ask), so 16 local waiters pass the lock on at about two acquire requests per
/// critical section — where waking all of them at every release costs about
/// 16 + 15 + … + 1 = 136 — and none is left waiting for the lock's 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_coalescing_a_release_wakes_one_local_task() {
    const TASKS: u64 = 16;
    let server = testkit::shared();
    let _log = server.log_on_panic();
    let (a, naive, key, held, _) = naive_waiting_for_a_holder(server, "wake-one").await;
    let inside = Arc::new(AtomicU32::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (naive, key, inside) = (naive.clone(), key.clone(), Arc::clone(&inside));
        tasks.spawn(async move {
            let guard = naive.lock(&key).await.expect("lock");
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            tokio::task::yield_now().await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.expect("release");
        });
    }
    // Every task asked once, was told to wait, and waits.
    assert!(
        testkit::wait_until(Duration::from_secs(10), || async {
            naive.stats().acquire_attempts == TASKS
                && a.signals().watchers(LockKind::Mutex, key.as_bytes()) == TASKS as usize
        })
        .await,
        "{:?}",
        naive.stats()
    );
    let before = naive.stats().acquire_attempts;
    let released = Instant::now();
    held.release().await.unwrap();
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let attempts = naive.stats().acquire_attempts - before;
    println!("{attempts} acquire requests for {TASKS} critical sections");
    // Woken by messages and passed turns, not by the 30 s TTL timer.
    assert!(
        released.elapsed() < Duration::from_secs(20),
        "{:?}",
        released.elapsed()
    );
    assert!(
        attempts <= 3 * TASKS,
        "{attempts} acquire requests for {TASKS} critical sections"
    );
    assert!(
        testkit::wait_until(Duration::from_secs(5), || async { a.signals().is_empty() }).await,
        "a wake-up registration leaked"
    );
}

/// Without coalescing, waiters that give up (here: aborted) leave this instance's
/// queue entry to the local tasks still waiting, and pass their turn on: the others
/// are woken by the release's message, not by the lock's 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_coalescing_cancelled_waiters_strand_nobody() {
    const TASKS: usize = 12;
    let server = testkit::shared();
    let _log = server.log_on_panic();
    let (a, naive, key, held, prefix) = naive_waiting_for_a_holder(server, "wake-one-cancel").await;
    let mut waiters = Vec::new();
    for _ in 0..TASKS {
        let (naive, key) = (naive.clone(), key.clone());
        waiters.push(tokio::spawn(async move {
            naive
                .lock(&key)
                .await
                .expect("lock")
                .release()
                .await
                .expect("release");
        }));
    }
    assert!(
        testkit::wait_until(Duration::from_secs(10), || async {
            a.signals().watchers(LockKind::Mutex, key.as_bytes()) == TASKS
        })
        .await
    );
    // Half of them give up; their cleanup runs in the background.
    for waiter in waiters.drain(..TASKS / 2) {
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        naive.stats().leaves,
        0,
        "a waiter that gave up left the queue entry the others still use"
    );
    let mut con = server.connection().await;
    let queued: Option<f64> = redis::cmd("ZSCORE")
        .arg(testkit::names::queue(&prefix, &key))
        .arg(a.instance_id())
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        queued.is_some(),
        "the waiters still waiting lost their queue entry"
    );
    let released = Instant::now();
    held.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert!(
        released.elapsed() < Duration::from_secs(20),
        "the remaining waiters waited {:?}",
        released.elapsed()
    );
}
