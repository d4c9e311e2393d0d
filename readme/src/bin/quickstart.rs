//! README's "Quick start", as written there (extracted by build.rs).
//!
//! `REDIS_URL` chooses the server (default `redis://127.0.0.1:6379`).

include!(concat!(env!("OUT_DIR"), "/quickstart.rs"));
