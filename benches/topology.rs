//! Topology benchmark: the hot-key read-modify-write workload on one server, a
//! Redis Cluster (3 primaries + 3 replicas) and a Sentinel setup (primary + 2
//! replicas + 3 sentinels), all started on loopback by `testkit`.
//!
//! ```text
//! cargo bench --features cluster,sentinel --bench topology                       # all three
//! cargo bench --features cluster,sentinel --bench topology -- --topology cluster
//! LOCKFLIGHT_BENCH_SECS=3 cargo bench --features cluster,sentinel --bench topology -- --topology single
//! ```
//!
//! For each topology: P = 4 instances (each its own `RedisBackend`: its own
//! connections, instance id and notification channel — but all in this one process,
//! unlike `bench/benches/contention.rs`, which runs real worker processes) × T = 64 tasks on
//! one hot key, in three modes — `naive` (no coalescing), `default`, `handoff` — for
//! `LOCKFLIGHT_BENCH_SECS` (default 2) each. It reports critical sections per second
//! and Redis requests per critical section: the client-side count (acquire attempts +
//! releases + renewals) and the server-side `EVALSHA` count (`INFO commandstats`,
//! summed over the primaries). The critical section GETs a counter and SETs it + 1;
//! the counter must equal the number of critical sections afterwards (the bench
//! fails otherwise).
//!
//! On the cluster it also runs 64 hot keys (T = 64 tasks per instance, task `t` on
//! key `t`) with the keys placed on 1, 2 and 3 shards, in the default mode.
//!
//! After the Sentinel rows, the same primary is measured as one server
//! (`replicated primary`): the cost of its replication without the Sentinel client.
//!
//! With `LOCKFLIGHT_TOPOLOGY_DATA=direct`, the single-key runs send the critical
//! section's GET and SET over a plain connection to the node that owns the counter
//! instead of the cluster client, to tell the lock's cost from the data client's.
//!
//! Results are printed as a Markdown table.
#![allow(dead_code)]

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockflight::backend::RedisBackendBuilder;
use lockflight::{Handoff, LockKey, Locker, RedisBackend};
use testkit::RedisServer;
use testkit::cluster::Cluster;
use testkit::sentinel::{MASTER, Sentinels};
use tokio::task::JoinSet;

const P: usize = 4;
const T: usize = 64;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Naive,
    Default,
    Handoff,
}

/// Where the counters live and how to count server-side script calls.
#[derive(Clone)]
enum Data {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Data {
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        match self {
            Data::Single(c) => cmd.query_async(&mut c.clone()).await.expect("data query"),
            Data::Cluster(c) => cmd.query_async(&mut c.clone()).await.expect("data query"),
        }
    }
}

struct Topo {
    name: &'static str,
    /// A builder of a backend on this topology.
    builder: Box<dyn Fn() -> RedisBackendBuilder>,
    data: Data,
    /// Clients of the primaries (for `INFO commandstats`).
    primaries: Vec<redis::Client>,
}

impl Topo {
    /// A new backend (instance) on this topology under `prefix`, subscribed.
    async fn connect(&self, prefix: &str) -> RedisBackend {
        testkit::subscribed(
            (self.builder)()
                .prefix(prefix)
                .connect()
                .await
                .expect("connect"),
        )
        .await
    }

    /// The cluster as a topology: its primaries and a cluster data connection.
    async fn cluster(cluster: &Cluster) -> Topo {
        let urls = cluster.urls();
        let primaries = cluster
            .primaries()
            .await
            .iter()
            .map(|p| redis::Client::open(format!("redis://{}/", p.addr)).unwrap())
            .collect();
        let data = redis::cluster::ClusterClientBuilder::new(urls.clone())
            .response_timeout(Duration::from_secs(10))
            .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
            .build()
            .unwrap()
            .get_async_connection()
            .await
            .unwrap();
        Topo {
            name: "cluster",
            builder: Box::new(move || RedisBackend::cluster(urls.clone())),
            data: Data::Cluster(data),
            primaries,
        }
    }
}

async fn evalsha_calls(primaries: &[redis::Client]) -> u64 {
    let mut total = 0;
    for c in primaries {
        let mut con = c
            .get_multiplexed_async_connection()
            .await
            .expect("info conn");
        total += testkit::evalsha_count(&mut con).await;
    }
    total
}

struct Outcome {
    sections: u64,
    secs: f64,
    client_requests: u64,
    server_evalsha: u64,
}

/// P instances × `tasks` tasks for `secs`; task `t` uses `keys[t % keys.len()]`.
async fn run(topo: &Topo, mode: Mode, keys: &[LockKey], prefix: &str, secs: f64) -> Outcome {
    let mut lockers = Vec::new();
    let mut backends = Vec::new();
    for _ in 0..P {
        let b = topo.connect(prefix).await;
        let builder = Locker::builder(b.clone()).wait_timeout(Duration::from_secs(120));
        let builder = match mode {
            Mode::Naive => builder.coalescing(false),
            Mode::Default => builder,
            Mode::Handoff => builder.handoff(Handoff::enabled()),
        };
        lockers.push(builder.build().expect("locker"));
        backends.push(b);
    }
    let counters: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| [&backends[0].lock_name(k)[..], b":counter"].concat())
        .collect();
    // LOCKFLIGHT_TOPOLOGY_DATA=direct: the critical sections' GET and SET go over a
    // plain connection to the node that owns the (one) counter instead of the
    // cluster client, to separate the lock's cost from the data client's.
    let direct = std::env::var("LOCKFLIGHT_TOPOLOGY_DATA").is_ok_and(|v| v == "direct");
    let mut data = topo.data.clone();
    if direct && counters.len() == 1 {
        for p in &topo.primaries {
            let mut con = p.get_multiplexed_async_connection().await.expect("node");
            let owned: redis::RedisResult<Option<u64>> = redis::cmd("GET")
                .arg(&counters[0])
                .query_async(&mut con)
                .await;
            if owned.is_ok() {
                data = Data::Single(con);
                break;
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sections = Arc::new(AtomicU64::new(0));
    let before = evalsha_calls(&topo.primaries).await;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for l in &lockers {
        for t in 0..T {
            let i = t % keys.len();
            let (l, key, counter, data, stop, sections) = (
                l.clone(),
                keys[i].clone(),
                counters[i].clone(),
                data.clone(),
                stop.clone(),
                sections.clone(),
            );
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let g = l.lock(&key).await.expect("lock");
                    let v: Option<u64> = data.query(redis::cmd("GET").arg(&counter)).await;
                    data.query::<()>(redis::cmd("SET").arg(&counter).arg(v.unwrap_or(0) + 1))
                        .await;
                    g.release().await.expect("release");
                    sections.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(j) = tasks.join_next().await {
        j.expect("bench task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = evalsha_calls(&topo.primaries).await;
    let n = sections.load(Ordering::Relaxed);
    let mut counted = 0;
    for c in &counters {
        let v: Option<u64> = topo.data.query(redis::cmd("GET").arg(c)).await;
        counted += v.unwrap_or(0);
    }
    assert_eq!(counted, n, "lost updates: mutual exclusion failed");
    let client_requests = lockers
        .iter()
        .map(|l| {
            let s = l.stats();
            s.acquire_attempts + s.releases + s.renewals
        })
        .sum();
    Outcome {
        sections: n,
        secs: elapsed,
        client_requests,
        server_evalsha: after - before,
    }
}

fn row(topo: &str, what: &str, o: &Outcome) {
    println!(
        "| {topo} | {what} | {:.0} | {:.2} | {:.2} | {} |",
        o.sections as f64 / o.secs,
        o.client_requests as f64 / o.sections.max(1) as f64,
        o.server_evalsha as f64 / o.sections.max(1) as f64,
        o.sections
    );
}

fn header() {
    println!(
        "| topology | workload (P=4, T=64) | cs/s | client requests/cs | server EVALSHA/cs | cs |"
    );
    println!("|---|---|---|---|---|---|");
}

async fn bench_topology(topo: Topo, secs: f64) {
    let hot = [LockKey::from("hot")];
    for mode in [Mode::Naive, Mode::Default, Mode::Handoff] {
        let prefix = testkit::unique_prefix(&format!("bench-{}-{mode:?}", topo.name));
        let o = run(&topo, mode, &hot, &prefix, secs).await;
        row(topo.name, &format!("1 hot key, {mode:?}"), &o);
    }
}

/// 64 keys placed on the first `shards` primaries (by slot).
async fn keys_on_shards(c: &Cluster, b: &RedisBackend, shards: usize) -> Vec<LockKey> {
    let primaries = c.primaries().await;
    let mut keys = Vec::new();
    let mut i = 0u64;
    while keys.len() < 64 {
        let key = LockKey::from(format!("k{i}"));
        i += 1;
        let slot = Cluster::slot(&b.lock_name(&key));
        let owner = primaries
            .iter()
            .position(|p| p.slots.iter().any(|&(a, z)| a <= slot && slot <= z))
            .unwrap();
        // Round-robin over the chosen shards.
        if owner == keys.len() % shards {
            keys.push(key);
        }
    }
    keys
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--topology")
        .and_then(|i| args.get(i + 1))
        .cloned();
    // `cargo test --benches` runs benches with no `--bench`: do nothing then.
    if !args.iter().any(|a| a == "--bench") && only.is_none() {
        return;
    }
    let secs = common::bench_secs(2.0);
    common::runtime().block_on(async move {
        header();
        let want = |t: &str| only.as_deref().is_none_or(|o| o == t);
        if want("single") {
            let server = RedisServer::start();
            let url = server.url();
            let topo = Topo {
                name: "single",
                builder: Box::new(move || RedisBackend::builder(url.clone())),
                data: Data::Single(server.connection().await),
                primaries: vec![server.client()],
            };
            bench_topology(topo, secs).await;
        }
        if want("cluster") {
            let cluster = Cluster::start();
            bench_topology(Topo::cluster(&cluster).await, secs).await;
        }
        if want("sentinel") {
            let s = Sentinels::start().await;
            let urls = s.sentinel_urls();
            let primary = s.primary().await;
            let topo = Topo {
                name: "sentinel",
                builder: Box::new(move || RedisBackend::sentinel(urls.clone(), MASTER)),
                data: Data::Single(primary.connection().await),
                primaries: vec![primary.client()],
            };
            bench_topology(topo, secs).await;
            // The same primary (with its two replicas) as one server: what the
            // replication costs the server, without Sentinel on the client side.
            let url = primary.url();
            let topo = Topo {
                name: "replicated primary",
                builder: Box::new(move || RedisBackend::builder(url.clone())),
                data: Data::Single(primary.connection().await),
                primaries: vec![primary.client()],
            };
            bench_topology(topo, secs).await;
        }
        if want("cluster") {
            // 64 hot keys over 1, 2, 3 shards (default mode).
            let cluster = Cluster::start();
            let topo = Topo::cluster(&cluster).await;
            let probe = topo.connect("bench-probe").await;
            for shards in 1..=3 {
                let prefix = testkit::unique_prefix(&format!("bench-64-{shards}"));
                // Names depend on the prefix: place keys with a backend of that prefix.
                let b = topo.connect(&prefix).await;
                let keys = keys_on_shards(&cluster, &b, shards).await;
                let o = run(&topo, Mode::Default, &keys, &prefix, secs).await;
                row(
                    "cluster",
                    &format!("64 hot keys on {shards} shard(s), Default"),
                    &o,
                );
            }
            drop(probe);
        }
    });
}
