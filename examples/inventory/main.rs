//! An inventory service guarded by lockflight: axum over SQLite (sqlx), one lock
//! per SKU, fencing tokens checked by the database.
//!
//! ```text
//! cargo run -p examples --example inventory                      # one instance, in-process locks
//! REDIS_URL=redis://127.0.0.1:6379 PORT=3001 cargo run -p examples --example inventory
//! cargo run -p examples --example inventory -- gateway a=http://127.0.0.1:3001 b=...
//! cargo run -p examples --example demo                           # the multi-process demo
//! ```
//!
//! Endpoints: `POST /items {sku, name, stock}`, `GET /items`, `GET /items/{sku}`
//! (concurrent identical reads share one response), `POST /items/{sku}/reserve {qty}`
//! (under the SKU's lock, fenced at the database; with an `Idempotency-Key`, a
//! retry is replayed and reserves once, except in the `plain` mode), `GET /stats`,
//! and the other lock shapes of `shapes.rs`: `POST /checkout` (a multi-key lock, a
//! per-tenant semaphore cap), `GET /items/{sku}/stock` and
//! `POST /items/{sku}/restock` (a read-write lock),
//! `POST /items/{sku}/reserve-optimistic` (no lock).
//!
//! In the background the instances elect a leader for one job (election
//! `inventory:jobs`, identity `name@port`, lease TTL `JOB_LEASE_TTL_MS`): only the
//! leader runs it, from when it gains leadership until it loses it, and another
//! instance takes over about one lease TTL after the leader dies. The job releases
//! reservations older than `RESERVATION_HOLD_SECS` (their units go back to stock)
//! every `JOB_EVERY_MS`, each sweep fenced at the database by the leader's term:
//! once a newer term swept, a sweep under an older one (a leader paused past its
//! lease, resuming) is refused. `GET /stats` shows
//! who leads, in which term, and this instance's sweeps; `INVENTORY_LEADER_JOB=off`
//! turns the job off.
//!
//! See `cli.rs` for the environment variables, `app.rs` for the service, `job.rs`
//! for the leader-only job, `gateway.rs` for the SKU-routing gateway, `sizing.rs`
//! for the histograms in `/stats` and `demo.rs` for the demo.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    inventory::cli::main("serve").await
}
