//! README's "With axum", as written there (extracted by build.rs).
//!
//! `REDIS_URL` chooses the server (default `redis://127.0.0.1:6379`),
//! `LISTEN_ADDR` the address it serves on (default `127.0.0.1:3000`).

include!(concat!(env!("OUT_DIR"), "/axum.rs"));
