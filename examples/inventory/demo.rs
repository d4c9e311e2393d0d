//! The demo: inventory instances as separate processes on one Redis, a bounded
//! burst of concurrent reservations on a few hot SKUs per locking mode, and a table
//! of what each mode cost — first a plain Redis lock without lockflight (`SET NX
//! PX`, the `plain` mode), then lockflight's modes, then optimistic locking.
//!
//! Then, with Redis, a leadership failover: new instances campaign for the
//! leader-only job, the leader is killed with SIGKILL, and another takes over in a
//! greater term.
//!
//! Its parts: `demo/servers.rs` (the private Redis, the instance and gateway
//! processes, all stopped at the end), `demo/scenario.rs` (one mode's run: start,
//! stock, fire, check the books), `demo/load.rs` (the burst of reservations),
//! `demo/report.rs` (the table, its legend and the checks) and `demo/failover.rs`
//! (the failover of the leader-only job).

use std::time::Instant;

use crate::app;
use crate::cli::Locking;
use crate::client::BoxError;

mod failover;
mod load;
mod report;
mod scenario;
mod servers;

use scenario::Scenario;

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
        label: "plain lock (SET NX PX)",
        slug: "plain",
        locking: Locking::Plain,
        gateway: false,
        endpoint: "reserve",
    },
    Mode {
        label: "lockflight default",
        slug: "handoff",
        locking: Locking::Handoff,
        gateway: false,
        endpoint: "reserve",
    },
    Mode {
        label: "lockflight default + gw",
        slug: "handoff-gw",
        locking: Locking::Handoff,
        gateway: true,
        endpoint: "reserve",
    },
    Mode {
        label: "lockflight no handoff",
        slug: "coalesced",
        locking: Locking::Coalesced,
        gateway: false,
        endpoint: "reserve",
    },
    Mode {
        label: "lockflight no handoff + gw",
        slug: "coalesced-gw",
        locking: Locking::Coalesced,
        gateway: true,
        endpoint: "reserve",
    },
    Mode {
        label: "optimistic (version col.)",
        slug: "optimistic",
        locking: Locking::Handoff,
        gateway: false,
        endpoint: "reserve-optimistic",
    },
];

/// Runs the demo; with `cluster`, on a private 3-shard Redis Cluster.
pub async fn run(cluster: bool) -> Result<(), BoxError> {
    let started = Instant::now();
    println!("lockflight demo: inventory instances reserving hot SKUs\n");

    let (target, private) = servers::start_redis(cluster).await?;
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
         {HOT_SKUS} hot SKUs\nwith {STOCK} units each, spread over {instances} instance \
         process(es) sharing one SQLite file\n"
    );

    let mut scenario =
        Scenario::new(instances, target.as_ref(), db_path.clone(), db.clone()).await?;
    let mut rows = Vec::new();
    for mode in &modes {
        rows.push(scenario.run(*mode, HOT).await?);
    }
    report::print_table(&rows, target.is_some(), true);
    if !cold_modes.is_empty() {
        println!(
            "\nLow contention: the same {REQUESTS} reservations over {COLD_SKUS} SKUs \
             ({} requests per SKU),\nwhere optimistic locking needs no lock round trip:\n",
            REQUESTS / COLD_SKUS
        );
        let mut cold = Vec::new();
        for mode in &cold_modes {
            cold.push(scenario.run(*mode, COLD).await?);
        }
        report::print_table(&cold, target.is_some(), false);
    }
    match &target {
        Some(target) => failover::run(target, &db_path, &db).await?,
        None => println!(
            "\nLeadership failover: skipped (it kills an instance process; without Redis there \
             is one)"
        ),
    }
    db.close().await;
    for redis in private {
        redis.stop().await;
    }
    println!("\ndone in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
