//! The lock kinds and the locker against a real Redis: one test binary whose
//! modules each cover one subject (a file or a folder of its own).
//!
//! * [`redis_lock`]: the mutex (exclusion, fencing, wake-ups, crashes, renewal,
//!   loss, bad input, cancel safety, regressions); [`rwlock`]: read-write locks;
//!   [`semaphore`]: semaphores; [`multi`]: `lock_many`; [`fair`]: fair mode;
//!   [`coalescing`]: the coalescing core; [`caching`]: lease caching;
//!   [`wakeups`]: a wake-up racing a Busy reply; [`reentry`]; [`options`]: per-call
//!   and per-route settings; [`takeover`] (feature `inspect`): announced forced
//!   releases; [`programs`]: the guide's programs as child processes.
//! * [`jobs`]: scheduled jobs (`run_exclusive`) across replica processes.
//! * [`fence`]: fenced writes on Redis, a Cluster, PostgreSQL and SQLite.
//! * [`scripts`]: the Redis backend's scripts and connection checks (also run on
//!   Valkey by `scripts/test`).
//!
//! Tests that only need *a* Redis share [`testkit::shared`] under their own
//! prefix; tests that disturb a server start their own.

mod caching;
mod coalescing;
mod fair;
mod fence;
mod jobs;
mod multi;
mod options;
mod programs;
mod redis_lock;
mod reentry;
mod rwlock;
mod scripts;
mod semaphore;
#[cfg(feature = "inspect")]
mod takeover;
mod wakeups;
