//! The inventory service's parts, shared by the `inventory` and `demo` examples
//! (each a `main` over [`cli::main`]) and by the inventory tests
//! (`examples/tests/inventory/`): [`app`] (the state, the handlers, the router,
//! and in `app/` the database, the reservation, the lock shapes, the plain lock
//! and the leader-only job), [`cli`] (the command line and the modes),
//! [`client`] (the HTTP client the demo and the tests use), [`demo`] (the
//! multi-process demo, its parts in `demo/`), [`gateway`] (the SKU-routing
//! gateway) and [`sizing`] (the connection pool's size).
//!
//! An example's insides, not an API: its items are public so that the examples
//! and the tests share one copy of them.

pub mod app;
pub mod cli;
pub mod client;
pub mod demo;
pub mod gateway;
pub mod sizing;
