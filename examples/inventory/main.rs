//! An inventory service guarded by lockflight: axum over SQLite (sqlx), one lock
//! per SKU, fencing tokens checked by the database.
//!
//! ```text
//! cargo run --example inventory --features axum                  # one instance, in-process locks
//! REDIS_URL=redis://127.0.0.1:6379 PORT=3001 cargo run --example inventory --features axum
//! cargo run --example inventory --features axum -- gateway a=http://127.0.0.1:3001 b=...
//! cargo run --example demo --features axum                       # the multi-process demo
//! ```
//!
//! Endpoints: `POST /items {sku, name, stock}`, `GET /items`, `GET /items/{sku}`
//! (concurrent identical reads coalesced), `POST /items/{sku}/reserve {qty}` (under
//! the SKU's lock, fenced at the database), `GET /stats`. See `cli.rs` for the
//! environment variables, `app.rs` for the service, `gateway.rs` for the SKU-routing
//! gateway and `demo.rs` for the demo.

mod app;
mod cli;
mod client;
mod demo;
mod gateway;
mod sizing;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    cli::main("serve").await
}
