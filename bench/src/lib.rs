//! The contention benchmark's harness (`benches/contention.rs` is its binary,
//! `tests/smoke.rs` its CI smoke run; both re-execute themselves as the worker
//! processes).
//!
//! Contention benchmark: P worker **processes** × T Tokio tasks contend for Redis
//! locks through lockflight, side by side with a plain Redis lock (`SET NX PX` + 1 ms
//! retry + Lua compare-and-delete, `PlainLock` in `worker/plain.rs`) and an in-process
//! `tokio::sync::Mutex` floor.
//!
//! ```text
//! cargo bench -p bench --bench contention                       # default run (~6 min on 2 cores)
//! LOCKFLIGHT_BENCH_SMOKE=1 cargo bench -p bench --bench contention   # tiny, still checks correctness
//! LOCKFLIGHT_BENCH_COMPARE=0 LOCKFLIGHT_BENCH_P=4 LOCKFLIGHT_BENCH_T=1,8,64 cargo bench -p bench --bench contention
//! ```
//!
//! The default run has two parts. The **comparison matrix** ([`compare_cells`]): the
//! `hotkey-rmw` workload at P × T ∈ {1×1, 1×8, 1×64, 4×1, 4×8, 4×64} and
//! `hotkey-rmw-hold1ms` at 1×1, 4×1 and 4×64, each in the modes plain, naive,
//! coalesced, default, cached (the default plus lease caching, 2 ms linger) and
//! floor; then 4, 16 and 64 instances × 2 tasks (coalesced and default) for the
//! cost of one hot key against the number of waiting instances. Then the
//! **per-workload matrix**: each of `LOCKFLIGHT_BENCH_WORKLOADS` (default `zipf`) at
//! P = `LOCKFLIGHT_BENCH_P` × each T of `LOCKFLIGHT_BENCH_T`, in each of
//! `LOCKFLIGHT_BENCH_MODES`. Last, the **topology table** ([`topology`]): the hot
//! key on one server, a 3-shard Cluster and Sentinel, each started for it (in
//! a full run without a delay proxy; `cargo bench -p bench --bench topology` runs
//! it alone).
//!
//! For every point of the hot-key workloads the report also says how busy the key
//! was (the table *How busy the hot key is*, and `efficiency`, `transfers_per_s`,
//! `idle_us_per_transfer`, `idle_us_per_turn` in `results.jsonl`): the critical
//! sections' own time over the elapsed time, the transfers of the lock between
//! processes per second, and the key's mean idle time from one section's end to the
//! next one's start, at a transfer and at a turn inside a process (each worker
//! records its sections' start and end on the machine's clock).
//!
//! Knobs (environment): `LOCKFLIGHT_BENCH_SMOKE=1` (P = 2, T = 4, 0.5 s, one round,
//! no comparison matrix), `LOCKFLIGHT_BENCH_SECS` (per point, default 2),
//! `LOCKFLIGHT_BENCH_COMPARE` (`0`: skip the comparison matrix; or a comma list of its
//! `PxT` cells to keep, e.g. `1x1,4x64`), `LOCKFLIGHT_BENCH_COMPARE_MODES` (only
//! these modes in the comparison cells), `LOCKFLIGHT_BENCH_DELAY_US` (workers reach
//! Redis through a proxy that delays each direction by this many µs: `250` is a
//! 0.5 ms round trip; see `delay.rs`), `LOCKFLIGHT_BENCH_P`, `LOCKFLIGHT_BENCH_T`
//! (comma list), `LOCKFLIGHT_BENCH_REPEAT` (rounds per point, default 3: on a small
//! VM the same point varies by 2–3× from run to run, so the modes of one point are
//! run interleaved and the median round is reported), `LOCKFLIGHT_BENCH_WORKLOADS`
//! (`hotkey-rmw,hotkey-rmw-hold1ms,zipf`), `LOCKFLIGHT_BENCH_MODES`
//! (`plain,naive,coalesced,default,cached,handoff,floor`), `LOCKFLIGHT_BENCH_WORKER_THREADS`
//! (Tokio workers per process, default 2; 0 = current-thread runtime),
//! `LOCKFLIGHT_BENCH_TOPOLOGY` (`1`/`0`: measure the topology table or not),
//! `REDIS_URL`.
//!
//! The floor runs one process with P·T tasks. Outputs go to `target/lockflight-bench/`
//! (`results.jsonl`, `results.md`, `contention.svg`; smoke runs to `…/smoke/`).
//!
//! Without `REDIS_URL` a private `redis-server` is started on a free loopback port
//! (`testkit`); with it, that server is used (its `INFO commandstats` then
//! includes other clients' traffic). Run without `--bench` (as `cargo test --benches`
//! does), the smoke configuration runs.
//!
//! # How a point runs
//!
//! The coordinator re-executes a worker command (the bench binary, or the smoke
//! test's binary, see `tests/smoke.rs`) with [`WORKER_ENV`] set, once per process.
//! Protocol, one line each, worker output lines are marked with `LFBENCH`:
//!
//! 1. coordinator → worker stdin: the worker spec (JSON, a `WorkerSpec`);
//! 2. worker → stdout: `LFBENCH READY` once connected and subscribed;
//! 3. coordinator → every worker: `GO <start µs> <end µs>` (unix time): all start at
//!    the same instant and stop by themselves at the same instant (start barrier);
//! 4. worker → stdout: `LFBENCH RESULT <json>` (a `WorkerResult`; or `LFBENCH ERROR
//!    <message>`). Both messages are typed: a missing or unknown field is an error,
//!    not a zero.
//!
//! # Correctness oracle
//!
//! Each critical section reads a Redis counter and writes it back incremented; it
//! records `(key, value read, fencing token)`. If mutual exclusion holds, the values
//! read for one key are exactly `0..n` (no duplicate, no gap) and the final counter is
//! `n`; ordered by that value (the true global order of the critical sections), the
//! fencing tokens strictly increase — across all processes, handoffs included (this
//! implies that each worker's own sequence strictly increases and that the union has
//! no duplicate). No lease may be lost, no lock may time out, no lock key may remain
//! (the plain lock's keys included; it has no fencing tokens, so only its counter
//! oracle applies). Any violation makes [`run`] fail, and the bench exit non-zero.
//!
//! # Modules
//!
//! `config` (workloads, modes, the matrix, the environment knobs), `protocol` (the
//! coordinator ↔ worker messages), `worker` (a worker process: the lock modes, the
//! plain-lock baseline, the critical section), `coordinator` (points, rounds, the start barrier; `verify`: the
//! correctness oracles; `scenarios`: the uncontended and wake-up measurements),
//! `report` (the results files, the Markdown tables, the targets, the chart),
//! `topology` (the topology table: in-process instances on a Cluster, Sentinel and
//! one server), `scale` (the scale curves: cost against keys, waiters, held leases
//! and instances; `benches/scale.rs`).

mod config;
mod coordinator;
mod delay;
mod protocol;
mod report;
pub mod scale;
pub mod topology;
mod worker;

use std::time::Duration;

use hdrhistogram::Histogram;

pub use config::{Cell, Config, Mode, WorkerCommand, Workload, compare_cells};
pub use coordinator::run;
pub use protocol::WORKER_ENV;
pub use report::{Point, Report, Uncontended, Wake};
pub use worker::worker_main;

/// The wait-time histogram: 1 µs .. 120 s, 3 significant digits.
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

async fn data_connection(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    // TCP_NODELAY, as lockflight's own connections: the plain lock and the
    // critical sections must not pay Nagle's delay behind a real round trip.
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|e| format!("redis url {url}: {e}"))?;
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    let client = redis::Client::open(info.set_tcp_settings(tcp))
        .map_err(|e| format!("redis url {url}: {e}"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(10)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("connect to {url}: {e}"))
}
