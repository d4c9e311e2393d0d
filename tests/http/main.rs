//! The HTTP edge through real HTTP: axum apps served on a loopback port, a real
//! HTTP/1.1 client (hyper-util's), and real `redis-server`s: keys from the
//! router's own parameters, fail-closed keys, the lock taken after the body,
//! outages told apart from contention, idempotent routes, and one problem format
//! for every error.
#![cfg(feature = "axum")]

mod body;
mod fail_closed;
mod idempotency;
mod idempotency_fleet;
mod idempotency_paused;
mod keys;
mod outage;
mod support;
