//! README.md as a new user's crate sees it.
//!
//! This crate depends on exactly what README's "Install" section tells a user to
//! add, plus `redis = "0.32"`, a redis-rs of another version than lockflight's
//! that many services already have. So:
//!
//! * `cargo test -p lockflight-readme --doc` compiles every Rust block of README
//!   (and runs those that need no server) where `redis::Client` is not the type
//!   lockflight's API takes: README's code must name `lockflight::redis`;
//! * `build.rs` extracts README's quick start and axum example, and the binaries
//!   `readme-quickstart` and `readme-axum` are those programs, as written;
//! * `tests/readme.rs` runs both against a private `redis-server` (the axum one
//!   answering a real HTTP request), checks that README's Install section names
//!   this crate's dependencies, and that README stays a landing page (at most
//!   200 lines).
//!
//! README is compiled here and nowhere else.

// Every Rust block of README is a doctest of this item.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
