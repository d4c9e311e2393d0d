//! Integration tests of lockflight's locks against a real Redis: mutual exclusion
//! under contention (coalescing, naive and handoff modes, and the in-memory backend),
//! fencing tokens, wake-ups, crash recovery, renewal, loss, bad input and cancel
//! safety.
//!
//! Tests that only need *a* Redis use [`support::shared`] with their own
//! [`support::unique_prefix`]; tests that pause, kill, restart, flush or kill
//! connections of the server start their own [`RedisServer`].
//!
//! The last section holds regression tests for defects found and fixed earlier.

mod support;

use std::future::Future;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockflight::backend::{Acquire, Extend, LeaseToken};
use lockflight::{
    Error, FencingToken, Handoff, LockBackend, LockGuard, LockKey, Locker, LockerBuilder,
    MAX_KEY_LEN, MemoryBackend, Phase, RedisBackend,
};
use redis::aio::MultiplexedConnection;
use support::{CountingProxy, RedisServer, shared, unique_prefix, wait_until};
use tokio::task::JoinSet;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A backend on `url` under `prefix`, whose notification subscription is up (so
/// that no wake-up published by a test is lost to a subscription still starting,
/// and no `wake_all` of a late subscription causes an extra acquire attempt).
async fn backend_at(url: &str, prefix: &str) -> RedisBackend {
    subscribed(
        RedisBackend::builder(url)
            .prefix(prefix)
            .connect()
            .await
            .expect("connect the backend"),
    )
    .await
}

/// Waits until `backend`'s notification subscription is established.
async fn subscribed(backend: RedisBackend) -> RedisBackend {
    assert!(
        wait_until(Duration::from_secs(10), || {
            let up = backend.is_subscribed();
            async move { up }
        })
        .await,
        "the notification subscription of {backend:?} never came up"
    );
    backend
}

/// The Redis name of `key`'s waiter queue (the lock's name + `:wq`).
fn queue_name(backend: &RedisBackend, key: &LockKey) -> Vec<u8> {
    let mut name = backend.lock_name(key);
    name.extend_from_slice(b":wq");
    name
}

async fn exists(con: &mut MultiplexedConnection, name: &[u8]) -> bool {
    redis::cmd("EXISTS")
        .arg(name)
        .query_async::<i64>(con)
        .await
        .expect("EXISTS")
        == 1
}

async fn pttl(con: &mut MultiplexedConnection, name: &[u8]) -> i64 {
    redis::cmd("PTTL")
        .arg(name)
        .query_async::<i64>(con)
        .await
        .expect("PTTL")
}

/// The number of entries of a waiter queue (a sorted set).
async fn hlen(con: &mut MultiplexedConnection, name: &[u8]) -> i64 {
    redis::cmd("ZCARD")
        .arg(name)
        .query_async::<i64>(con)
        .await
        .expect("ZCARD")
}

/// Whether `field` (an instance id) has an entry in a waiter queue (a sorted set).
async fn hexists(con: &mut MultiplexedConnection, name: &[u8], field: &str) -> bool {
    redis::cmd("ZSCORE")
        .arg(name)
        .arg(field)
        .query_async::<Option<String>>(con)
        .await
        .expect("ZSCORE")
        .is_some()
}

/// Joins every task; re-raises the first panic.
async fn join_all<T: 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(v) => out.push(v),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a test task was cancelled: {e}"),
        }
    }
    out
}

/// Waits until none of `lockers` has local activity left.
async fn wait_idle(lockers: &[Locker]) {
    let idle = wait_until(Duration::from_secs(10), || {
        let busy: usize = lockers.iter().map(Locker::active_keys).sum();
        async move { busy == 0 }
    })
    .await;
    let left: Vec<usize> = lockers.iter().map(Locker::active_keys).collect();
    assert!(idle, "slots left behind: active_keys per locker = {left:?}");
}

/// Sum of `acquire_attempts` over `lockers`.
fn total_attempts(lockers: &[Locker]) -> u64 {
    lockers.iter().map(|l| l.stats().acquire_attempts).sum()
}

/// Proves mutual exclusion from inside a critical section: entering while another
/// task is inside panics. Leaving happens on drop, so a cancelled critical section
/// leaves too (before its lock guard is dropped, if declared after it).
struct Exclusive(Arc<AtomicUsize>);

impl Exclusive {
    fn enter(inside: &Arc<AtomicUsize>) -> Exclusive {
        let before = inside.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two holders of one lock at the same time");
        Exclusive(Arc::clone(inside))
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sets a flag when dropped (proves a future was dropped).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A tiny deterministic PRNG (xorshift64), so the tests need no extra dependency.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn assert_strictly_increasing(tokens: &[FencingToken]) {
    for (i, pair) in tokens.windows(2).enumerate() {
        assert!(
            pair[0] < pair[1],
            "fencing tokens do not strictly increase at #{i}: {} then {} (of {})",
            pair[0],
            pair[1],
            tokens.len()
        );
    }
}

/// Bounds a test step, so that a bug shows up as a clear failure, never a hang.
async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

/// Waits for `guard`'s loss after the lock key was changed behind it by `what`,
/// checks it came within `bound` and that releasing reports the loss; returns how
/// long it took.
async fn expect_loss(guard: LockGuard, bound: Duration, what: &str) -> Duration {
    let changed = Instant::now();
    within(
        bound + Duration::from_secs(2),
        &format!("lost() after {what}"),
        guard.lost(),
    )
    .await;
    let noticed = changed.elapsed();
    assert!(
        noticed <= bound,
        "loss after {what} noticed after {noticed:?}"
    );
    assert!(guard.is_lost());
    match guard.release().await {
        Err(Error::LeaseLost { phase, .. }) => assert_eq!(phase, Phase::Releasing),
        other => panic!("release after {what}: {other:?}"),
    }
    noticed
}

// ---------------------------------------------------------------------------
// Mutual exclusion: the hot-key read-modify-write counter
// ---------------------------------------------------------------------------

const COUNTER_LOCKERS: usize = 3;
const COUNTER_TASKS: usize = 40;
const COUNTER_ITERATIONS: usize = 25;
const COUNTER_TOTAL: u64 = (COUNTER_LOCKERS * COUNTER_TASKS * COUNTER_ITERATIONS) as u64;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Coalescing,
    Naive,
    Handoff,
}

fn configure(builder: LockerBuilder, mode: Mode) -> LockerBuilder {
    let builder = builder.wait_timeout(Duration::from_secs(60));
    match mode {
        Mode::Coalescing => builder.handoff(Handoff::disabled()),
        Mode::Naive => builder.coalescing(false),
        Mode::Handoff => builder.handoff(Handoff::enabled()),
    }
}

/// 3 lockers (each with its own backend: three "processes") × 40 tasks × 25
/// critical sections that GET a counter, yield, and SET it + 1 on another
/// connection. Any lost update is a mutual-exclusion failure.
async fn redis_counter(mode: Mode) {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix(&format!("counter-{mode:?}"));
    let key = LockKey::from("hot");
    let counter = format!("{prefix}:counter");

    let mut lockers = Vec::new();
    let mut backends = Vec::new();
    for _ in 0..COUNTER_LOCKERS {
        let backend = backend_at(&server.url(), &prefix).await;
        lockers.push(
            configure(Locker::builder(backend.clone()), mode)
                .build()
                .expect("valid locker settings"),
        );
        backends.push(backend);
    }
    let data = server.connection().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::with_capacity(COUNTER_TOTAL as usize)));

    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for locker in &lockers {
        for _ in 0..COUNTER_TASKS {
            let (locker, key, counter) = (locker.clone(), key.clone(), counter.clone());
            let (inside, tokens, mut data) = (inside.clone(), tokens.clone(), data.clone());
            tasks.spawn(async move {
                for _ in 0..COUNTER_ITERATIONS {
                    let guard = locker.lock(&key).await.expect("lock within 60 s");
                    {
                        let _inside = Exclusive::enter(&inside);
                        tokens.lock().unwrap().push(guard.fencing_token());
                        let value: Option<u64> = redis::cmd("GET")
                            .arg(&counter)
                            .query_async(&mut data)
                            .await
                            .expect("GET counter");
                        tokio::task::yield_now().await;
                        redis::cmd("SET")
                            .arg(&counter)
                            .arg(value.unwrap_or(0) + 1)
                            .query_async::<()>(&mut data)
                            .await
                            .expect("SET counter");
                    }
                    guard.release().await.expect("release a held lock");
                }
            });
        }
    }
    join_all(tasks).await;
    let elapsed = started.elapsed();

    let mut con = server.connection().await;
    let value: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut con)
        .await
        .expect("GET counter");
    assert_eq!(
        value, COUNTER_TOTAL,
        "lost updates: mutual exclusion failed"
    );

    wait_idle(&lockers).await;
    let lock_name = backends[0].lock_name(&key);
    assert!(
        !exists(&mut con, &lock_name).await,
        "the lock key is left in Redis after every task released"
    );

    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len() as u64, COUNTER_TOTAL);
    assert_strictly_increasing(&tokens);

    let stats: Vec<_> = lockers.iter().map(Locker::stats).collect();
    let acquired: u64 = stats.iter().map(|s| s.acquired).sum();
    let handoffs: u64 = stats.iter().map(|s| s.handoffs).sum();
    let attempts: u64 = stats.iter().map(|s| s.acquire_attempts).sum();
    assert_eq!(
        acquired + handoffs,
        COUNTER_TOTAL,
        "every critical section comes from an acquisition or a handoff: {stats:?}"
    );
    match mode {
        Mode::Coalescing | Mode::Naive => assert_eq!(handoffs, 0, "{stats:?}"),
        Mode::Handoff => assert!(handoffs > 0, "handoff never happened: {stats:?}"),
    }
    for s in &stats {
        assert_eq!(s.leases_lost, 0, "{s:?}");
        assert_eq!(s.timeouts, 0, "{s:?}");
    }
    println!(
        "redis counter {mode:?}: {COUNTER_TOTAL} critical sections in {elapsed:?}, \
         {attempts} acquire attempts ({:.2} per section), {acquired} acquired, {handoffs} handoffs",
        attempts as f64 / COUNTER_TOTAL as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_exact_with_coalescing() {
    redis_counter(Mode::Coalescing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_exact_without_coalescing() {
    redis_counter(Mode::Naive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_exact_with_handoff() {
    redis_counter(Mode::Handoff).await;
}

/// The same workload over clones of one `MemoryBackend` (three lockers, one per
/// mode), with an in-memory counter that loses updates without mutual exclusion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_exact_with_memory_backend() {
    let backend = MemoryBackend::new();
    let key = LockKey::from("hot");
    let lockers: Vec<Locker> = [Mode::Coalescing, Mode::Handoff, Mode::Naive]
        .into_iter()
        .map(|mode| {
            configure(Locker::builder(backend.clone()), mode)
                .build()
                .expect("valid locker settings")
        })
        .collect();
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));

    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for locker in &lockers {
        for _ in 0..COUNTER_TASKS {
            let (locker, key) = (locker.clone(), key.clone());
            let (counter, inside, tokens) = (counter.clone(), inside.clone(), tokens.clone());
            tasks.spawn(async move {
                for _ in 0..COUNTER_ITERATIONS {
                    let guard = locker.lock(&key).await.expect("lock within 60 s");
                    {
                        let _inside = Exclusive::enter(&inside);
                        tokens.lock().unwrap().push(guard.fencing_token());
                        let value = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        counter.store(value + 1, Ordering::SeqCst);
                    }
                    guard.release().await.expect("release a held lock");
                }
            });
        }
    }
    join_all(tasks).await;
    println!(
        "memory counter: {COUNTER_TOTAL} critical sections in {:?}",
        started.elapsed()
    );

    assert_eq!(
        counter.load(Ordering::SeqCst),
        COUNTER_TOTAL,
        "lost updates"
    );
    wait_idle(&lockers).await;
    assert!(backend.is_empty(), "a lock entry is left: {backend:?}");
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len() as u64, COUNTER_TOTAL);
    assert_strictly_increasing(&tokens);
}

// ---------------------------------------------------------------------------
// Fencing tokens across data loss
// ---------------------------------------------------------------------------

/// Critical sections of `lockers` (4 tasks each, `per_task` sections per task) on
/// `key`, each recording its fencing token under the lock.
async fn fenced_phase(
    lockers: &[Locker],
    key: &LockKey,
    tokens: &Arc<Mutex<Vec<FencingToken>>>,
    inside: &Arc<AtomicUsize>,
    per_task: usize,
) {
    let mut tasks = JoinSet::new();
    for locker in lockers {
        for _ in 0..4 {
            let (locker, key, tokens, inside) =
                (locker.clone(), key.clone(), tokens.clone(), inside.clone());
            tasks.spawn(async move {
                for _ in 0..per_task {
                    let guard = locker.lock(&key).await.expect("lock");
                    {
                        let _inside = Exclusive::enter(&inside);
                        tokens.lock().unwrap().push(guard.fencing_token());
                        tokio::task::yield_now().await;
                    }
                    guard.release().await.expect("release");
                }
            });
        }
    }
    join_all(tasks).await;
}

/// Fencing tokens strictly increase in acquisition order, also across a
/// `FLUSHALL` (the fence key is gone) and across a restart of a Redis without
/// persistence (everything is gone, the connections drop and reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_flushall_and_restart() {
    let server = RedisServer::start();
    let prefix = unique_prefix("fence");
    let key = LockKey::from("fenced");
    let a = backend_at(&server.url(), &prefix).await;
    let b = backend_at(&server.url(), &prefix).await;
    let lockers = vec![
        Locker::builder(a.clone())
            .wait_timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        Locker::builder(b.clone())
            .wait_timeout(Duration::from_secs(30))
            .handoff(Handoff::enabled())
            .build()
            .unwrap(),
    ];
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let inside = Arc::new(AtomicUsize::new(0));
    let per_task = 10;

    fenced_phase(&lockers, &key, &tokens, &inside, per_task).await;
    let before_flush = *tokens.lock().unwrap().last().unwrap();

    server.flushall().await;
    fenced_phase(&lockers, &key, &tokens, &inside, per_task).await;
    let before_restart = *tokens.lock().unwrap().last().unwrap();

    let subscriptions = (a.subscriptions(), b.subscriptions());
    server.restart();
    // lock() retries the transient errors of the dropped connections.
    fenced_phase(&lockers, &key, &tokens, &inside, per_task).await;

    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 3 * lockers.len() * 4 * per_task);
    assert_strictly_increasing(&tokens);
    assert!(
        tokens.iter().any(|t| t.seq > 0),
        "no handoff happened, so handoff sequences were not covered"
    );
    println!(
        "fencing: last before FLUSHALL {before_flush}, last before restart {before_restart}, last {}",
        tokens.last().unwrap()
    );

    // The notification subscriptions came back after the restart too.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let back = a.subscriptions() > subscriptions.0
                && b.subscriptions() > subscriptions.1
                && a.is_subscribed()
                && b.is_subscribed();
            async move { back }
        })
        .await,
        "the subscriptions were not re-established after the restart"
    );
    wait_idle(&lockers).await;
    let mut con = server.connection().await;
    assert!(!exists(&mut con, &a.lock_name(&key)).await);
}

// ---------------------------------------------------------------------------
// Wake-ups
// ---------------------------------------------------------------------------

/// A waiting instance is woken by the release (pub/sub), not by polling: with a
/// 30 s lease and a 1 s fallback timer, it holds the lock within a few ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_by_release() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("wakeup");
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
    let queue = queue_name(&waiter_backend, &key);
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
        let instance = waiter_backend.instance_id().to_owned();
        assert!(
            wait_until(Duration::from_secs(10), || {
                let (mut con, queue, instance) = (con.clone(), &queue, &instance);
                async move { hexists(&mut con, queue, instance).await }
            })
            .await,
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
    wait_idle(&[holder, waiter]).await;
}

/// With 8 instances waiting, each release wakes exactly one of them: one acquire
/// attempt per release, no thundering herd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_one_waiting_instance_not_all() {
    const WAITERS: usize = 8;
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("one-of-eight");
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
            async move { attempts.iter().all(|&n| n == 1) && hlen(&mut con, queue).await == 8 }
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
    wait_idle(&all).await;
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
            async move { hlen(&mut con, queue).await == WAITERS as i64 }
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
    let instance = backends[0].instance_id().to_owned();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (mut con, queue, instance) = (con.clone(), &queue, &instance);
            async move { hexists(&mut con, queue, instance).await }
        })
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

// ---------------------------------------------------------------------------
// A holder process killed with SIGKILL
// ---------------------------------------------------------------------------

const CHILD_ENV: &str = "LOCKFLIGHT_CHILD";
const CHILD_LEASE_TTL: Duration = Duration::from_secs(2);

/// Not a test: the child process of [`killed_holder_blocks_at_most_lease_ttl`]. It
/// takes the lock, prints `HELD <epoch>`, and waits to be killed.
#[tokio::test]
#[ignore = "child process of killed_holder_blocks_at_most_lease_ttl"]
async fn child_holder_process() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let backend = RedisBackend::builder(var("LOCKFLIGHT_CHILD_URL"))
        .prefix(var("LOCKFLIGHT_CHILD_PREFIX"))
        .connect()
        .await
        .expect("child: connect");
    let locker = Locker::builder(backend)
        .lease_ttl(CHILD_LEASE_TTL)
        .build()
        .expect("child: build");
    let guard = locker
        .lock(var("LOCKFLIGHT_CHILD_KEY"))
        .await
        .expect("child: lock");
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nHELD {}", guard.fencing_token().epoch).unwrap();
    out.flush().unwrap();
    drop(out);
    std::future::pending::<()>().await;
}

/// A holder whose process is killed (no release, no more renewals) blocks the
/// others for no longer than its lease TTL, and not shorter than the lock's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_blocks_at_most_lease_ttl() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("killed-holder");
    let key = "k";
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = tokio::process::Command::new(exe)
        .args([
            "--exact",
            "child_holder_process",
            "--nocapture",
            "--include-ignored",
        ])
        .env(CHILD_ENV, "1")
        .env("LOCKFLIGHT_CHILD_URL", server.url())
        .env("LOCKFLIGHT_CHILD_PREFIX", &prefix)
        .env("LOCKFLIGHT_CHILD_KEY", key)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the child holder");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let child_epoch: u64 = within(Duration::from_secs(30), "the child's HELD line", async {
        while let Some(line) = lines.next_line().await.expect("read the child's stdout") {
            if let Some(at) = line.find("HELD ") {
                return line[at + 5..].trim().parse().expect("HELD <epoch>");
            }
        }
        panic!("the child exited without holding the lock");
    })
    .await;

    let backend = backend_at(&server.url(), &prefix).await;
    let lock_name = backend.lock_name(&LockKey::from(key));
    let locker = Locker::builder(backend)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    assert!(
        locker.try_lock(key).await.unwrap().is_none(),
        "the child holds the lock"
    );
    let mut con = server.connection().await;

    child.kill().await.expect("SIGKILL the child");
    let killed = Instant::now();
    let left = pttl(&mut con, &lock_name).await;
    assert!(
        left > 0,
        "the lock key must still live after the kill: PTTL {left}"
    );
    let guard = locker
        .lock(key)
        .await
        .expect("the lock frees up at its TTL");
    let blocked = killed.elapsed();
    println!("killed holder blocked for {blocked:?} (PTTL at the kill: {left} ms)");
    assert!(
        blocked < CHILD_LEASE_TTL + Duration::from_secs(1),
        "a killed holder blocked others for {blocked:?}"
    );
    assert!(
        blocked + Duration::from_millis(50) >= Duration::from_millis(left as u64),
        "the lock was taken {blocked:?} after the kill, before its TTL of {left} ms ran out"
    );
    assert!(guard.fencing_token().epoch > child_epoch);
    guard.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// Renewal and loss
// ---------------------------------------------------------------------------

/// The watchdog keeps a critical section of 4 × the TTL alive and exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_long_critical_section_exclusive() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("renewal");
    let key = LockKey::from("k");
    let ttl = Duration::from_millis(300);
    let holder = Locker::builder(backend_at(&server.url(), &prefix).await)
        .lease_ttl(ttl)
        .build()
        .unwrap();
    let other = Locker::builder(backend_at(&server.url(), &prefix).await)
        .build()
        .unwrap();

    let guard = holder.lock(&key).await.unwrap();
    let started = Instant::now();
    let mut tries = 0;
    while started.elapsed() < 4 * ttl {
        assert!(
            other.try_lock(&key).await.unwrap().is_none(),
            "another instance got the lock after {:?} of a renewed lease",
            started.elapsed()
        );
        assert!(!guard.is_lost(), "lost after {:?}", started.elapsed());
        tries += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!guard.is_lost());
    let stats = holder.stats();
    assert!(stats.renewals >= 3, "{stats:?}");
    assert_eq!(stats.leases_lost, 0, "{stats:?}");
    guard.release().await.expect("the lease is still ours");
    println!(
        "renewal: {} renewals, {tries} failed try_locks",
        stats.renewals
    );
    wait_idle(&[holder, other]).await;
}

/// `try_lock` returns `None` while another instance (or another local task) holds
/// the lock, and `Some` once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_is_none_while_held() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("try-lock");
    let key = LockKey::from("k");
    let a = Locker::builder(backend_at(&server.url(), &prefix).await)
        .build()
        .unwrap();
    let b = Locker::builder(backend_at(&server.url(), &prefix).await)
        .build()
        .unwrap();

    let guard = a.try_lock(&key).await.unwrap().expect("a free lock");
    assert!(b.try_lock(&key).await.unwrap().is_none());
    assert!(a.try_lock(&key).await.unwrap().is_none(), "held locally");
    guard.release().await.unwrap();
    let guard = b.try_lock(&key).await.unwrap().expect("free again");
    assert!(a.try_lock(&key).await.unwrap().is_none());
    guard.release().await.unwrap();
    wait_idle(&[a, b]).await;
}

/// A lock key deleted or overwritten behind the holder's back is noticed at the
/// next renewal (within ttl/3 + 200 ms), and the release then reports the loss
/// without deleting the foreign value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_or_overwritten_lock_is_lost() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("loss");
    let ttl = Duration::from_millis(1500);
    let bound = ttl / 3 + Duration::from_millis(200);
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .build()
        .unwrap();
    let mut con = server.connection().await;

    // Deleted.
    let key = LockKey::from("deleted");
    let guard = locker.lock(&key).await.unwrap();
    redis::cmd("DEL")
        .arg(backend.lock_name(&key))
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let noticed = expect_loss(guard, bound, "DEL").await;
    println!("loss after DEL noticed after {noticed:?}");

    // Overwritten by another value (with a TTL, so it looks like another holder).
    let key = LockKey::from("overwritten");
    let name = backend.lock_name(&key);
    let guard = locker.lock(&key).await.unwrap();
    redis::cmd("SET")
        .arg(&name)
        .arg("someone-else")
        .arg("PX")
        .arg(30_000)
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let noticed = expect_loss(guard, bound, "SET").await;
    println!("loss after SET noticed after {noticed:?}");
    let value: Option<String> = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        value.as_deref(),
        Some("someone-else"),
        "the foreign value was deleted"
    );
    assert_eq!(locker.stats().leases_lost, 2);
    redis::cmd("DEL")
        .arg(&name)
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    wait_idle(&[locker]).await;
}

/// `with_lock` drops the user's future when the lease is lost and returns
/// `Error::LeaseLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_aborts_work_on_loss() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("with-lock-loss");
    let ttl = Duration::from_millis(1500);
    let key = LockKey::from("k");
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .build()
        .unwrap();

    let dropped = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let work = {
        let (locker, key) = (locker.clone(), key.clone());
        let (dropped, finished) = (dropped.clone(), finished.clone());
        tokio::spawn(async move {
            locker
                .with_lock(&key, move |info| async move {
                    let _flag = SetOnDrop(dropped);
                    started_tx.send(info).unwrap();
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    finished.store(true, Ordering::SeqCst);
                })
                .await
        })
    };
    let info = within(Duration::from_secs(10), "the work starts", started_rx)
        .await
        .unwrap();
    assert_eq!(info.key, key);
    let mut con = server.connection().await;
    redis::cmd("DEL")
        .arg(backend.lock_name(&key))
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let deleted = Instant::now();
    let result = within(Duration::from_secs(5), "with_lock", work)
        .await
        .unwrap();
    let noticed = deleted.elapsed();
    assert!(
        matches!(result, Err(Error::LeaseLost { .. })),
        "with_lock after loss: {result:?}"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the work's future was not dropped"
    );
    assert!(!finished.load(Ordering::SeqCst), "the work ran to its end");
    assert!(
        noticed <= ttl / 3 + Duration::from_millis(200),
        "{noticed:?}"
    );
    wait_idle(&[locker]).await;
}

/// A paused (unresponsive) Redis cannot renew the lease: loss is signalled no
/// later than (about) the end of the lease's validity, never a holder that
/// believes it still holds an expired lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_ends_in_loss_by_valid_until() {
    let server = RedisServer::start();
    let prefix = unique_prefix("paused");
    let key = LockKey::from("k");
    let ttl = Duration::from_secs(1);
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .build()
        .unwrap();

    let guard = locker.lock(&key).await.unwrap();
    // Let a renewal or two happen first.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!guard.is_lost());
    server.pause();
    // A reply sent before the pause has arrived by now; no later one can.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let valid_for = guard.valid_for();
    let valid_until = Instant::now() + valid_for;
    assert!(!guard.is_lost(), "lost while still valid for {valid_for:?}");
    within(
        valid_for + Duration::from_secs(3),
        "lost() while paused",
        guard.lost(),
    )
    .await;
    let lost_at = Instant::now();
    assert!(guard.is_lost());
    assert!(guard.valid_for().is_zero());
    let late = lost_at.saturating_duration_since(valid_until);
    println!(
        "paused redis: loss signalled {late:?} after valid_until (valid for {valid_for:?} at pause)"
    );
    assert!(
        late <= Duration::from_millis(300),
        "loss signalled {late:?} after the lease's validity ended"
    );
    server.resume();

    // Whatever the release finds, the lock is usable again afterwards.
    let _ = within(Duration::from_secs(10), "release", guard.release()).await;
    let other = Locker::builder(backend_at(&server.url(), &prefix).await)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    other.lock(&key).await.unwrap().release().await.unwrap();
    assert_eq!(locker.stats().leases_lost, 1);
}

// ---------------------------------------------------------------------------
// Releases that are not ours
// ---------------------------------------------------------------------------

/// Release with a foreign token deletes nothing and says so, both through the
/// `LockBackend` trait and through a guard whose key was taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_foreign_token_deletes_nothing() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("foreign-token");
    let key = LockKey::from("k");
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone()).build().unwrap();
    let name = backend.lock_name(&key);
    let mut con = server.connection().await;

    // Directly through the trait.
    let guard = locker.lock(&key).await.unwrap();
    let stranger = LeaseToken::random();
    let released = backend.release(&key, stranger).await.unwrap();
    assert!(!released.released, "a foreign token released the lock");
    assert!(exists(&mut con, &name).await, "the lock key was deleted");
    assert_eq!(
        backend
            .extend(&key, stranger, Duration::from_secs(1))
            .await
            .unwrap(),
        Extend::NotOwner
    );
    assert!(matches!(
        backend
            .acquire(&key, stranger, Duration::from_secs(1), false)
            .await
            .unwrap(),
        Acquire::Busy { .. }
    ));
    assert!(pttl(&mut con, &name).await > 1000, "the TTL was touched");
    guard.release().await.expect("still ours");
    assert!(!exists(&mut con, &name).await);

    // Through a guard whose lock was overwritten behind its back.
    let guard = locker.lock(&key).await.unwrap();
    redis::cmd("SET")
        .arg(&name)
        .arg("foreign")
        .arg("PX")
        .arg(30_000)
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    match guard.release().await {
        Err(Error::LeaseLost { key: k, phase, .. }) => {
            assert_eq!(k, key);
            assert_eq!(phase, Phase::Releasing);
        }
        other => panic!("release of an overwritten lock: {other:?}"),
    }
    let value: Option<String> = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some("foreign"));
    redis::cmd("DEL")
        .arg(&name)
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    wait_idle(&[locker]).await;
}

// ---------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_keys_are_rejected() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("bad-key");
    let locker = Locker::builder(backend_at(&server.url(), &prefix).await)
        .build()
        .unwrap();

    let check = |what: &str, result: Result<(), Error>, needle: &str| match result {
        Err(e @ Error::InvalidKey { .. }) => {
            assert!(e.to_string().contains(needle), "{what}: {e}");
        }
        other => panic!("{what}: expected InvalidKey, got {other:?}"),
    };
    check("lock(\"\")", locker.lock("").await.map(drop), "empty");
    check(
        "try_lock(\"\")",
        locker.try_lock("").await.map(drop),
        "empty",
    );
    check(
        "with_lock(\"\")",
        locker.with_lock("", |_| async {}).await,
        "empty",
    );
    check(
        "coalesce(\"\")",
        locker.coalesce("", || async { 1u8 }).await.map(drop),
        "empty",
    );
    let long = vec![b'x'; MAX_KEY_LEN + 1];
    check(
        "lock(oversized)",
        locker.lock(long.clone()).await.map(drop),
        "limit",
    );
    check(
        "try_lock(oversized)",
        locker.try_lock(long).await.map(drop),
        "limit",
    );
    // The longest allowed key, and a binary one, work.
    locker
        .lock(vec![b'x'; MAX_KEY_LEN])
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locker
        .lock(&b"\x00\xff{}%"[..])
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    wait_idle(&[locker]).await;
}

#[tokio::test]
async fn invalid_settings_are_rejected() {
    let config_error = |what: &str, result: lockflight::Result<Locker>, needle: &str| match result {
        Err(e @ Error::InvalidConfig { .. }) => {
            assert!(e.to_string().contains(needle), "{what}: {e}");
        }
        other => panic!("{what}: expected InvalidConfig, got {other:?}"),
    };
    let builder = || Locker::builder(MemoryBackend::new());
    config_error(
        "zero lease_ttl",
        builder().lease_ttl(Duration::ZERO).build(),
        "lease_ttl",
    );
    config_error(
        "tiny lease_ttl",
        builder().lease_ttl(Duration::from_millis(99)).build(),
        "lease_ttl",
    );
    config_error(
        "zero wait_timeout",
        builder().wait_timeout(Duration::ZERO).build(),
        "wait_timeout",
    );
    config_error(
        "renew_every >= ttl",
        builder()
            .lease_ttl(Duration::from_secs(1))
            .renew_every(Duration::from_secs(1))
            .build(),
        "renew_every",
    );
    config_error(
        "zero renew_every",
        builder().renew_every(Duration::ZERO).build(),
        "renew_every",
    );
    config_error(
        "zero max_waiters",
        builder().max_waiters(0).build(),
        "max_waiters",
    );
    config_error(
        "zero handoff budget",
        builder()
            .handoff(Handoff::enabled().max_consecutive(0))
            .build(),
        "handoff",
    );
    builder()
        .lease_ttl(LockerBuilder::MIN_LEASE_TTL)
        .build()
        .expect("the minimum TTL is allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_prefixes_and_unreachable_servers_fail_cleanly() {
    let connect_error =
        |what: &str, result: lockflight::Result<RedisBackend>, needle: &str| match result {
            Err(e @ Error::InvalidConfig { .. }) => {
                assert!(e.to_string().contains(needle), "{what}: {e}")
            }
            other => panic!("{what}: expected InvalidConfig, got {other:?}"),
        };
    let limit = Duration::from_secs(10);
    connect_error(
        "malformed url",
        within(limit, "connect", RedisBackend::connect("not a url at all")).await,
        "redis url",
    );
    connect_error(
        "wrong scheme",
        within(
            limit,
            "connect",
            RedisBackend::connect("http://127.0.0.1:6379"),
        )
        .await,
        "redis url",
    );
    let url = shared().url();
    for prefix in ["", "a{b", "a}b"] {
        connect_error(
            &format!("prefix {prefix:?}"),
            within(
                limit,
                "connect",
                RedisBackend::builder(&url).prefix(prefix).connect(),
            )
            .await,
            "prefix",
        );
    }

    let started = Instant::now();
    let result = within(
        limit,
        "connect to a closed port",
        RedisBackend::connect("redis://127.0.0.1:1"),
    )
    .await;
    match result {
        Err(Error::Connect { target, .. }) => assert!(target.contains("127.0.0.1"), "{target}"),
        other => panic!("unreachable server: expected Connect, got {other:?}"),
    }
    println!("unreachable server reported after {:?}", started.elapsed());
}

/// A lock key holding a value lockflight did not write is reported as
/// `ForeignValue` at once (not a timeout), and never overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_at_the_lock_key_are_reported() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("foreign-value");
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut con = server.connection().await;

    let expect_foreign = |what: &str, result: Result<(), Error>, started: Instant| {
        match result {
            Err(Error::ForeignValue { phase, .. }) => assert_eq!(phase, Phase::Acquiring),
            other => panic!("{what}: expected ForeignValue, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{what}: took {:?}",
            started.elapsed()
        );
    };

    // A list at the lock key.
    let key = LockKey::from("list");
    let name = backend.lock_name(&key);
    redis::cmd("LPUSH")
        .arg(&name)
        .arg("item")
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let started = Instant::now();
    expect_foreign("lock on a list", locker.lock(&key).await.map(drop), started);
    let started = Instant::now();
    expect_foreign(
        "try_lock on a list",
        locker.try_lock(&key).await.map(drop),
        started,
    );
    let len: i64 = redis::cmd("LLEN")
        .arg(&name)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(len, 1, "the list was modified");

    // A string without a TTL.
    let key = LockKey::from("no-ttl");
    let name = backend.lock_name(&key);
    redis::cmd("SET")
        .arg(&name)
        .arg("mine")
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let started = Instant::now();
    expect_foreign(
        "lock on a string without TTL",
        locker.lock(&key).await.map(drop),
        started,
    );
    let value: Option<String> = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some("mine"));
    assert_eq!(pttl(&mut con, &name).await, -1, "a TTL was added");

    // Also for `with_lock`, and no slot is left behind.
    let started = Instant::now();
    expect_foreign(
        "with_lock on a string without TTL",
        locker.with_lock(&key, |_| async {}).await,
        started,
    );
    assert_eq!(locker.stats().timeouts, 0);
    wait_idle(&[locker]).await;
}

// ---------------------------------------------------------------------------
// Cancel safety
// ---------------------------------------------------------------------------

/// 200 tasks on one key over three lockers (coalescing, handoff, naive); half of
/// them are cancelled at random points (timeouts and aborts, while waiting, while
/// acquiring, inside the critical section). The others all complete; afterwards
/// nothing is left: no slot, no lock key, no key without a TTL, and the lock is
/// free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_lock_calls_leave_nothing_behind() {
    const TASKS: u64 = 200;
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("cancel");
    let key = LockKey::from("k");
    let mut backends = Vec::new();
    let mut lockers = Vec::new();
    for mode in [Mode::Coalescing, Mode::Handoff, Mode::Naive] {
        let backend = backend_at(&server.url(), &prefix).await;
        lockers.push(
            configure(Locker::builder(backend.clone()), mode)
                .build()
                .unwrap(),
        );
        backends.push(backend);
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicU64::new(0));

    let mut must_finish = JoinSet::new();
    let mut cancellable = JoinSet::new();
    let mut aborters = JoinSet::new();
    for i in 0..TASKS {
        let locker = lockers[(i % 3) as usize].clone();
        let (key, inside, completed) = (key.clone(), inside.clone(), completed.clone());
        let mut rng = XorShift::new(i + 1);
        let start_in = Duration::from_micros(rng.below(20_000));
        let hold = Duration::from_micros(rng.below(2_000));
        let body = async move {
            tokio::time::sleep(start_in).await;
            let guard = locker.lock(&key).await.expect("lock within 60 s");
            let _inside = Exclusive::enter(&inside);
            tokio::task::yield_now().await;
            tokio::time::sleep(hold).await;
            drop(_inside);
            guard.release().await.expect("release");
            completed.fetch_add(1, Ordering::SeqCst);
        };
        let cancel_after = Duration::from_micros(rng.below(60_000));
        match i % 4 {
            0 | 2 => {
                must_finish.spawn(body);
            }
            1 => {
                cancellable.spawn(async move {
                    let _ = tokio::time::timeout(cancel_after, body).await;
                });
            }
            _ => {
                let handle = cancellable.spawn(body);
                aborters.spawn(async move {
                    tokio::time::sleep(cancel_after).await;
                    handle.abort();
                });
            }
        }
    }
    join_all(must_finish).await;
    join_all(aborters).await;
    while let Some(joined) = cancellable.join_next().await {
        if let Err(e) = joined
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let completed = completed.load(Ordering::SeqCst);
    assert!(completed >= TASKS / 2, "only {completed} completed");
    println!("cancel safety: {completed} of {TASKS} tasks completed");

    wait_idle(&lockers).await;
    let mut con = server.connection().await;
    let lock_name = backends[0].lock_name(&key);
    assert!(
        wait_until(Duration::from_secs(5), || {
            let (mut con, lock_name) = (con.clone(), &lock_name);
            async move { !exists(&mut con, lock_name).await }
        })
        .await,
        "a lock key is left behind (PTTL {})",
        pttl(&mut con, &lock_name).await
    );
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut con)
        .await
        .unwrap();
    for name in &keys {
        // -2: it expired since KEYS; -1 would be a key that never expires.
        let left = pttl(&mut con, name).await;
        assert_ne!(
            left,
            -1,
            "{} has no TTL: it would never go away",
            String::from_utf8_lossy(name)
        );
    }
    let claim = {
        let mut name = lock_name.clone();
        name.extend_from_slice(b":claim");
        name
    };
    for locker in &lockers {
        // A release gives the head of the Redis queue a short claim window (at most
        // claim_ttl); let any such hand-over settle, then the lock is free at once.
        assert!(
            wait_until(Duration::from_secs(2), || {
                let (mut con, claim) = (con.clone(), &claim);
                async move { !exists(&mut con, claim).await }
            })
            .await,
            "a claim on the lock outlived claim_ttl"
        );
        let guard = locker
            .try_lock(&key)
            .await
            .unwrap()
            .expect("the lock is free at once after all tasks ended");
        guard.release().await.unwrap();
        let stats = locker.stats();
        assert_eq!(stats.leases_lost, 0, "{stats:?}");
    }
    wait_idle(&lockers).await;
}

// ---------------------------------------------------------------------------
// Cost
// ---------------------------------------------------------------------------

/// An uncontended lock + release costs exactly two Redis commands (two EVALSHA
/// round trips), and so does an uncontended try_lock + release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_lock_and_release_cost_two_round_trips() {
    let server = shared();
    let _log = server.log_on_panic();
    let proxy = CountingProxy::start(server).await;
    let prefix = unique_prefix("round-trips");
    let key = LockKey::from("k");
    let backend = backend_at(&proxy.url(), &prefix).await;
    let locker = Locker::builder(backend).build().unwrap();

    // Loads the scripts (NOSCRIPT, SCRIPT LOAD) once.
    locker.lock(&key).await.unwrap().release().await.unwrap();
    proxy.reset();
    const ROUNDS: u64 = 10;
    for round in 0..ROUNDS {
        let before = proxy.commands();
        let guard = locker.lock(&key).await.unwrap();
        let after_lock = proxy.commands();
        guard.release().await.unwrap();
        let after_release = proxy.commands();
        assert_eq!(
            (after_lock - before, after_release - after_lock),
            (1, 1),
            "round {round}: lock and release should be one command each"
        );
    }
    for round in 0..ROUNDS {
        let before = proxy.commands();
        let guard = locker.try_lock(&key).await.unwrap().expect("free");
        guard.release().await.unwrap();
        assert_eq!(proxy.commands() - before, 2, "try_lock round {round}");
    }
    println!(
        "uncontended: {} commands for {ROUNDS} lock+release and {ROUNDS} try_lock+release",
        proxy.commands()
    );
    assert_eq!(proxy.commands(), 4 * ROUNDS);
}

// ---------------------------------------------------------------------------
// Regressions of fixed defects
// ---------------------------------------------------------------------------

/// Regression (src/locker.rs, `Shared::lead`): a leader cancelled while its
/// *first* acquire is in flight must leave the Redis queue.
///
/// `lead` used to set `leading.lead.queued = true` only after a `Busy` reply, so when the
/// future is dropped (timeout, abort) while the first acquire-or-enqueue is on the
/// wire, `Leading::drop` → `Shared::cleanup` releases the token but never calls
/// `leave`, although the script did enqueue this instance. The stale entry lives
/// for `queue_entry_ttl`: it inflates the `waiting` count other holders see
/// (halving their handoff budget), and the next release hands this instance a
/// claim it does not want (an extra hop, or a `claim_ttl` stall if its
/// subscription is down). `Locker::lock`'s docs promise that a dropped leader
/// "leaves the backend queue in the background when nobody waits".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cancelled_during_first_acquire_leaves_the_queue() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("cancel-first-acquire");
    let key = LockKey::from("k");
    let holder = Locker::builder(backend_at(&server.url(), &prefix).await)
        .build()
        .unwrap();
    let held = holder.lock(&key).await.unwrap();

    // The waiter talks to Redis through a slow proxy, so its acquire is still on
    // the wire when the caller gives up. Long queue entries make a stale entry
    // obvious.
    let proxy = CountingProxy::start(server).await;
    let backend = subscribed(
        RedisBackend::builder(proxy.url())
            .prefix(&prefix)
            .queue_entry_ttl(Duration::from_secs(30))
            .connect()
            .await
            .unwrap(),
    )
    .await;
    let waiter = Locker::builder(backend.clone()).build().unwrap();
    proxy.set_delay(Duration::from_millis(300));
    let cancelled = tokio::time::timeout(Duration::from_millis(100), waiter.lock(&key)).await;
    assert!(
        cancelled.is_err(),
        "the lock is held: lock() cannot succeed"
    );

    let mut con = server.connection().await;
    let queue = queue_name(&backend, &key);
    let instance = backend.instance_id().to_owned();
    // The acquire landed after the cancellation and queued this instance...
    assert!(
        wait_until(Duration::from_secs(5), || {
            let (mut con, queue, instance) = (con.clone(), &queue, &instance);
            async move { hexists(&mut con, queue, instance).await }
        })
        .await,
        "the in-flight acquire never reached Redis"
    );
    // ...and nobody of this instance waits any more, so it must leave the queue.
    let left = wait_until(Duration::from_secs(3), || {
        let (mut con, queue, instance) = (con.clone(), &queue, &instance);
        async move { !hexists(&mut con, queue, instance).await }
    })
    .await;
    assert_eq!(waiter.active_keys(), 0);
    held.release().await.unwrap();
    assert!(
        left,
        "a leader cancelled during its first acquire left a stale entry in the Redis \
         queue (it lives for queue_entry_ttl); PTTL of the queue: {} ms",
        pttl(&mut con, &queue).await
    );
}

/// Regression (src/lease/mod.rs, `Lease::remaining`, used by
/// `LockGuard::valid_for`): once the backend had said the lock is no longer ours,
/// `valid_for()` still reported the time left until the old `valid_until` (about `ttl - ttl/3`), so
/// code that checks `guard.valid_for() > margin` before a write believes it
/// still holds the lock while `is_lost()` is true. A lost lease is known to be
/// invalid: `valid_for()` should be zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_guard_has_no_validity_left() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("lost-validity");
    let key = LockKey::from("k");
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let guard = locker.lock(&key).await.unwrap();
    let mut con = server.connection().await;
    redis::cmd("DEL")
        .arg(backend.lock_name(&key))
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    within(Duration::from_secs(3), "lost() after DEL", guard.lost()).await;
    assert!(guard.is_lost());
    let left = guard.valid_for();
    drop(guard);
    assert_eq!(
        left,
        Duration::ZERO,
        "a lost guard still claims {left:?} of validity"
    );
}
