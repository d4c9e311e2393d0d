//! Mutual exclusion: the hot-key read-modify-write counter.

use super::*;

const COUNTER_LOCKERS: usize = 3;
const COUNTER_TASKS: usize = 40;
const COUNTER_ITERATIONS: usize = 25;
const COUNTER_TOTAL: u64 = (COUNTER_LOCKERS * COUNTER_TASKS * COUNTER_ITERATIONS) as u64;

/// 3 lockers (each with its own backend: three "processes") × 40 tasks × 25
/// critical sections that GET a counter, yield, and SET it + 1 on another
/// connection. Any lost update is a mutual-exclusion failure.
async fn redis_counter(mode: Mode) {
    let (server, _log, prefix) = shared_scene(&format!("counter-{mode:?}"));
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
                        increment(&mut data, counter.as_bytes(), tokio::task::yield_now()).await;
                    }
                    guard.release().await.expect("release a held lock");
                }
            });
        }
    }
    join_all(tasks).await;
    let elapsed = started.elapsed();

    let mut con = server.connection().await;
    let value = counter_value(&mut con, counter.as_bytes()).await;
    assert_eq!(
        value, COUNTER_TOTAL,
        "lost updates: mutual exclusion failed"
    );

    wait_idle(&lockers, IDLE).await;
    let lock_name = testkit::names::lock(&prefix, &key);
    assert!(
        !exists(&mut con, &lock_name).await,
        "the lock key is left in Redis after every task released"
    );

    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len() as u64, COUNTER_TOTAL);
    assert_strictly_increasing(&tokens, "tokens");

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
    wait_idle(&lockers, IDLE).await;
    assert!(backend.is_empty(), "a lock entry is left: {backend:?}");
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len() as u64, COUNTER_TOTAL);
    assert_strictly_increasing(&tokens, "tokens");
}
