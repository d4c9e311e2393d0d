//! Read-write locks in a backend: [`RwBackend`].
//!
//! A read-write lock of a key has, at the backend, a set of **read leases** (one per
//! process that reads: its local readers share it), at most one **write lease**, a
//! set of **waiting writers** (writer preference: while one waits, no new read lease
//! is granted) and a **write fence** (the epoch of the last write lease).
//!
//! Semantics every implementation keeps (the [`Locker`](crate::Locker) and the tests
//! rely on them):
//!
//! 1. A write lease excludes every other write lease and every live read lease; read
//!    leases share the key with each other. Leases end at their TTL unless renewed.
//! 2. A **new** read lease is refused while a write lease is held or a live writer
//!    waits (registered by a waiting [`acquire_write`](RwBackend::acquire_write);
//!    registrations expire unless the writer keeps asking).
//! 3. Write epochs of a key strictly increase (`max(last + 1, clock in µs)`); a read
//!    acquire returns the last write epoch recorded (0 if none).
//! 4. When a write lease is released, or the last live read lease leaves, or a
//!    waiting writer leaves while none remains, every instance that was told to wait
//!    is woken through its [`signals`](super::LockBackend::signals) registry, as
//!    [`LockKind::ReadWrite`](super::LockKind::ReadWrite) (never as the key's mutex
//!    or semaphore, which are other locks).
//! 5. Repeating an acquire with the same token re-arms what it may already hold
//!    (and mints a new write epoch); release and renew change nothing unless the
//!    token holds (or, for a writer, waits for) the lock.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::{Acquire, LeaseToken, Released, Renewal, WhenBusy};
use crate::error::Result;
use crate::key::LockKey;

/// A backend that stores read-write locks, reached through
/// [`LockBackend::rw`](super::LockBackend::rw).
///
/// # Cancel safety
///
/// As [`LockBackend`](super::LockBackend): a dropped call may or may not have
/// landed; the caller reconciles by releasing its token.
#[async_trait]
pub trait RwBackend: Send + Sync + fmt::Debug {
    /// Acquire a read lease of `key` for `token` (one per process, shared by its local
    /// readers). `Acquired.epoch` is the last write epoch of the key (0 if none is
    /// recorded), `Acquired.waiting` the live waiting writers (0). With
    /// [`WhenBusy::Queue`], a busy answer registers this instance for the wake-up.
    async fn acquire_read(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire>;

    /// Acquire the write lease of `key` for `token`. `Acquired.epoch` is the new
    /// write epoch, `Acquired.waiting` the other live waiting writers. With
    /// [`WhenBusy::Queue`], a busy answer registers `token` as a waiting writer (refusing new read leases)
    /// and this instance for the wake-up.
    async fn acquire_write(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire>;

    /// Release the read lease `token`. `released` is false if it was no longer live.
    async fn release_read(&self, key: &LockKey, token: LeaseToken) -> Result<Released>;

    /// Release the write lease `token`, and withdraw `token` from the waiting
    /// writers (a writer that gives up calls this too). `released` is false if
    /// `token` did not hold the write lease.
    async fn release_write(&self, key: &LockKey, token: LeaseToken) -> Result<Released>;

    /// Re-arm the TTL of the read lease `token` of `key`. `Renewed.waiting` counts
    /// the live waiting writers.
    async fn renew_read(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal>;

    /// Re-arm the TTL of the write lease `token` of `key`. `Renewed.waiting` counts
    /// the live waiting writers.
    async fn renew_write(&self, key: &LockKey, token: LeaseToken, ttl: Duration)
    -> Result<Renewal>;
}
