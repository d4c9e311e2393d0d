//! # lockflight
//!
//! Redis distributed locks that stay cheap under contention.
//!
//! A plain Redis lock turns every waiting task of every instance into a client
//! polling Redis. lockflight coalesces inside each process: per key, only **one**
//! local task competes for the distributed lock; the others wait on in-memory
//! futures. By default the holder hands the still-valid lease straight to the next
//! local waiter ([`Handoff`]), within a fairness budget, so a hot key runs at close
//! to the speed of an in-process mutex while staying mutually exclusive across
//! instances.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockflight::Result<()> {
//! use std::time::Duration;
//! use lockflight::{Handoff, Locker, MemoryBackend};
//!
//! // RedisBackend::connect("redis://127.0.0.1:6379").await? in a real deployment.
//! let locker = Locker::builder(MemoryBackend::new())
//!     .lease_ttl(Duration::from_secs(30))
//!     .wait_timeout(Duration::from_secs(5))
//!     .handoff(Handoff::enabled())
//!     .build()?;
//!
//! let guard = locker.lock("sku:555").await?;
//! let fence = guard.fencing_token(); // pass it to the resource with every write
//! guard.release().await?;
//!
//! let reserved = locker
//!     .with_lock("sku:555", |info| async move { info.fencing_token > fence })
//!     .await?;
//! assert!(reserved);
//! # Ok(()) }
//! ```
//!
//! ## Guarantees
//!
//! 1. No two holders of one key whose validity windows overlap, across processes,
//!    while the backend keeps its semantics (ARCHITECTURE.md, "The lease protocol") and keeps its
//!    data: a Redis restart without persistence ends every lease early, and only
//!    fencing (2) protects the resource then.
//! 2. [`FencingToken`]s of a key strictly increase in acquisition order, handoffs
//!    included. With Redis, epochs are floored by the server's clock in µs, so they
//!    keep increasing after the fence key is lost as long as that clock does not
//!    step back.
//! 3. A guard never outlives its lease silently: a grant whose reply came back after
//!    its validity window is not a grant; [`LockGuard::is_lost`] is true and
//!    [`LockGuard::lost`] resolves no later than the end of the validity window,
//!    measured on the monotonic clock from when the acquire was sent, whatever the
//!    renewal task has done; [`Locker::with_lock`] drops the guarded work (or, with
//!    [`LossPolicy::Signal`], lets it watch a [`LossSignal`](guard::LossSignal)).
//! 4. Nothing leaks: when all tasks are done, no per-key state remains in the
//!    process and no lock remains in Redis (a killed holder's lock expires at its
//!    TTL; so does a lock whose release could not reach Redis).
//! 5. Cancelling any future at any `.await` keeps 1–4, and so does the shutdown of
//!    the runtime that ran background releases and renewals (a `Locker` may be used
//!    from one runtime after another).
//! 6. Bad input gets a clear [`Error`], never a panic, a hang, or a lock held by
//!    nobody.
//!
//! What is **not** guaranteed: mutual exclusion without fencing when a holder's
//! process pauses past its validity (it may act for a moment after resuming, before
//! it checks), when Redis loses data, or when clocks misbehave. Pass the fencing
//! token to the resource wherever a stale write would do harm.
//!
//! ## Where to start
//!
//! * The [`guide`]: the lock family, leader election, fenced writes, axum,
//!   testing, operating, choosing a topology, safety and how it works, each a
//!   page whose examples are compiled.
//! * [`Locker`]: `lock`, `lock_with_options` (per-call [`LockOptions`]), `try_lock`,
//!   `with_lock`, `lock_many` (a [`MultiGuard`](guard::MultiGuard) over several
//!   keys), `singleflight` (concurrent callers share one result), `stats`; the lock
//!   family: [`rwlock`](Locker::rwlock) (read and write) and [`semaphore`](Locker::semaphore); fair mode
//!   ([`Contention::Fair`]).
//! * [`election`]: leader election on the mutex's lease ([`Locker::election`]):
//!   campaign, run while leading, resign, and who leads, for anyone.
//! * [`job`]: scheduled jobs that run at most once per tick across replicas
//!   ([`Locker::run_exclusive`]), composed with any timer.
//! * [`RedisBackend`] for one Redis server, a Redis Cluster (feature `cluster`) or a
//!   primary behind Sentinel (feature `sentinel`); [`RedlockBackend`](backend::RedlockBackend) for a quorum
//!   of independent primaries; [`MemoryBackend`] for a single process.
//! * [`layer`] for tower and axum; [`backend`] for the backends (and, with the
//!   feature `unstable-backend-api`, the backend interface); [`guard`] for what a holder
//!   sees ([`LossSignal`](guard::LossSignal), the [`Loss`](guard::Loss) future,
//!   [`LockInfo`](guard::LockInfo)); [`error`] for [`Phase`](error::Phase).
//! * `testing` (feature `testing`): a simulated lock server on Tokio's clock, with
//!   fault knobs, for testing code that holds locks.
//!
//! ## Layers
//!
//! Modules depend on each other top-down only, along the data path: [`layer`]
//! (tower, axum) → `locker` (the [`Locker`] handle and its calls, [`LockGuard`],
//! `lock_many`) → the lock family's per-key state ([`rwlock`], [`semaphore`],
//! singleflight) → `engine` (the backend, settings, counters and renewal watchdog
//! every kind shares) and `slot` (the exclusive lock's per-key state machine) →
//! `lease` (a held lease, its renewal, its loss signal and fencing token) →
//! [`backend`]. [`guard`] only re-exports what holders get; [`error`], [`stats`] and
//! [`LockKey`] are the vocabulary of every layer.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
pub mod election;
pub mod error;
pub mod fence;
pub mod guard;
pub mod guide;
#[cfg(feature = "inspect")]
pub mod inspect;
pub mod job;
mod key;
pub mod layer;
mod lease;
mod locker;
mod multi;
mod reentry;
mod runtime;
mod rw;
pub mod rwlock;
pub mod semaphore;
mod settings;
mod singleflight;
mod slot;
pub mod stats;
#[cfg(feature = "testing")]
pub mod testing;

// The root names: what almost every user needs. Everything else lives in the
// module named for its concept: `backend`, `guard`, `error`, `layer`, `rwlock`,
// `semaphore`, `stats`; and, behind its feature, `inspect`.
pub use backend::{MemoryBackend, RedisBackend};
pub use error::{Error, Result};
pub use guard::{FencingToken, LockGuard};
pub use key::LockKey;
pub use locker::{Contention, Handoff, LockOptions, Locker, LockerBuilder, LossPolicy};

/// The redis-rs crate lockflight is built on (the version its API takes): name
/// `lockflight::redis::Client` and friends through this re-export, so that a
/// different `redis` in your own dependencies cannot be mixed up with it.
pub use redis;

/// The `http` crate of the tower layer (the version its API takes): the layer
/// locks `http::Request`s, a key extractor is written for `http::Request<B>`,
/// `KeyFrom::header` takes an `http::HeaderName` and, with the feature `axum`,
/// `Problem` an `http::StatusCode`. Name them through this re-export when your
/// own crate does not depend on `http`.
pub use http;

/// The sqlx crate of the fenced SQL writes (the version they take): the
/// database of [`FencedUpdate`](fence::FencedUpdate) and
/// [`FencedUpsert`](fence::FencedUpsert), the connection you pass them and the
/// `sqlx::Error` they return, so that a different `sqlx` in your own dependencies
/// cannot be mixed up with it.
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub use sqlx;
