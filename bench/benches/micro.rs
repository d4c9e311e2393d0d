//! In-process micro benchmarks (criterion): the cost of lockflight's own machinery,
//! without Redis.
//!
//! `cargo bench -p bench --bench micro` (add `-- --quick` for a faster, rougher run, or a
//! filter such as `-- uncontended`).
//!
//! * `uncontended/*`: one lock + release per iteration on a current-thread runtime.
//!   Every variant ends its iteration with `tokio::task::yield_now()`, so any
//!   background work a release leaves (a dropped guard's release task) runs inside
//!   the measurement, as it would in a service; `yield_now` alone is measured as the
//!   baseline. Slot-map + lease overhead = `locker_*` − `memory_backend_trait`.
//! * `coalesce/*`: uncontended `Locker::coalesce` and `with_lock` on `MemoryBackend`.
//! * `fencing/*`: `FencingToken` comparison and sorting.
//! * `key/*`: `lockflight_routing::key_hash` (the same XXH3-64 lockflight gives
//!   keys), `LockKey::from`, and the SipHash (`RandomState`) hashing and lookup that
//!   the slot map (a `DashMap<LockKey, _>`) does per call.
//!
//! Before the benchmarks, 1,000,000 distinct keys are locked and released once and
//! the slot map must be empty afterwards (a `cargo bench` run only).
//!
//! For profiling, `LOCKFLIGHT_MICRO_PROFILE=<n>` runs only `n` uncontended lock +
//! release pairs (coalescing locker; `LOCKFLIGHT_MICRO_PROFILE_LOCKER=naive` or
//! `handoff` for the others; with `LOCKFLIGHT_MICRO_PROFILE_BASELINE=1`, as many bare
//! `MemoryBackend` acquire + release pairs instead) and exits, e.g. under
//! `valgrind --tool=callgrind`.

use std::hash::BuildHasher;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use dashmap::DashMap;
use lockflight::backend::{LeaseToken, WhenBusy};
use lockflight::{
    Contention, FencingToken, Handoff, LockKey, Locker, MemoryBackend, backend::LockBackend,
};
use lockflight_routing::key_hash;
use tokio::runtime::Runtime;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn locker(coalescing: bool, handoff: bool) -> Locker {
    Locker::builder(MemoryBackend::new())
        .wait_timeout(Duration::from_secs(60))
        .contention(if coalescing {
            Contention::Coalesced
        } else {
            Contention::PerTask
        })
        .handoff(if handoff {
            Handoff::enabled()
        } else {
            Handoff::disabled()
        })
        .build()
        .expect("valid settings")
}

/// Runs `$body` (an async block's statements) `iters` times in one `block_on`,
/// yielding once per iteration, and returns the elapsed time.
macro_rules! timed {
    ($rt:expr, $iters:expr, $body:block) => {{
        let iters = $iters;
        $rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                $body
                tokio::task::yield_now().await;
            }
            start.elapsed()
        })
    }};
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let key = LockKey::from("sku:555");
    let mut g = c.benchmark_group("uncontended");

    g.bench_function("yield_now (baseline)", |b| {
        b.iter_custom(|iters| timed!(rt, iters, {}))
    });

    let mutex = tokio::sync::Mutex::new(0u64);
    g.bench_function("tokio_mutex lock+unlock", |b| {
        b.iter_custom(|iters| {
            timed!(rt, iters, {
                *mutex.lock().await += 1;
            })
        })
    });

    let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let ttl = Duration::from_secs(30);
    g.bench_function("memory_backend_trait acquire+release", |b| {
        b.iter_custom(|iters| {
            timed!(rt, iters, {
                let token = LeaseToken::random();
                let r = backend
                    .acquire(&key, token, ttl, WhenBusy::Queue)
                    .await
                    .unwrap();
                black_box(r);
                let r = backend.release(&key, token).await.unwrap();
                black_box(r);
            })
        })
    });

    for (name, coalescing, handoff) in [
        ("locker_coalesced lock+release", true, false),
        ("locker_handoff lock+release", true, true),
        ("locker_naive lock+release", false, false),
    ] {
        let l = locker(coalescing, handoff);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed!(rt, iters, {
                    let guard = l.lock(&key).await.unwrap();
                    black_box(guard.fencing_token());
                    guard.release().await.unwrap();
                })
            })
        });
        assert_eq!(l.stats().keys_in_use, 0, "{name}: slot map not empty");
    }

    let l = locker(true, false);
    g.bench_function("locker_coalesced lock(&str)+drop", |b| {
        b.iter_custom(|iters| {
            timed!(rt, iters, {
                let guard = l.lock("sku:555").await.unwrap();
                drop(black_box(guard));
            })
        })
    });
    g.finish();
}

fn coalesce(c: &mut Criterion) {
    let rt = runtime();
    let key = LockKey::from("user:7");
    let l = locker(true, false);
    let mut g = c.benchmark_group("coalesce");
    g.bench_function("coalesce uncontended", |b| {
        b.iter_custom(|iters| {
            timed!(rt, iters, {
                let v = l.singleflight(&key, || async { 7u64 }).await.unwrap();
                black_box(v);
            })
        })
    });
    g.bench_function("with_lock uncontended", |b| {
        b.iter_custom(|iters| {
            timed!(rt, iters, {
                let v = l.with_lock(&key, |_| async { 7u64 }).await.unwrap();
                black_box(v);
            })
        })
    });
    g.finish();
}

fn tokens(n: usize) -> Vec<FencingToken> {
    // Deterministic shuffle: epochs of a few leases, handoff sequences within.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            FencingToken::new(1_700_000_000_000_000 + (x >> 58), (x >> 20) & 0xff)
        })
        .collect()
}

fn fencing(c: &mut Criterion) {
    let toks = tokens(1024);
    let mut g = c.benchmark_group("fencing");
    let mut i = 0;
    g.bench_function("compare", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            black_box(black_box(toks[i]) < black_box(toks[(i + 1) & 1023]))
        })
    });
    g.bench_function("sort 1024", |b| {
        b.iter_batched(
            || toks.clone(),
            |mut v| {
                v.sort_unstable();
                v
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn keys(c: &mut Criterion) {
    let names: Vec<String> = (0..1024).map(|i| format!("sku:{:06}", i * 7919)).collect();
    let lock_keys: Vec<LockKey> = names.iter().map(LockKey::from).collect();
    let long = "tenant:4711/warehouse:eu-central-1/sku:0000555/reservation:9".to_owned();
    let mut g = c.benchmark_group("key");
    let mut i = 0;
    g.bench_function("key_hash 10 B", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            key_hash(black_box(names[i].as_bytes()))
        })
    });
    g.bench_function("key_hash 60 B", |b| {
        b.iter(|| key_hash(black_box(long.as_bytes())))
    });
    g.bench_function("LockKey::from(&str) 10 B", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            LockKey::from(black_box(names[i].as_str()))
        })
    });
    g.bench_function("LockKey clone", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            black_box(&lock_keys[i]).clone()
        })
    });
    let state = std::collections::hash_map::RandomState::new();
    g.bench_function("RandomState hash_one(LockKey) 10 B", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            state.hash_one(black_box(&lock_keys[i]))
        })
    });
    let map: DashMap<LockKey, u64> = lock_keys
        .iter()
        .enumerate()
        .map(|(n, k)| (k.clone(), n as u64))
        .collect();
    g.bench_function("DashMap<LockKey,_> get hit (1024 keys)", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            *map.get(black_box(&lock_keys[i])).unwrap()
        })
    });
    g.finish();
}

/// DESIGN.md: "1,000,000 distinct keys leave an empty map afterwards".
fn million_keys_leave_an_empty_map() {
    let n = if std::env::args().any(|a| a == "--bench") {
        1_000_000
    } else {
        10_000
    };
    let rt = runtime();
    let backend = MemoryBackend::new();
    let l = Locker::builder(backend.clone())
        .build()
        .expect("valid settings");
    let keys: Vec<LockKey> = (0..n).map(|i| LockKey::from(format!("k{i}"))).collect();
    let took = rt.block_on(async {
        let start = Instant::now();
        for (i, k) in keys.iter().enumerate() {
            l.lock(k).await.unwrap().release().await.unwrap();
            if i % 64 == 0 {
                tokio::task::yield_now().await;
            }
        }
        // Let any background work left by the last releases finish.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        start.elapsed()
    });
    assert_eq!(
        l.stats().keys_in_use,
        0,
        "slot map not empty after {n} keys"
    );
    assert!(
        backend.is_empty(),
        "memory backend not empty after {n} keys"
    );
    println!(
        "{n} distinct keys locked + released: {:?} ({:.0} ns per key); slot map and backend empty afterwards",
        took,
        took.as_nanos() as f64 / n as f64
    );
}

/// `LOCKFLIGHT_MICRO_PROFILE=<n>`: a fixed amount of work for a profiler.
fn profile_only() -> bool {
    let Some(n) = std::env::var("LOCKFLIGHT_MICRO_PROFILE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return false;
    };
    let baseline = std::env::var_os("LOCKFLIGHT_MICRO_PROFILE_BASELINE").is_some();
    let rt = runtime();
    let key = LockKey::from("sku:555");
    let l = match std::env::var("LOCKFLIGHT_MICRO_PROFILE_LOCKER").as_deref() {
        Ok("naive") => locker(false, false),
        Ok("handoff") => locker(true, true),
        _ => locker(true, false),
    };
    let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let ttl = Duration::from_secs(30);
    let took = if baseline {
        timed!(rt, n, {
            let token = LeaseToken::random();
            black_box(
                backend
                    .acquire(&key, token, ttl, WhenBusy::Queue)
                    .await
                    .unwrap(),
            );
            black_box(backend.release(&key, token).await.unwrap());
        })
    } else {
        timed!(rt, n, {
            let guard = l.lock(&key).await.unwrap();
            black_box(guard.fencing_token());
            guard.release().await.unwrap();
        })
    };
    println!(
        "{n} {} pairs: {took:?} ({:.0} ns each)",
        if baseline { "backend" } else { "locker" },
        took.as_nanos() as f64 / n as f64
    );
    true
}

fn all(c: &mut Criterion) {
    if profile_only() {
        return;
    }
    million_keys_leave_an_empty_map();
    uncontended(c);
    coalesce(c);
    fencing(c);
    keys(c);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = all
}
criterion_main!(benches);
