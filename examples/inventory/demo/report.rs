//! The demo's report: one row per mode, the table, its legend and the checks
//! (nothing oversold, fencing tokens in order, no failed request).

use std::time::Duration;

use super::REQUESTS;
use crate::app::OPTIMISTIC_ATTEMPTS;

/// One mode's results.
#[derive(Debug, Default)]
pub(super) struct Row {
    pub(super) label: String,
    /// The mode's short name (`plain`, `handoff`, ...).
    pub(super) slug: &'static str,
    pub(super) reserved: u64,
    pub(super) out_of_stock: u64,
    pub(super) oversold: i64,
    pub(super) stale: u64,
    pub(super) unavailable: u64,
    pub(super) errors: u64,
    pub(super) p50: Duration,
    pub(super) p99: Duration,
    pub(super) throughput: f64,
    pub(super) lock_requests: u64,
    pub(super) server_commands: Option<u64>,
    pub(super) handoffs: u64,
    /// Optimistic writes that found the row changed (and retried).
    pub(super) conflicts: u64,
    /// Sizing data from the instances' histograms (cumulative since start).
    pub(super) sizing: Option<(f64, f64, f64)>,
    pub(super) fence_order_ok: bool,
}

/// The widest line the report prints.
const MAX_WIDTH: usize = 100;

pub(super) fn print_table(rows: &[Row], with_redis: bool, legend: bool) {
    const W: [usize; 10] = [26, 8, 8, 5, 4, 7, 7, 5, 8, 8];
    let line = |cells: [String; 10]| {
        let mut out = format!("{:<w$}", cells[0], w = W[0]);
        for (cell, w) in cells.iter().zip(W).skip(1) {
            out.push_str(&format!(" {cell:>w$}"));
        }
        let out = out.trim_end().to_owned();
        debug_assert!(out.chars().count() <= MAX_WIDTH, "{out}");
        println!("{out}");
    };
    println!();
    line([
        "mode".into(),
        "reserved".into(),
        "oversold".into(),
        "stale".into(),
        "503".into(),
        "p50 ms".into(),
        "p99 ms".into(),
        "req/s".into(),
        "lock/req".into(),
        if with_redis { "cmds/req" } else { "" }.into(),
    ]);
    for r in rows {
        line([
            r.label.clone(),
            r.reserved.to_string(),
            r.oversold.to_string(),
            r.stale.to_string(),
            r.unavailable.to_string(),
            format!("{:.1}", r.p50.as_secs_f64() * 1000.0),
            format!("{:.1}", r.p99.as_secs_f64() * 1000.0),
            format!("{:.0}", r.throughput),
            format!("{:.3}", r.lock_requests as f64 / REQUESTS as f64),
            r.server_commands
                .map(|c| format!("{:.2}", c as f64 / REQUESTS as f64))
                .unwrap_or_default(),
        ]);
    }
    let counted = |what: &str, of: fn(&Row) -> u64| {
        let parts: Vec<String> = rows
            .iter()
            .filter(|r| of(r) > 0)
            .map(|r| format!("{} {}", r.label, of(r)))
            .collect();
        if !parts.is_empty() {
            println!("{what}: {}", parts.join(", "));
        }
    };
    println!();
    counted("handoffs", |r| r.handoffs);
    counted("optimistic retries", |r| r.conflicts);
    let sold_out: Vec<String> = rows.iter().map(|r| r.out_of_stock.to_string()).collect();
    println!("sold out, in table order: {}", sold_out.join(", "));
    let sized: Vec<&Row> = rows.iter().filter(|r| r.sizing.is_some()).collect();
    if !sized.is_empty() {
        println!(
            "\nsizing (GET /stats histograms, worst instance): wait p99 / hold p99 / most renewals"
        );
        for r in sized {
            if let Some((w, h, n)) = r.sizing {
                println!(
                    "  {:<26} {:>9} / {:>9} / {n:.0}",
                    r.label,
                    format_ms(Duration::from_secs_f64(w)),
                    format_ms(Duration::from_secs_f64(h))
                );
            }
        }
    }
    if let Some(takeaway) = takeaway(rows) {
        println!("\n{takeaway}");
    }
    if legend {
        print_legend(with_redis);
    }
    checks(rows);
}

/// The table in one line (at most [`MAX_WIDTH`]): lockflight's default against
/// the plain lock (or, on the in-process backend, against handoff turned off), or
/// against optimistic locking where that is the other row.
fn takeaway(rows: &[Row]) -> Option<String> {
    let by = |slug: &str| rows.iter().find(|r| r.slug == slug);
    let ours = by("handoff")?;
    let per_req = |r: &Row| r.lock_requests as f64 / REQUESTS as f64;
    let line = if let Some(plain) = by("plain") {
        format!(
            "takeaway: lockflight's default sent {:.0}x fewer lock requests than a plain lock \
             ({:.2} vs {:.2}/req)",
            per_req(plain) / per_req(ours).max(f64::MIN_POSITIVE),
            per_req(ours),
            per_req(plain),
        )
    } else if let Some(off) = by("coalesced") {
        format!(
            "takeaway: handoff (lockflight's default) sent {:.2} lock requests/req, {:.2} without",
            per_req(ours),
            per_req(off),
        )
    } else {
        let optimistic = by("optimistic")?;
        format!(
            "takeaway: writers rarely meet here: optimistic {:.0} req/s, lockflight's default {:.0}",
            optimistic.throughput, ours.throughput
        )
    };
    debug_assert!(line.chars().count() <= MAX_WIDTH, "{line}");
    Some(line)
}

fn print_legend(with_redis: bool) {
    let what = if with_redis { "Redis" } else { "in-process" };
    println!(
        "\n\
         lockflight default = coalescing and handoff, as Locker::builder sets them; no handoff =\n\
         Handoff::disabled(); + gw = behind a gateway that routes each SKU to one instance.\n\
         reserved + sold out = {REQUESTS} per mode. oversold = reservations acknowledged (or logged\n\
         by the database) beyond the units actually taken from stock: must be 0. stale = writes\n\
         the database refused for an outdated fencing token. 503 = lock timeouts, lost leases and\n\
         stale writers. p50/p99 = client-side latency of POST /items/{{sku}}/reserve.\n\
         lock/req = requests the instances sent to the {what} lock backend (acquire-or-enqueue,\n\
         release-and-wake-next, renew, leave; one script round trip each) per reserve request\n\
         (each runs one critical section). handoffs = leases passed to a local waiter in memory.\n\
         optimistic = no lock: read the row and its version, write only if the version is\n\
         unchanged, else read again (retries counted above; after {OPTIMISTIC_ATTEMPTS} the request\n\
         answers 503). Its p50/p99 are of POST /items/{{sku}}/reserve-optimistic."
    );
    if with_redis {
        println!(
            "plain lock (SET NX PX) = no lockflight: each request sends SET <sku> <random token>\n\
             NX PX 30000, again every 1 ms while another holds the lock (until the 5 s wait timeout),\n\
             and releases with a compare-and-delete script; its lock/req are those SETs and releases.\n\
             A plain lock has no fencing token: its writes are not fenced (stale is 0 because nothing\n\
             can be checked) and a holder that outlives the TTL would go unnoticed.\n\
             cmds/req = commands the Redis server ran per reserve request (INFO commandstats:\n\
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
            "\nchecks passed: nothing oversold, fencing tokens increased with every fenced\n\
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
