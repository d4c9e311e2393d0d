//! One mode's run: start its instances (and gateway), stock the shelves, fire the
//! burst, and check the books — the final stock, the reservation log and the
//! acknowledgements must agree.

use std::path::PathBuf;

use serde_json::json;
use sqlx::SqlitePool;
use tokio::task::JoinSet;

use super::load::{burst, percentile};
use super::report::Row;
use super::servers::{Proc, Target, redis_connection};
use super::{Mode, REQUESTS, Shelf};
use crate::app;
use crate::client::{BoxError, Http};

/// What every mode's run shares: where the instances lock, their database, the
/// HTTP client, and a connection to each Redis server to count its commands.
pub(super) struct Scenario {
    instances: usize,
    redis_env: Option<(&'static str, String)>,
    db_path: PathBuf,
    db: SqlitePool,
    http: Http,
    redis: Vec<redis::aio::MultiplexedConnection>,
}

impl Scenario {
    /// `instances` instances per mode, locking at `target` (the in-process
    /// backend without one), sharing the SQLite file `db_path` (open as `db`).
    pub(super) async fn new(
        instances: usize,
        target: Option<&Target>,
        db_path: PathBuf,
        db: SqlitePool,
    ) -> Result<Self, BoxError> {
        let mut redis = Vec::new();
        for url in target.iter().flat_map(|t| t.servers()) {
            redis.push(redis_connection(&url).await?);
        }
        Ok(Scenario {
            instances,
            redis_env: target.map(Target::env),
            db_path,
            db,
            http: Http::new(),
            redis,
        })
    }

    /// Starts `mode`'s instances (concurrently) and, in gateway modes, the
    /// gateway: `(instances sorted by name, gateway)`.
    async fn start(&self, mode: Mode) -> Result<(Vec<Proc>, Option<Proc>), BoxError> {
        let mut starting = JoinSet::new();
        for i in 0..self.instances {
            let name = format!("{}", (b'a' + i as u8) as char);
            let mut envs = vec![
                ("INSTANCE_NAME", name.clone()),
                ("INVENTORY_LOCKING", mode.locking.name().to_owned()),
                ("DATABASE_PATH", self.db_path.display().to_string()),
                // The leader-only job is off here: its election's requests would
                // count in every mode's lock/req and cmds/req (it runs in the
                // failover that follows the tables).
                ("INVENTORY_LEADER_JOB", "off".to_owned()),
            ];
            if let Some((var, value)) = &self.redis_env {
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
        Ok((procs, gateway))
    }

    /// Runs `mode` on `shelf`: one row of the table.
    pub(super) async fn run(&mut self, mode: Mode, shelf: Shelf) -> Result<Row, BoxError> {
        let (procs, gateway) = self.start(mode).await?;
        let Scenario {
            db, http, redis, ..
        } = self;
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
            slug: mode.slug,
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
