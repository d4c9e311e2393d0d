//! The guide: lockflight topic by topic, beyond the API reference.
//!
//! Each page is a module without items, written in `docs/guide/` of the
//! repository; every code example on them is compiled and run as a test.
//!
//! * [`lock_family`]: the mutex, `lock_many`, the read-write lock, the semaphore,
//!   fair mode, singleflight, handoff, lease caching and hold limits.
//! * [`election`]: leader election, failover, identities, the term as a fencing
//!   token, compared with etcd, Curator and client-go.
//! * [`fencing`]: fenced writes to Redis, PostgreSQL and SQLite.
//! * [`scheduled_jobs`]: a job every replica fires, run at most once per tick,
//!   with `at_most` and `at_least`.
//! * [`axum`]: the tower layer and its axum glue: keys from path parameters, the
//!   lock after the body, failing closed, errors as problem responses.
//! * [`idempotency`]: `Idempotency-Key` requests run once and replayed, the
//!   answers, the settings, fencing the handler's writes, what it cannot promise.
//! * [`topology`]: connecting to one server, Sentinel, Cluster or Redlock; what
//!   mutual exclusion rests on in each; what each lock kind offers on each.
//! * [`testing`]: testing code that holds locks on a simulated lock server with
//!   fault knobs, on a paused clock.
//! * [`operating`]: the `lockflight` command (`doctor`, `inspect`, `list`,
//!   `release --force`, `selfcheck`), the Redis rights lockflight needs, logs and
//!   metrics.
//! * [`safety`]: what is guaranteed, what is not, and what a release reports.
//! * [`how_it_works`]: coalescing, the Redis protocol, leases, fencing tokens.
//! * [`performance`]: what coalescing saves under contention, and sizing.
//!
//! The examples of some pages need features (`testing`, `axum`, `cluster`,
//! `sentinel`, `sqlx-*`); their doctests run with `cargo test --all-features`.
// Links to items behind features resolve on docs.rs (all features) and in the
// all-features doc build that the test suite checks.
#![cfg_attr(
    not(all(
        feature = "axum",
        feature = "cluster",
        feature = "sentinel",
        feature = "sqlx-postgres",
        feature = "sqlx-sqlite",
        feature = "testing",
    )),
    allow(rustdoc::broken_intra_doc_links)
)]

// Every page is documented in every build; a page whose examples need features
// is left out of the doctests of a build without them.
#[doc = include_str!("../docs/guide/lock_family.md")]
pub mod lock_family {}

#[doc = include_str!("../docs/guide/election.md")]
pub mod election {}

#[doc = include_str!("../docs/guide/fencing.md")]
pub mod fencing {}

#[doc = include_str!("../docs/guide/scheduled_jobs.md")]
pub mod scheduled_jobs {}

#[cfg_attr(
    any(not(doctest), feature = "axum"),
    doc = include_str!("../docs/guide/axum.md")
)]
pub mod axum {}

#[cfg_attr(
    any(not(doctest), feature = "axum"),
    doc = include_str!("../docs/guide/idempotency.md")
)]
pub mod idempotency {}

#[cfg_attr(
    any(not(doctest), all(feature = "cluster", feature = "sentinel")),
    doc = include_str!("../docs/guide/topology.md")
)]
pub mod topology {}

#[cfg_attr(
    any(not(doctest), feature = "testing"),
    doc = include_str!("../docs/guide/testing.md")
)]
pub mod testing {}

#[doc = include_str!("../docs/guide/operating.md")]
pub mod operating {}

#[doc = include_str!("../docs/guide/safety.md")]
pub mod safety {}

#[doc = include_str!("../docs/guide/how_it_works.md")]
pub mod how_it_works {}

#[doc = include_str!("../docs/guide/performance.md")]
pub mod performance {}
