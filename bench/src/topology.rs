//! The topology table: the hot-key read-modify-write workload on one server, a
//! Redis Cluster (3 primaries + 3 replicas) and a Sentinel setup (primary + 2
//! replicas + 3 sentinels), all started on loopback by `testkit`, measured by the
//! contention bench after its own points (and alone by the `topology` bench).
//!
//! For each topology: P = 4 instances (each its own `RedisBackend`: its own
//! connections, instance id and notification channel, in this one process, where
//! the contention points run worker processes) × T = 64 tasks on one hot key, in
//! three modes: `naive` (no coalescing), `default` and `uncached` (the default
//! with lease caching off). All the topologies are started first; then
//! [`ROUNDS`] rounds run every topology's rows in turn, and each row reports its
//! median round (this machine's throughput drifts by tens of percent from one
//! minute to the next: interleaving keeps the ratios fair). It reports critical sections per second
//! and Redis requests per critical section: the client-side count (acquire
//! attempts + releases + renewals) and the server-side `EVALSHA` count (`INFO
//! commandstats`, summed over the primaries). The critical section GETs a counter
//! and SETs it + 1; the counter must equal the number of critical sections
//! afterwards (the run fails otherwise).
//!
//! On the cluster the hot key also runs with the critical section's GET and SET on a
//! plain connection to the counter's primary (the lock's cost without the cluster
//! data client's). It also runs 64 hot keys (task `t` on key `t`) placed on 1, 2
//! and 3 shards, in the default mode. After the Sentinel rows, the same primary is
//! measured as one server (`replicated primary`): the cost of its replication
//! without the Sentinel client.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockflight::backend::RedisBackendBuilder;
use lockflight::{Contention, LockKey, Locker, RedisBackend};
use testkit::RedisServer;
use testkit::cluster::Cluster;
use testkit::sentinel::{MASTER, Sentinels};
use tokio::task::JoinSet;

const P: usize = 4;
const T: usize = 64;
/// Rounds per row (the median is reported).
pub const ROUNDS: usize = 3;

/// The modes of the one-key rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Naive,
    Default,
    Uncached,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Naive => "naive",
            Mode::Default => "default",
            Mode::Uncached => "uncached",
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    /// `single`, `cluster`, `sentinel` or `replicated primary`.
    pub topology: &'static str,
    /// What ran, e.g. `1 hot key, default`.
    pub workload: String,
    /// Critical sections per second.
    pub throughput: f64,
    /// lockflight's requests (acquire attempts + releases + renewals) per section.
    pub client_per_cs: f64,
    /// Server-side `EVALSHA` calls per section (summed over the primaries).
    pub evalsha_per_cs: f64,
    /// Critical sections run.
    pub sections: u64,
}

/// Where the counters live.
#[derive(Clone)]
enum Data {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Data {
    async fn query<V: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<V, String> {
        match self {
            Data::Single(c) => cmd.query_async(&mut c.clone()).await,
            Data::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
        .map_err(|e| format!("data query: {e}"))
    }
}

struct Topo {
    name: &'static str,
    /// A builder of a backend on this topology.
    builder: Box<dyn Fn() -> RedisBackendBuilder + Send + Sync>,
    data: Data,
    /// Clients of the primaries (for `INFO commandstats`).
    primaries: Vec<redis::Client>,
}

impl Topo {
    /// A new backend (instance) on this topology under `prefix`, subscribed.
    async fn connect(&self, prefix: &str) -> Result<RedisBackend, String> {
        let b = (self.builder)()
            .prefix(prefix)
            .connect()
            .await
            .map_err(|e| format!("{}: connect: {e}", self.name))?;
        Ok(b)
    }

    async fn cluster(cluster: &Cluster) -> Result<Topo, String> {
        let urls = cluster.urls();
        let primaries = cluster
            .primaries()
            .await
            .iter()
            .map(|p| redis::Client::open(format!("redis://{}/", p.addr)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let data = redis::cluster::ClusterClientBuilder::new(urls.clone())
            .response_timeout(Duration::from_secs(10))
            .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
            .build()
            .map_err(|e| e.to_string())?
            .get_async_connection()
            .await
            .map_err(|e| format!("cluster data connection: {e}"))?;
        Ok(Topo {
            name: "cluster",
            builder: Box::new(move || RedisBackend::cluster(urls.clone())),
            data: Data::Cluster(data),
            primaries,
        })
    }
}

async fn evalsha_calls(primaries: &[redis::Client]) -> Result<u64, String> {
    let mut total = 0;
    for c in primaries {
        let mut con = c
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("INFO connection: {e}"))?;
        total += testkit::evalsha_count(&mut con).await;
    }
    Ok(total)
}

/// P instances × T tasks for `secs`; task `t` uses `keys[t % keys.len()]`. With
/// `direct` (one key), the critical sections' GET and SET go over a plain
/// connection to the primary that owns the counter instead of the topology's
/// data client (on a cluster: the cluster client), which tells the lock's cost
/// from the data client's.
async fn run(
    topo: &Topo,
    mode: Mode,
    keys: &[LockKey],
    prefix: &str,
    secs: f64,
    workload: String,
    direct: bool,
) -> Result<Row, String> {
    let mut lockers = Vec::new();
    let mut backends = Vec::new();
    for _ in 0..P {
        let b = topo.connect(prefix).await?;
        let builder = Locker::builder(b.clone()).wait_timeout(Duration::from_secs(120));
        let builder = match mode {
            Mode::Naive => builder.contention(Contention::PerTask),
            Mode::Default => builder,
            Mode::Uncached => builder.cache_leases_for(Duration::ZERO),
        };
        lockers.push(builder.build().map_err(|e| e.to_string())?);
        backends.push(b);
    }
    let counters: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| [&testkit::names::lock(prefix, k)[..], b":counter"].concat())
        .collect();
    let mut data = topo.data.clone();
    if direct && counters.len() == 1 {
        data = owner_of(topo, &counters[0]).await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sections = Arc::new(AtomicU64::new(0));
    let before = evalsha_calls(&topo.primaries).await?;
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
                    let g = l.lock(&key).await.map_err(|e| format!("lock: {e}"))?;
                    let v: Option<u64> = data.query(redis::cmd("GET").arg(&counter)).await?;
                    data.query::<()>(redis::cmd("SET").arg(&counter).arg(v.unwrap_or(0) + 1))
                        .await?;
                    g.release().await.map_err(|e| format!("release: {e}"))?;
                    sections.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), String>(())
            });
        }
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(j) = tasks.join_next().await {
        j.map_err(|e| format!("a bench task panicked: {e}"))??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    for l in &lockers {
        l.shutdown().await;
    }
    let after = evalsha_calls(&topo.primaries).await?;
    let n = sections.load(Ordering::Relaxed);
    let mut counted = 0;
    for c in &counters {
        let v: Option<u64> = topo.data.query(redis::cmd("GET").arg(c)).await?;
        counted += v.unwrap_or(0);
    }
    if counted != n {
        return Err(format!(
            "{} {workload}: the counters hold {counted} after {n} critical sections: mutual exclusion failed",
            topo.name
        ));
    }
    let client: u64 = lockers
        .iter()
        .map(|l| {
            let s = l.stats();
            s.acquire_attempts + s.releases + s.renewals
        })
        .sum();
    let per = |x: u64| x as f64 / n.max(1) as f64;
    Ok(Row {
        topology: topo.name,
        workload,
        throughput: n as f64 / elapsed,
        client_per_cs: per(client),
        evalsha_per_cs: per(after - before),
        sections: n,
    })
}

/// A plain connection to the primary of `topo` that serves `name` (the one that
/// answers a GET of it rather than `MOVED`).
async fn owner_of(topo: &Topo, name: &[u8]) -> Result<Data, String> {
    for p in &topo.primaries {
        let mut con = p
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("node connection: {e}"))?;
        let owned: redis::RedisResult<Option<u64>> =
            redis::cmd("GET").arg(name).query_async(&mut con).await;
        if owned.is_ok() {
            return Ok(Data::Single(con));
        }
    }
    Err(format!("{}: no primary serves the counter", topo.name))
}

/// The one-key rows of a topology: its modes, and on a cluster the default mode
/// with its data sent straight to the counter's primary.
async fn hot_key(topo: &Topo, secs: f64, rows: &mut Vec<Row>) -> Result<(), String> {
    let hot = [LockKey::from("hot")];
    for mode in [Mode::Naive, Mode::Default, Mode::Uncached] {
        let prefix = testkit::unique_prefix(&format!("bench-{}-{}", topo.name, mode.name()));
        let workload = format!("1 hot key, {}", mode.name());
        rows.push(run(topo, mode, &hot, &prefix, secs, workload, false).await?);
    }
    if matches!(topo.data, Data::Cluster(_)) {
        let prefix = testkit::unique_prefix(&format!("bench-{}-direct", topo.name));
        let workload = format!("1 hot key, {}, {DIRECT}", Mode::Default.name());
        rows.push(run(topo, Mode::Default, &hot, &prefix, secs, workload, true).await?);
    }
    Ok(())
}

/// The workload suffix of the rows whose data skips the cluster client.
const DIRECT: &str = "data on a plain connection";

/// 64 keys placed on the first `shards` primaries (by the slot of their names under
/// `prefix`), round robin.
async fn keys_on_shards(c: &Cluster, prefix: &str, shards: usize) -> Vec<LockKey> {
    let primaries = c.primaries().await;
    let mut keys = Vec::new();
    let mut i = 0u64;
    while keys.len() < 64 {
        let key = LockKey::from(format!("k{i}"));
        i += 1;
        let slot = Cluster::slot(&testkit::names::lock(prefix, &key));
        let owner = primaries
            .iter()
            .position(|p| p.slots.iter().any(|&(a, z)| a <= slot && slot <= z));
        if owner == Some(keys.len() % shards) {
            keys.push(key);
        }
    }
    keys
}

/// Measures every topology, `secs` per row and round.
pub async fn measure(secs: f64) -> Result<Vec<Row>, String> {
    let server = RedisServer::start();
    let cluster = Cluster::start();
    let sentinels = Sentinels::start().await;
    let url = server.url();
    let single = Topo {
        name: "single",
        builder: Box::new(move || RedisBackend::builder(url.clone())),
        data: Data::Single(server.connection().await),
        primaries: vec![server.client()],
    };
    let clustered = Topo::cluster(&cluster).await?;
    let urls = sentinels.sentinel_urls();
    let primary = sentinels.primary().await;
    let sentinel = Topo {
        name: "sentinel",
        builder: Box::new(move || RedisBackend::sentinel(urls.clone(), MASTER)),
        data: Data::Single(primary.connection().await),
        primaries: vec![primary.client()],
    };
    // The same primary (with its two replicas) as one server: what the
    // replication costs the server, without Sentinel on the client side.
    let url = primary.url();
    let replicated = Topo {
        name: "replicated primary",
        builder: Box::new(move || RedisBackend::builder(url.clone())),
        data: Data::Single(primary.connection().await),
        primaries: vec![primary.client()],
    };
    let mut rounds: Vec<Vec<Row>> = Vec::new();
    for _ in 0..ROUNDS {
        let mut rows = Vec::new();
        for topo in [&single, &clustered, &sentinel, &replicated] {
            hot_key(topo, secs, &mut rows).await?;
        }
        rounds.push(rows);
    }
    let mut rows = median_rows(rounds);
    for shards in 1..=3 {
        let prefix = testkit::unique_prefix(&format!("bench-64-{shards}"));
        let keys = keys_on_shards(&cluster, &prefix, shards).await;
        let workload = format!("64 hot keys on {shards} shard(s), default");
        rows.push(
            run(
                &clustered,
                Mode::Default,
                &keys,
                &prefix,
                secs,
                workload,
                false,
            )
            .await?,
        );
    }
    Ok(rows)
}

/// Per row (same position in every round), the round with the median
/// throughput.
fn median_rows(rounds: Vec<Vec<Row>>) -> Vec<Row> {
    let n = rounds.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| {
            let mut same: Vec<Row> = rounds.iter().map(|r| r[i].clone()).collect();
            same.sort_by(|a, b| a.throughput.total_cmp(&b.throughput));
            same.swap_remove(same.len() / 2)
        })
        .collect()
}

/// The throughput of `topology`'s row `workload`.
fn throughput(rows: &[Row], topology: &str, workload: &str) -> Option<f64> {
    rows.iter()
        .find(|r| r.topology == topology && r.workload == workload)
        .map(|r| r.throughput)
}

/// The table, and the issue-22 targets (the default mode's hot key on a Cluster
/// ≥ 0.8× and on Sentinel ≥ 0.9× one server).
pub fn markdown(rows: &[Row], secs: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "P = {P} instances × T = {T} tasks in one process (one `RedisBackend` each), \
         {secs:.1} s per row; the one-key rows of all topologies run interleaved, \
         {ROUNDS} rounds, the median round shown. Critical section GET + SET of a \
         counter (exact in every row). EVALSHA/cs is counted by the servers \
         (`INFO commandstats`, primaries).\n"
    );
    let _ = writeln!(
        s,
        "| topology | workload | cs/s | client requests/cs | server EVALSHA/cs | cs |"
    );
    let _ = writeln!(s, "|---|---|--:|--:|--:|--:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.2} | {:.2} | {} |",
            r.topology, r.workload, r.throughput, r.client_per_cs, r.evalsha_per_cs, r.sections
        );
    }
    let hot = "1 hot key, default";
    if let Some(single) = throughput(rows, "single", hot) {
        if let Some(t) = throughput(rows, "cluster", &format!("{hot}, {DIRECT}")) {
            let _ = writeln!(
                s,
                "\n- cluster with its data on a plain connection ÷ single, hot key, default: \
                 **{:.3}×** (the lock's share of the gap: the rest is the cluster data client's)",
                t / single
            );
        }
        let _ = writeln!(s);
        for (topology, target) in [
            ("cluster", 0.8),
            ("sentinel", 0.9),
            ("replicated primary", 0.0),
        ] {
            if let Some(t) = throughput(rows, topology, hot) {
                let ratio = t / single;
                let verdict = if target == 0.0 {
                    "(reference: the Sentinel primary without the Sentinel client)".to_owned()
                } else if ratio >= target {
                    format!("target ≥ {target}×: met")
                } else {
                    format!("target ≥ {target}×: not met")
                };
                let _ = writeln!(
                    s,
                    "- {topology} ÷ single, hot key, default: **{ratio:.3}×** {verdict}"
                );
            }
        }
    }
    s
}
