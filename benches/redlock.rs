//! Redlock benchmark: [`RedlockBackend`] over 3 and 5 local nodes against the
//! single-node [`RedisBackend`], on the hot-key read-modify-write workload.
//!
//! ```text
//! cargo bench --bench redlock                          # P = 4, T = 64, 3 s per point
//! LOCKFLIGHT_BENCH_SECS=5 cargo bench --bench redlock
//! ```
//!
//! P instances (each its own backend: its own connections, instance ids and
//! pub/sub channels) × T tasks contend for one key **in one process** on a 2-worker
//! Tokio runtime (the multi-process harness is `bench/benches/contention.rs`; this one
//! compares topologies, not processes). Each critical section GETs a counter on a
//! separate Redis server and SETs it + 1; the counter must equal the number of
//! critical sections at the end, and fencing tokens must strictly increase.
//!
//! Reported per point: critical sections per second, lock requests per critical
//! section (the `EVALSHA` calls summed over the lock nodes' `INFO commandstats`:
//! every lock operation, the fence write-back included, is one), and the
//! uncontended `lock` + `release` latency (p50 / p99 of 300 rounds on fresh keys).
//! Without `--bench` (as `cargo test --benches` runs it) a tiny smoke configuration
//! runs.

#[path = "common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockflight::{
    FencingToken, Handoff, Locker, RedisBackend, backend::LockBackend, backend::RedlockBackend,
};
use redis::aio::MultiplexedConnection;
use testkit::{RedisServer, counter_value, evalsha_count, increment};

struct Point {
    topology: String,
    mode: &'static str,
    cs: u64,
    secs: f64,
    requests: u64,
    p50_us: u64,
    p99_us: u64,
}

async fn evalsha_calls(servers: &[&RedisServer]) -> u64 {
    let mut total = 0;
    for s in servers {
        total += evalsha_count(&mut s.connection().await).await;
    }
    total
}

async fn make_backend(nodes: &[&RedisServer], prefix: &str) -> Arc<dyn LockBackend> {
    if nodes.len() == 1 {
        Arc::new(
            RedisBackend::builder(nodes[0].url())
                .prefix(prefix)
                .connect()
                .await
                .expect("connect"),
        )
    } else {
        Arc::new(
            RedlockBackend::builder(nodes.iter().map(|s| s.url()))
                .prefix(prefix)
                .node_timeout(Duration::from_millis(500))
                .connect()
                .await
                .expect("connect"),
        )
    }
}

fn locker(backend: Arc<dyn LockBackend>, handoff: bool) -> Locker {
    let b = Locker::builder(backend).wait_timeout(Duration::from_secs(60));
    let b = if handoff {
        b.handoff(Handoff::enabled())
    } else {
        b
    };
    b.build().expect("locker")
}

async fn run_point(
    nodes: &[&RedisServer],
    counter_con: &MultiplexedConnection,
    mode: &'static str,
    p: usize,
    t: usize,
    secs: f64,
) -> Point {
    let prefix = testkit::unique_prefix(&format!("bench-{}-{mode}", nodes.len()));
    let handoff = mode == "handoff";
    let mut lockers = Vec::new();
    for _ in 0..p {
        lockers.push(locker(make_backend(nodes, &prefix).await, handoff));
    }
    // Uncontended latency: one task, fresh keys.
    let mut lat = Vec::new();
    for i in 0..300 {
        let start = Instant::now();
        let g = lockers[0].lock(format!("solo-{i}")).await.expect("lock");
        g.release().await.expect("release");
        lat.push(start.elapsed().as_micros() as u64);
    }
    lat.sort_unstable();
    let counter = format!("{prefix}:counter");
    let tokens = Arc::new(Mutex::new(Vec::<FencingToken>::new()));
    let before = evalsha_calls(nodes).await;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut set = tokio::task::JoinSet::new();
    for l in &lockers {
        for _ in 0..t {
            let (l, mut con, tokens, counter) = (
                l.clone(),
                counter_con.clone(),
                Arc::clone(&tokens),
                counter.clone(),
            );
            set.spawn(async move {
                let mut n = 0u64;
                while Instant::now() < end {
                    let g = l.lock("hot").await.expect("lock");
                    tokens.lock().unwrap().push(g.fencing_token());
                    increment(&mut con, counter.as_bytes(), std::future::ready(())).await;
                    g.release().await.expect("release");
                    n += 1;
                }
                n
            });
        }
    }
    let mut cs = 0;
    while let Some(n) = set.join_next().await {
        cs += n.expect("task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let requests = evalsha_calls(nodes).await - before;
    let mut con = counter_con.clone();
    let value = counter_value(&mut con, counter.as_bytes()).await;
    assert_eq!(value, cs, "lost update: mutual exclusion broken");
    let tokens = tokens.lock().unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens do not strictly increase"
    );
    Point {
        topology: if nodes.len() == 1 {
            "single".into()
        } else {
            format!("redlock-{}", nodes.len())
        },
        mode,
        cs,
        secs: elapsed,
        requests,
        p50_us: lat[lat.len() / 2],
        p99_us: lat[lat.len() * 99 / 100],
    }
}

fn main() {
    let (secs, p, t) = common::scale();
    common::runtime().block_on(async move {
        let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
        let counter_server = RedisServer::start();
        let counter_con = counter_server.connection().await;
        let mut points = Vec::new();
        for n in [1usize, 3, 5] {
            let set: Vec<&RedisServer> = nodes[..n].iter().collect();
            for mode in ["coalesced", "handoff"] {
                let point = run_point(&set, &counter_con, mode, p, t, secs).await;
                eprintln!(
                    "{} {}: {} cs in {:.1}s",
                    point.topology, point.mode, point.cs, point.secs
                );
                points.push(point);
            }
        }
        println!("P = {p}, T = {t}, {secs} s per point, one process, 2 Tokio workers\n");
        println!(
            "| topology | mode | cs/s | lock requests / cs | requests / cs / N | uncontended lock+release p50 | p99 |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|");
        for pt in &points {
            let n = if pt.topology == "single" {
                1.0
            } else {
                pt.topology[8..].parse::<f64>().unwrap_or(1.0)
            };
            let per_cs = pt.requests as f64 / pt.cs.max(1) as f64;
            println!(
                "| {} | {} | {:.0} | {:.3} | {:.3} | {} µs | {} µs |",
                pt.topology,
                pt.mode,
                pt.cs as f64 / pt.secs,
                per_cs,
                per_cs / n,
                pt.p50_us,
                pt.p99_us
            );
        }
    });
}
