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
mod interface;
pub mod memory;
mod protocol;
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
mod signals;
mod token;

#[cfg(feature = "unstable-backend-api")]
pub use interface::LockBackend;
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) use interface::LockBackend;
pub(crate) use interface::renew_one;
pub use memory::MemoryBackend;
#[cfg(feature = "unstable-backend-api")]
pub use protocol::{
    Acquire, LeaseKind, LockKind, RecordFence, RecordState, Released, RenewItem, Renewal, WhenBusy,
};
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) use protocol::{
    Acquire, LeaseKind, LockKind, RecordFence, RecordState, Released, RenewItem, Renewal, WhenBusy,
};
pub use redis::{RedisBackend, RedisBackendBuilder};
pub use redlock::{RedlockBackend, RedlockBackendBuilder};
#[cfg(feature = "unstable-backend-api")]
pub use signals::{LeaderChange, Revocation, Signals, Wakeup};
pub(crate) use signals::{Losable, Registration};
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) use signals::{Revocation, Signals, Wakeup};
#[cfg(feature = "unstable-backend-api")]
pub use token::LeaseToken;
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) use token::LeaseToken;
pub(crate) use token::drift;
