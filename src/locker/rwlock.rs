//! [`RwLock`]: the handle on one key's read-write lock, made by
//! [`Locker::rwlock`].

use std::fmt;
use std::future::Future;

use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::rw::{ReadGuard, WriteGuard};
use crate::settings::LockOptions;

use super::Locker;

/// A distributed read-write lock on one key: shared [`ReadGuard`]s or one
/// exclusive [`WriteGuard`] at a time, across every instance. Made by
/// [`Locker::rwlock`]; cheap to clone, nothing is sent until a lock is asked for.
///
/// Its calls return futures that own what they need (a clone of the handle), so
/// `locker.rwlock(key).read()` may be passed on or joined without a binding.
///
/// Overlapping readers of this process share one read lease; a waiting writer
/// stops new read leases from being granted, so readers cannot starve it (see the
/// [module docs](crate::rwlock) for the protocol and the bound).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use lockflight::{Locker, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let catalog = locker.rwlock("catalog");
/// let a = catalog.read().await?;
/// let b = catalog.read().await?; // shares a's lease
/// assert!(catalog.try_write().await?.is_none(), "readers hold it");
/// a.release().await?;
/// b.release().await?; // the last reader releases the lease
/// catalog.write().await?.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwLock {
    locker: Locker,
    key: LockKey,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock").field("key", &self.key).finish()
    }
}

impl RwLock {
    pub(crate) fn new(locker: Locker, key: LockKey) -> RwLock {
        RwLock { locker, key }
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Takes a shared read lock, waiting up to the locker's wait timeout.
    ///
    /// A reader that arrives after this process's shared read lease stopped
    /// admitting readers, or while a writer waits, waits for the lease to drain and
    /// for the writers.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for an empty or oversized key; [`Error::Unsupported`]
    /// at once on a backend without read-write locks (Redlock); [`Error::Timeout`]
    /// when the wait timeout passes; [`Error::ForeignValue`],
    /// [`Error::NoPermission`], [`Error::Refused`] and [`Error::Backend`] from the
    /// backend (transient errors are retried until the deadline).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped waiter leaves nothing behind; a dropped reader that was
    /// acquiring for the others lets the next local reader lead, and releases its
    /// request (which may have landed) in the background.
    pub fn read(&self) -> impl Future<Output = Result<ReadGuard>> + Send + 'static {
        self.read_with_options(LockOptions::new())
    }

    /// Like [`read`](Self::read) with per-call settings: a wait timeout, or no
    /// waiting at all ([`LockOptions::try_only`]: [`Error::Busy`] when it would
    /// wait).
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read); [`Error::Busy`] under `try_only`;
    /// [`Error::InvalidConfig`] for a per-call lease TTL (read-write leases take the
    /// locker's).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub fn read_with_options(
        &self,
        options: LockOptions,
    ) -> impl Future<Output = Result<ReadGuard>> + Send + 'static {
        let this = self.clone();
        async move {
            let rw = &this.locker.shared.rw;
            let default_wait = this.locker.shared.engine.config.wait_timeout;
            match options.wait_at_locker_ttl("read_with_options", &this.key, default_wait)? {
                Some(wait) => rw.read_within(this.key.clone(), wait).await,
                None => rw
                    .try_read(this.key.clone())
                    .await?
                    .ok_or_else(|| this.busy()),
            }
        }
    }

    /// Takes a shared read lock if that needs no waiting: `None` when a writer
    /// holds the key or waits for it (here or in another instance), or when this
    /// process's shared read lease no longer admits readers. At most one backend
    /// request; it waits only for another local reader's acquire in flight.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub fn try_read(&self) -> impl Future<Output = Result<Option<ReadGuard>>> + Send + 'static {
        let this = self.clone();
        async move { this.locker.shared.rw.try_read(this.key.clone()).await }
    }

    /// Takes the exclusive write lock, waiting up to the locker's wait timeout.
    ///
    /// While it waits at the backend it is registered as a waiting writer: no new
    /// read lease is granted to any instance.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped writer leaves the local queue; if it was talking to
    /// the backend, its registration as a waiting writer and any request that may
    /// have landed are released in the background (readers blocked by it are woken).
    pub fn write(&self) -> impl Future<Output = Result<WriteGuard>> + Send + 'static {
        self.write_with_options(LockOptions::new())
    }

    /// Like [`write`](Self::write) with per-call settings, as
    /// [`read_with_options`](Self::read_with_options).
    ///
    /// # Errors
    ///
    /// As [`read_with_options`](Self::read_with_options).
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub fn write_with_options(
        &self,
        options: LockOptions,
    ) -> impl Future<Output = Result<WriteGuard>> + Send + 'static {
        let this = self.clone();
        async move {
            let rw = &this.locker.shared.rw;
            let default_wait = this.locker.shared.engine.config.wait_timeout;
            match options.wait_at_locker_ttl("write_with_options", &this.key, default_wait)? {
                Some(wait) => rw.write_within(this.key.clone(), wait).await,
                None => rw
                    .try_write(this.key.clone())
                    .await?
                    .ok_or_else(|| this.busy()),
            }
        }
    }

    /// Takes the write lock if it is free right now: `None` when a local task holds
    /// or waits for the key, or the backend reports readers or a writer. One backend
    /// request at most; it does not register as a waiting writer.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub fn try_write(&self) -> impl Future<Output = Result<Option<WriteGuard>>> + Send + 'static {
        let this = self.clone();
        async move { this.locker.shared.rw.try_write(this.key.clone()).await }
    }

    fn busy(&self) -> Error {
        Error::Busy {
            key: self.key.clone(),
        }
    }
}
