//! Where locks live: [`RedisBackend`] (one server, Cluster, Sentinel),
//! [`RedlockBackend`] (independent primaries) and [`MemoryBackend`] (one process).
//!
//! Pass one to [`Locker::builder`](crate::Locker::builder). The interface between
//! the [`Locker`](crate::Locker) and a backend (the `LockBackend`, `RwBackend` and
//! `SemaphoreBackend` traits and their types) is public only with the feature
//! `unstable-backend-api`, and outside semver there: it is the protocol whose
//! guarantees the conformance tests check for each backend, so it may change in
//! any release. ARCHITECTURE.md explains it.

pub(crate) mod detached;
pub mod memory;
pub mod redis;
pub mod redlock;
#[cfg(feature = "unstable-backend-api")]
pub mod rw;
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) mod rw;
pub(crate) mod schedule;
#[cfg(feature = "unstable-backend-api")]
pub mod semaphore;
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) mod semaphore;
mod spi;

pub use memory::MemoryBackend;
pub use redis::{RedisBackend, RedisBackendBuilder};
pub use redlock::{RedlockBackend, RedlockBackendBuilder};
#[cfg(feature = "unstable-backend-api")]
pub use spi::{
    Acquire, Extend, LeaderChange, LeaseKind, LeaseToken, LockBackend, LockKind, Released,
    RenewItem, Revocation, WakeRegistry, Wakeup, WhenBusy,
};
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) use spi::{
    Acquire, Extend, LeaseKind, LeaseToken, LockBackend, LockKind, Released, RenewItem, Revocation,
    WakeRegistry, Wakeup, WhenBusy,
};
pub(crate) use spi::{Held, Holding, drift, extend_one};
