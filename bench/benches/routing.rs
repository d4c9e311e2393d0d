//! Lookup cost per routing method.
//!
//! `cargo bench -p bench --bench routing` (add `-- --quick` for a fast, rougher run).

use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use futures::FutureExt;
use lockflight::LockKey;
use lockflight_routing::{HashRing, KeyRouter, Rendezvous, jump_bucket, jump_hash, key_hash};
use tower::{Service, service_fn};

/// Keys shaped like real lock keys ("sku:123456", 10 bytes).
fn keys() -> Vec<String> {
    (0..1024).map(|i| format!("sku:{:06}", i * 7919)).collect()
}

fn node_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("instance-{i}.lockflight.svc"))
        .collect()
}

/// Runs `f` on a different key each iteration.
fn each_key<T>(keys: &[String], mut f: impl FnMut(&[u8]) -> T) -> impl FnMut() -> T {
    let mut i = 0;
    move || {
        i = (i + 1) & 1023;
        f(black_box(keys[i].as_bytes()))
    }
}

fn bench(c: &mut Criterion) {
    let keys = keys();

    c.bench_function("key_hash", |b| b.iter(each_key(&keys, key_hash)));

    let mut g = c.benchmark_group("jump");
    for n in [10u32, 1000] {
        let buckets = NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
        let hashes: Vec<u64> = keys.iter().map(|k| key_hash(k.as_bytes())).collect();
        let mut i = 0;
        g.bench_with_input(BenchmarkId::new("jump_hash", n), &n, |b, _| {
            b.iter(|| {
                i = (i + 1) & 1023;
                jump_hash(black_box(hashes[i]), buckets)
            })
        });
        g.bench_with_input(BenchmarkId::new("jump_bucket", n), &n, |b, &n| {
            b.iter(each_key(&keys, |k| jump_bucket(k, n)))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("rendezvous");
    for n in [3usize, 10, 100] {
        let mut uniform = Rendezvous::new();
        let mut weighted = Rendezvous::new();
        for (i, name) in node_names(n).into_iter().enumerate() {
            let _ = uniform.add(name.clone(), 1.0);
            let _ = weighted.add(name, 1.0 + (i % 3) as f64);
        }
        g.bench_with_input(BenchmarkId::new("pick", n), &n, |b, _| {
            b.iter(each_key(&keys, |k| uniform.pick(k).map(String::len)))
        });
        g.bench_with_input(BenchmarkId::new("pick_weighted", n), &n, |b, _| {
            b.iter(each_key(&keys, |k| weighted.pick(k).map(String::len)))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("ring");
    for n in [10usize, 100] {
        let mut ring = HashRing::new(160);
        for name in node_names(n) {
            ring.add(name);
        }
        g.bench_with_input(BenchmarkId::new("pick_160vn", n), &n, |b, _| {
            b.iter(each_key(&keys, |k| ring.pick(k).map(String::len)))
        });

        // Bounded loads: one assign + release of a fresh key while 1,000 keys are held.
        let mut bounded = HashRing::new(160);
        for name in node_names(n) {
            bounded.add(name);
        }
        let Ok(mut bounded) = bounded.with_bounded_loads(1.25) else {
            continue;
        };
        for i in 0..1000 {
            bounded.assign(format!("held:{i}"));
        }
        g.bench_with_input(
            BenchmarkId::new("assign_release_bounded_1.25", n),
            &n,
            |b, _| {
                b.iter(each_key(&keys, |k| {
                    let len = bounded.assign(k).map(String::len);
                    bounded.release(k);
                    len
                }))
            },
        );
    }
    g.finish();

    // The whole tower path: extract, route, clone the member, ready + call it.
    let mut g = c.benchmark_group("key_router");
    for n in [3usize, 10] {
        let mut router = KeyRouter::new(|req: &LockKey| Some(req.clone()));
        for name in node_names(n) {
            router.handle().add(
                name,
                service_fn(|_req: LockKey| async { Ok::<_, std::convert::Infallible>(()) }),
            );
        }
        let lock_keys: Vec<LockKey> = keys.iter().map(LockKey::from).collect();
        let mut i = 0;
        g.bench_with_input(BenchmarkId::new("call", n), &n, |b, _| {
            b.iter(|| {
                i = (i + 1) & 1023;
                router.call(black_box(lock_keys[i].clone())).now_or_never()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
