//! The lockflight demo: several inventory instances (separate processes) sharing
//! one Redis and one SQLite database take a burst of concurrent reservations on a
//! few hot SKUs, once per locking mode — a plain Redis lock without lockflight
//! (`SET NX PX`, 1 ms retries, compare-and-delete release), lockflight
//! (coalesced), lockflight with lease handoff, each of those two behind a
//! SKU-routing gateway, and optimistic locking — and print what each mode cost.
//! Then, with Redis, a leadership failover: the leader of the instances'
//! leader-only job is killed with SIGKILL and another takes over in a greater term.
//!
//! ```text
//! cargo run -p examples --example demo
//! ```
//!
//! Without `REDIS_URL` it starts a private `redis-server` (temporary directory, no
//! persistence, stopped at exit) if one is installed; otherwise it runs one
//! instance on the in-process backend and says so. It is the `inventory` example
//! (the `inventory` library, `examples/inventory/`) started in demo mode: it runs
//! copies of its own executable as the instances and the gateway.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    inventory::cli::main("demo").await
}
