//! The demo: inventory instances as separate processes on one Redis, a bounded
//! burst of concurrent reservations on a few hot SKUs per locking mode, and a table
//! of what each mode cost.
//!
//! Everything it starts, it stops: the instances and the gateway are children with
//! `kill_on_drop` that also exit when their stdin pipe closes (so they go even if
//! the demo is killed outright), and the private `redis-server` runs under a tiny
//! `sh` supervisor that kills it when its stdin pipe closes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lockflight::FencingToken;
use serde_json::json;
use sqlx::SqlitePool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinSet;

use crate::app::{self, OPTIMISTIC_ATTEMPTS};
use crate::cli::{Locking, redact};
use crate::client::{BoxError, Http};

/// Inventory instances per mode (with Redis).
const INSTANCES: usize = 3;
/// Hot SKUs per mode.
const HOT_SKUS: usize = 4;
/// Initial stock of each hot SKU: 4 × 450 = 1,800 units for 2,000 requests, so the
/// last 200 requests find the shelves empty (demand beyond supply is when a broken
/// lock would oversell).
const STOCK: i64 = 450;
/// Reservation requests per mode (qty 1 each).
const REQUESTS: usize = 2_000;
/// Requests in flight at once.
const CONCURRENCY: usize = 64;
/// The low-contention scenario: as many SKUs as requests spread over them four
/// each, with enough stock for all (writers of one SKU rarely meet).
const COLD_SKUS: usize = 500;
/// Stock of each cold SKU.
const COLD_STOCK: i64 = 4;

/// Which SKUs a mode's burst reserves.
#[derive(Clone, Copy, Debug)]
struct Shelf {
    /// How many SKUs.
    skus: usize,
    /// Initial stock of each.
    stock: i64,
    /// Name prefix of the SKUs.
    kind: &'static str,
}

const HOT: Shelf = Shelf {
    skus: HOT_SKUS,
    stock: STOCK,
    kind: "hot",
};
const COLD: Shelf = Shelf {
    skus: COLD_SKUS,
    stock: COLD_STOCK,
    kind: "cold",
};

/// How long a child may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug)]
struct Mode {
    label: &'static str,
    slug: &'static str,
    locking: Locking,
    gateway: bool,
    /// The reservation route: `reserve` (under the SKU's lock, fenced) or
    /// `reserve-optimistic` (no lock, a version column).
    endpoint: &'static str,
}

impl Mode {
    /// Whether its writes carry fencing tokens (checked for order): lockflight's
    /// reservations; not the plain lock's (it has none), not the optimistic ones.
    fn fenced(&self) -> bool {
        self.endpoint == "reserve" && self.locking != Locking::Plain
    }
}

const MODES: [Mode; 6] = [
    Mode {
        label: "plain Redis lock (SET NX PX)",
        slug: "plain",
        locking: Locking::Plain,
        gateway: false,
        endpoint: "reserve",
    },
    Mode {
        label: "lockflight",
        slug: "coalesced",
        locking: Locking::Coalesced,
        gateway: false,
        endpoint: "reserve",
    },
    Mode {
        label: "lockflight + gateway",
        slug: "coalesced-gw",
        locking: Locking::Coalesced,
        gateway: true,
        endpoint: "reserve",
    },
    Mode {
        label: "lockflight + handoff",
        slug: "handoff",
        locking: Locking::Handoff,
        gateway: false,
        endpoint: "reserve",
    },
    Mode {
        label: "lockflight + handoff + gateway",
        slug: "handoff-gw",
        locking: Locking::Handoff,
        gateway: true,
        endpoint: "reserve",
    },
    Mode {
        label: "optimistic (version column)",
        slug: "optimistic",
        locking: Locking::Coalesced,
        gateway: false,
        endpoint: "reserve-optimistic",
    },
];

/// One mode's results.
#[derive(Debug, Default)]
struct Row {
    label: String,
    reserved: u64,
    out_of_stock: u64,
    oversold: i64,
    stale: u64,
    unavailable: u64,
    errors: u64,
    p50: Duration,
    p99: Duration,
    throughput: f64,
    lock_requests: u64,
    server_commands: Option<u64>,
    handoffs: u64,
    /// Optimistic writes that found the row changed (and retried).
    conflicts: u64,
    /// Sizing data from the instances' histograms (cumulative since start).
    sizing: Option<(f64, f64, f64)>,
    fence_order_ok: bool,
}

/// Where the instances lock: one Redis (its URL) or a Redis Cluster (its nodes).
#[derive(Clone, Debug)]
enum Target {
    Single(String),
    Cluster(Vec<String>),
}

impl Target {
    /// The environment variable that points an instance at it.
    fn env(&self) -> (&'static str, String) {
        match self {
            Target::Single(url) => ("REDIS_URL", url.clone()),
            Target::Cluster(nodes) => ("REDIS_CLUSTER_URLS", nodes.join(",")),
        }
    }

    /// Every server whose commands count.
    fn servers(&self) -> Vec<String> {
        match self {
            Target::Single(url) => vec![url.clone()],
            Target::Cluster(nodes) => nodes.clone(),
        }
    }
}

/// Runs the demo; with `cluster`, on a private 3-shard Redis Cluster.
pub(crate) async fn run(cluster: bool) -> Result<(), BoxError> {
    let started = Instant::now();
    println!("lockflight demo: inventory instances reserving hot SKUs\n");

    let mut private = Vec::new();
    let target = if cluster {
        if !cfg!(feature = "cluster") {
            return Err("--cluster needs the cluster feature: \
                        cargo run -p examples --example demo --features cluster -- --cluster"
                .into());
        }
        let bin =
            find_on_path("redis-server").ok_or("--cluster needs redis-server and redis-cli")?;
        let nodes = PrivateRedis::start_cluster(&bin, 3).await?;
        let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
        println!(
            "Redis: private 3-shard Redis Cluster on {} (temporary directories, no \
             persistence, stopped at exit)",
            urls.join(", ")
        );
        private = nodes;
        Some(Target::Cluster(urls))
    } else {
        match std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()) {
            Some(url) => {
                println!("Redis: {} (from REDIS_URL)", redact(&url));
                Some(Target::Single(url))
            }
            None => match find_on_path("redis-server") {
                Some(bin) => {
                    let redis = PrivateRedis::start(&bin, &[]).await?;
                    println!(
                        "Redis: private redis-server on {} (temporary directory, no persistence, \
                         stopped at exit)",
                        redis.url
                    );
                    let url = redis.url.clone();
                    private.push(redis);
                    Some(Target::Single(url))
                }
                None => {
                    println!(
                        "Redis: REDIS_URL is not set and redis-server is not installed: running ONE \
                         instance on the in-process backend (no cross-process locking to show; \
                         install redis-server, or set REDIS_URL, for the multi-process demo)"
                    );
                    None
                }
            },
        }
    };
    let (instances, modes): (usize, Vec<Mode>) = match target {
        Some(_) => (INSTANCES, MODES.to_vec()),
        // No Redis: no plain Redis lock, and nothing for a gateway to route.
        None => (
            1,
            MODES
                .iter()
                .copied()
                .filter(|m| !m.gateway && m.locking != Locking::Plain)
                .collect(),
        ),
    };

    // The low-contention comparison: lockflight's default against optimistic.
    let cold_modes: Vec<Mode> = modes
        .iter()
        .copied()
        .filter(|m| m.slug == "handoff" || m.slug == "optimistic")
        .collect();

    let dir = tempfile::tempdir()?;
    let db_path = dir.path().join("inventory.db");
    let db = app::open_db(Some(&db_path)).await?;
    println!(
        "Load per mode: {REQUESTS} reservations (qty 1) at concurrency {CONCURRENCY} over \
         {HOT_SKUS} hot SKUs with {STOCK} units each, spread over {instances} instance \
         process(es) sharing one SQLite file\n"
    );

    let http = Http::new();
    let mut redis_stats = Vec::new();
    for url in target.iter().flat_map(Target::servers) {
        redis_stats.push(redis_connection(&url).await?);
    }
    let mut rows = Vec::new();
    for mode in &modes {
        let row = run_mode(
            *mode,
            HOT,
            instances,
            target.as_ref().map(Target::env),
            &db_path,
            &db,
            &http,
            &mut redis_stats,
        )
        .await?;
        rows.push(row);
    }
    print_table(&rows, target.is_some(), true);
    let mut cold = Vec::new();
    if !cold_modes.is_empty() {
        println!(
            "\nLow contention: the same {REQUESTS} reservations over {COLD_SKUS} SKUs \
             ({} requests per SKU), where optimistic locking needs no lock round trip:\n",
            REQUESTS / COLD_SKUS
        );
    }
    for mode in &cold_modes {
        cold.push(
            run_mode(
                *mode,
                COLD,
                instances,
                target.as_ref().map(Target::env),
                &db_path,
                &db,
                &http,
                &mut redis_stats,
            )
            .await?,
        );
    }
    if !cold.is_empty() {
        print_table(&cold, target.is_some(), false);
    }
    db.close().await;
    for redis in private {
        redis.stop().await;
    }
    println!("\ndone in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_mode(
    mode: Mode,
    shelf: Shelf,
    instances: usize,
    redis_env: Option<(&'static str, String)>,
    db_path: &Path,
    db: &SqlitePool,
    http: &Http,
    redis: &mut [redis::aio::MultiplexedConnection],
) -> Result<Row, BoxError> {
    // Start the instances (concurrently) and, in gateway modes, the gateway.
    let mut starting = JoinSet::new();
    for i in 0..instances {
        let name = format!("{}", (b'a' + i as u8) as char);
        let mut envs = vec![
            ("INSTANCE_NAME", name.clone()),
            ("INVENTORY_LOCKING", mode.locking.name().to_owned()),
            ("DATABASE_PATH", db_path.display().to_string()),
        ];
        if let Some((var, value)) = &redis_env {
            envs.push((var, value.clone()));
        }
        starting.spawn(async move { Proc::spawn(&name, &["serve"], &envs).await });
    }
    let mut procs: Vec<Proc> = Vec::new();
    while let Some(p) = starting.join_next().await {
        procs.push(p??);
    }
    procs.sort_by(|a, b| a.name.cmp(&b.name));
    let gateway = if mode.gateway {
        let args: Vec<String> = std::iter::once("gateway".to_owned())
            .chain(procs.iter().map(|p| format!("{}={}", p.name, p.url)))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Some(Proc::spawn("gateway", &args, &[]).await?)
    } else {
        None
    };
    let targets: Vec<String> = match &gateway {
        Some(g) => vec![g.url.clone()],
        None => procs.iter().map(|p| p.url.clone()).collect(),
    };

    // Stock the shelves.
    let skus: Vec<String> = (0..shelf.skus)
        .map(|k| format!("{}-{}-{k}", mode.slug, shelf.kind))
        .collect();
    for sku in &skus {
        let res = http
            .post(
                &format!("{}/items", procs[0].url),
                &json!({ "sku": sku, "name": format!("{} item {sku}", shelf.kind), "stock": shelf.stock }),
            )
            .await?;
        if res.status != http::StatusCode::CREATED {
            return Err(format!("creating {sku}: {} {}", res.status, res.text()).into());
        }
    }

    let before = lock_totals(http, &procs).await?;
    let commands_before = server_commands(redis).await?;

    let label = mode.label.to_owned();
    let burst = burst(http, &targets, &skus, mode, &label).await;

    let after = lock_totals(http, &procs).await?;
    let commands_after = server_commands(redis).await?;

    // Check the books: final stock, the reservation log, the acknowledgements.
    let mut final_stock = 0;
    let mut logged_units = 0;
    for sku in &skus {
        let res = http.get(&format!("{}/items/{sku}", procs[0].url)).await?;
        final_stock += res.json()["stock"]
            .as_i64()
            .ok_or_else(|| format!("GET /items/{sku}: {} {}", res.status, res.text()))?;
        logged_units += app::reservation_log(db, sku).await?.1;
    }
    let initial = shelf.stock * shelf.skus as i64;
    let taken = initial - final_stock;
    let acked = burst.reserved as i64;
    // More acknowledged (or logged) than taken from the shelf, or a negative shelf.
    let oversold = (acked - taken).max(logged_units - taken).max(0) + (-final_stock).max(0);

    if let Some(g) = gateway {
        g.stop().await;
    }
    for p in procs {
        p.stop().await;
    }

    let mut latencies = burst.latencies;
    latencies.sort_unstable();
    Ok(Row {
        label,
        reserved: burst.reserved,
        out_of_stock: burst.out_of_stock,
        oversold,
        stale: after.stale - before.stale,
        unavailable: burst.unavailable,
        errors: burst.errors,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        throughput: REQUESTS as f64 / burst.elapsed.as_secs_f64(),
        lock_requests: after.requests - before.requests,
        server_commands: commands_before
            .zip(commands_after)
            .map(|(b, a)| a.saturating_sub(b)),
        handoffs: after.handoffs - before.handoffs,
        conflicts: after.conflicts - before.conflicts,
        sizing: match (after.wait_p99, after.hold_p99, after.renewals_max) {
            (Some(w), Some(h), r) => Some((w, h, r.unwrap_or(0.0))),
            _ => None,
        },
        fence_order_ok: burst.fence_order_ok || !mode.fenced(),
    })
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[derive(Debug, Default)]
struct Burst {
    reserved: u64,
    out_of_stock: u64,
    unavailable: u64,
    errors: u64,
    latencies: Vec<Duration>,
    elapsed: Duration,
    fence_order_ok: bool,
}

/// `(sku, remaining, fencing token)` of one acknowledged reservation.
type Ack = (String, i64, FencingToken);

/// Fires `REQUESTS` reservations, `CONCURRENCY` at a time. Request `i` reserves
/// `skus[i % n]` at `targets[i % m]`, so every SKU reaches every instance.
async fn burst(http: &Http, targets: &[String], skus: &[String], mode: Mode, label: &str) -> Burst {
    let bar = ProgressBar::with_draw_target(Some(REQUESTS as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix:>30} [{bar:30}] {pos:>4}/{len} {per_sec:>12}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_owned());
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (http, next, bar) = (http.clone(), Arc::clone(&next), bar.clone());
        let (targets, skus) = (targets.to_vec(), skus.to_vec());
        workers.spawn(async move {
            let mut out = Burst::default();
            let mut acks: Vec<Ack> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= REQUESTS {
                    break;
                }
                let sku = &skus[i % skus.len()];
                let url = format!(
                    "{}/items/{sku}/{}",
                    targets[i % targets.len()],
                    mode.endpoint
                );
                let t0 = Instant::now();
                let res = http.post(&url, &json!({ "qty": 1 })).await;
                out.latencies.push(t0.elapsed());
                match res {
                    Ok(r) if r.status == http::StatusCode::OK && !mode.fenced() => {
                        out.reserved += 1;
                    }
                    Ok(r) if r.status == http::StatusCode::OK => {
                        out.reserved += 1;
                        let body = r.json();
                        let token = &body["fencing_token"];
                        acks.push((
                            sku.clone(),
                            body["remaining"].as_i64().unwrap_or(-1),
                            FencingToken {
                                epoch: token["epoch"].as_u64().unwrap_or(0),
                                seq: token["seq"].as_u64().unwrap_or(0),
                            },
                        ));
                    }
                    Ok(r) if r.error_code().as_deref() == Some("out_of_stock") => {
                        out.out_of_stock += 1;
                    }
                    // Stale writes are counted from the instances' /stats; 503s
                    // here are those plus lock timeouts and lost leases.
                    Ok(r) if r.status == http::StatusCode::SERVICE_UNAVAILABLE => {
                        out.unavailable += 1;
                    }
                    Ok(r) => {
                        if out.errors == 0 {
                            bar.println(format!("unexpected reply: {} {}", r.status, r.text()));
                        }
                        out.errors += 1;
                    }
                    Err(e) => {
                        if out.errors == 0 {
                            bar.println(format!("request failed: {e}"));
                        }
                        out.errors += 1;
                    }
                }
                bar.inc(1);
            }
            (out, acks)
        });
    }
    let mut total = Burst::default();
    let mut acks: Vec<Ack> = Vec::new();
    while let Some(done) = workers.join_next().await {
        let Ok((part, part_acks)) = done else {
            total.errors += 1;
            continue;
        };
        total.reserved += part.reserved;
        total.out_of_stock += part.out_of_stock;
        total.unavailable += part.unavailable;
        total.errors += part.errors;
        total.latencies.extend(part.latencies);
        acks.extend(part_acks);
    }
    total.elapsed = started.elapsed();
    bar.finish_and_clear();
    println!(
        "{:>30}: {REQUESTS} requests in {:.2} s",
        label,
        total.elapsed.as_secs_f64()
    );
    // Per SKU, the later a reservation (the less stock it left), the newer its
    // fencing token must be.
    let mut per_sku: HashMap<String, Vec<(i64, FencingToken)>> = HashMap::new();
    for (sku, remaining, token) in acks {
        per_sku.entry(sku).or_default().push((remaining, token));
    }
    total.fence_order_ok = per_sku.values_mut().all(|v| {
        v.sort_by_key(|(remaining, _)| std::cmp::Reverse(*remaining));
        v.windows(2).all(|w| w[0].0 > w[1].0 && w[0].1 < w[1].1)
    });
    total
}

#[derive(Debug, Default)]
struct LockTotals {
    requests: u64,
    handoffs: u64,
    stale: u64,
    conflicts: u64,
    /// The worst instance's p99 lock wait and hold, and most renewals of a lease
    /// (from the `lockflight_*` histograms; `None` without the `metrics` feature).
    wait_p99: Option<f64>,
    hold_p99: Option<f64>,
    renewals_max: Option<f64>,
}

/// Sums the instances' `/stats`.
async fn lock_totals(http: &Http, procs: &[Proc]) -> Result<LockTotals, BoxError> {
    let mut t = LockTotals::default();
    for p in procs {
        let s = http.get(&format!("{}/stats", p.url)).await?.json();
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        t.requests += n(&s["lock_requests"]["total"]);
        t.handoffs += n(&s["lockflight"]["handoffs"]);
        t.stale += n(&s["app"]["stale_rejected"]);
        t.conflicts += n(&s["app"]["version_conflicts"]);
        let h = &s["histograms"];
        let worst = |was: Option<f64>, v: &serde_json::Value| match (was, v.as_f64()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        t.wait_p99 = worst(t.wait_p99, &h["lockflight_wait_seconds{kind=lock}"]["p99"]);
        t.hold_p99 = worst(t.hold_p99, &h["lockflight_hold_seconds{kind=lock}"]["p99"]);
        t.renewals_max = worst(
            t.renewals_max,
            &h["lockflight_lease_renewals{kind=lock}"]["max"],
        );
    }
    Ok(t)
}

async fn redis_connection(url: &str) -> Result<redis::aio::MultiplexedConnection, BoxError> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// Commands the servers have run (`INFO commandstats` summed over them; commands
/// run inside Lua scripts count too), not counting `INFO` itself; `None` without
/// servers.
async fn server_commands(
    servers: &mut [redis::aio::MultiplexedConnection],
) -> Result<Option<u64>, BoxError> {
    if servers.is_empty() {
        return Ok(None);
    }
    let mut total = 0;
    for con in servers {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(con)
            .await?;
        total += info
            .lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .filter_map(|l| {
                l.split_once("calls=")
                    .and_then(|(_, rest)| rest.split(',').next())
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .sum::<u64>();
    }
    Ok(Some(total))
}

fn print_table(rows: &[Row], with_redis: bool, legend: bool) {
    const W: [usize; 13] = [30, 8, 8, 8, 5, 4, 9, 9, 6, 13, 8, 9, 14];
    let line = |cells: [String; 13]| {
        let mut out = format!("{:<w$}", cells[0], w = W[0]);
        for (cell, w) in cells.iter().zip(W).skip(1) {
            out.push_str(&format!("  {cell:>w$}"));
        }
        println!("{}", out.trim_end());
    };
    println!();
    line([
        "mode".into(),
        "reserved".into(),
        "sold out".into(),
        "oversold".into(),
        "stale".into(),
        "503".into(),
        "p50".into(),
        "p99".into(),
        "req/s".into(),
        "lock reqs/req".into(),
        "handoffs".into(),
        "conflicts".into(),
        if with_redis { "Redis cmds/req" } else { "" }.into(),
    ]);
    for r in rows {
        line([
            r.label.clone(),
            r.reserved.to_string(),
            r.out_of_stock.to_string(),
            r.oversold.to_string(),
            r.stale.to_string(),
            r.unavailable.to_string(),
            format_ms(r.p50),
            format_ms(r.p99),
            format!("{:.0}", r.throughput),
            format!("{:.3}", r.lock_requests as f64 / REQUESTS as f64),
            r.handoffs.to_string(),
            r.conflicts.to_string(),
            r.server_commands
                .map(|c| format!("{:.2}", c as f64 / REQUESTS as f64))
                .unwrap_or_default(),
        ]);
    }
    let sized: Vec<&Row> = rows.iter().filter(|r| r.sizing.is_some()).collect();
    if !sized.is_empty() {
        println!(
            "\nsizing (GET /stats histograms, worst instance): lock wait p99 / hold p99 / most renewals of one lease"
        );
        for r in sized {
            if let Some((w, h, n)) = r.sizing {
                println!(
                    "  {:<30} {:>9} / {:>9} / {n:.0}",
                    r.label,
                    format_ms(Duration::from_secs_f64(w)),
                    format_ms(Duration::from_secs_f64(h))
                );
            }
        }
    }
    if legend {
        print_legend(with_redis);
    }
    checks(rows);
}

fn print_legend(with_redis: bool) {
    let what = if with_redis { "Redis" } else { "in-process" };
    println!(
        "\n\
         reserved + sold out = {REQUESTS} per mode. oversold = reservations acknowledged (or logged\n\
         by the database) beyond the units actually taken from stock: must be 0. stale = writes\n\
         the database refused for an outdated fencing token. 503 = lock timeouts, lost leases and\n\
         stale writers. p50/p99 = client-side latency of POST /items/{{sku}}/reserve.\n\
         lock reqs/req = requests the instances sent to the {what} lock backend (acquire-or-enqueue,\n\
         release-and-wake-next, extend, leave; one script round trip each) per reserve request\n\
         (each runs one critical section). handoffs = leases passed to a local waiter in memory.\n\
         optimistic = no lock: read the row and its version, write only if the version is\n\
         unchanged, else read again (conflicts = such retries; after {OPTIMISTIC_ATTEMPTS} the request\n\
         answers 503). Its p50/p99 are of POST /items/{{sku}}/reserve-optimistic."
    );
    if with_redis {
        println!(
            "plain Redis lock (SET NX PX) = no lockflight: each request sends SET <sku> <random token>\n\
             NX PX 30000, again every 1 ms while another holds the lock (until the 5 s wait timeout),\n\
             and releases with a compare-and-delete script; its lock reqs are those SETs and releases.\n\
             A plain lock has no fencing token: its writes are not fenced (stale is 0 because nothing\n\
             can be checked) and a holder that outlives the TTL would go unnoticed.\n\
             Redis cmds/req = commands the Redis server ran per reserve request (INFO commandstats:\n\
             EVALSHA, SET, the commands inside the scripts, PUBLISH, ...)."
        );
    }
}

fn checks(rows: &[Row]) {
    let mut problems = Vec::new();
    for r in rows {
        if r.oversold != 0 {
            problems.push(format!("{}: OVERSOLD {} units", r.label, r.oversold));
        }
        if !r.fence_order_ok {
            problems.push(format!(
                "{}: fencing tokens not increasing in reservation order",
                r.label
            ));
        }
        if r.errors != 0 {
            problems.push(format!("{}: {} failed requests", r.label, r.errors));
        }
    }
    if problems.is_empty() {
        println!(
            "\nchecks passed: nothing oversold, fencing tokens increased with every fenced \
             reservation of a SKU, no failed requests"
        );
    } else {
        println!();
        for p in problems {
            println!("PROBLEM: {p}");
        }
    }
}

fn format_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

// ---------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------

/// A child running this executable (`serve` or `gateway`), listening on `url`.
#[derive(Debug)]
struct Proc {
    name: String,
    url: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Proc {
    /// Starts `current_exe() args...` with `envs` on 127.0.0.1 and a free port, and
    /// waits until it prints its address.
    async fn spawn(name: &str, args: &[&str], envs: &[(&str, String)]) -> Result<Proc, BoxError> {
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .env_remove("REDIS_URL")
            .env("BIND", "127.0.0.1")
            .env("PORT", "0")
            .env("INVENTORY_EXIT_ON_STDIN_EOF", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some((_, url)) = line.split_once("listening on ") {
                    return Ok::<_, BoxError>(url.trim().to_owned());
                }
            }
            Err(format!("{name} exited before listening").into())
        })
        .await
        .map_err(|_| format!("{name} did not start within {START_TIMEOUT:?}"))??;
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Proc {
            name: name.to_owned(),
            url,
            child,
            stdin,
        })
    }

    /// Graceful stop: close its stdin, wait up to 5 s, then kill.
    async fn stop(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The supervisor of the private Redis: `$1` the binary, then its arguments. It
/// kills the server when its stdin (a pipe held by the demo) closes — also when the
/// demo dies without cleaning up.
const SUPERVISOR: &str = r#"
bin=$1; shift
"$bin" "$@" </dev/null >/dev/null 2>&1 &
pid=$!
trap 'kill -9 "$pid" 2>/dev/null; exit 0' HUP INT TERM
read -r _ || true
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
exit 0
"#;

/// A private `redis-server` on a free loopback port.
#[derive(Debug)]
struct PrivateRedis {
    url: String,
    supervisor: Child,
    stdin: Option<ChildStdin>,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    async fn start(bin: &Path, extra: &[&str]) -> Result<PrivateRedis, BoxError> {
        let mut last = String::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let dir = tempfile::tempdir()?;
            let log = dir.path().join("redis.log");
            let mut supervisor = Command::new("sh")
                .arg("-c")
                .arg(SUPERVISOR)
                .arg("sh")
                .arg(bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(extra)
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let stdin = supervisor.stdin.take();
            let redis = PrivateRedis {
                url: format!("redis://127.0.0.1:{port}/"),
                supervisor,
                stdin,
                _dir: dir,
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if ping(&redis.url).await {
                    return Ok(redis);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            last = std::fs::read_to_string(&log).unwrap_or_default();
            redis.stop().await;
        }
        Err(format!("redis-server did not start; its log:\n{last}").into())
    }

    /// `n` cluster-enabled servers joined into a Redis Cluster of `n` primaries
    /// (no replicas) by `redis-cli --cluster create`, ready when every node reports
    /// `cluster_state:ok`.
    async fn start_cluster(bin: &Path, n: usize) -> Result<Vec<PrivateRedis>, BoxError> {
        let cli = find_on_path("redis-cli").ok_or("--cluster needs redis-cli")?;
        let mut nodes = Vec::new();
        for _ in 0..n {
            let args = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"];
            nodes.push(PrivateRedis::start(bin, &args).await?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| {
                n.url
                    .trim_start_matches("redis://")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .collect();
        let out = Command::new(cli)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )
            .into());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            loop {
                let mut con = redis_connection(&node.url).await?;
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut con)
                    .await?;
                if info.contains("cluster_state:ok") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err("the private cluster did not reach cluster_state:ok".into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(nodes)
    }

    async fn stop(mut self) {
        drop(self.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.supervisor.wait()).await;
    }
}

async fn ping(url: &str) -> bool {
    let Ok(mut con) = redis_connection(url).await else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut con)
        .await
        .is_ok()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}
