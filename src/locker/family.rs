//! The lock family on [`Locker`]: read-write locks ([`rwlock`](crate::rwlock)),
//! semaphores ([`semaphore`](crate::semaphore)) and singleflight. Each kind keeps
//! its per-key state in its own module, below the locker; these calls are the
//! handle's doors to them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::key::LockKey;
use crate::rwlock::{ReadGuard, WriteGuard};
use crate::semaphore::Semaphore;

#[allow(unused_imports)] // intra-doc links
use crate::error::Error;

use super::Locker;

/// Read-write locks.
impl Locker {
    /// Takes a shared read lock of `key`, waiting up to the configured wait timeout.
    ///
    /// Overlapping readers of this process share one read lease (one backend acquire
    /// and one release for all of them, see the [module docs](crate::rwlock)); a
    /// reader that arrives after the shared lease's admission window, or while a
    /// writer waits, waits for the lease to drain and for the writers.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let a = locker.read("catalog").await?;
    /// let b = locker.read("catalog").await?; // shares a's lease
    /// a.release().await?;
    /// b.release().await?; // the last reader releases the lease
    /// # Ok(()) }
    /// ```
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
    pub async fn read(&self, key: impl Into<LockKey>) -> Result<ReadGuard> {
        self.read_within(key, self.shared.config.wait_timeout).await
    }

    /// Like [`read`](Self::read) with an explicit wait timeout (`Duration::MAX`:
    /// as long as it takes).
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn read_within(&self, key: impl Into<LockKey>, wait: Duration) -> Result<ReadGuard> {
        self.shared.rw.read_within(key.into(), wait).await
    }

    /// Takes a shared read lock of `key` if that needs no waiting: `None` when a
    /// writer holds the key or waits for it (here or in another instance), or when
    /// this process's shared read lease no longer admits readers. At most one backend
    /// request; it waits only for another local reader's acquire in flight.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn try_read(&self, key: impl Into<LockKey>) -> Result<Option<ReadGuard>> {
        self.shared.rw.try_read(key.into()).await
    }

    /// Takes the exclusive write lock of `key`, waiting up to the configured wait
    /// timeout.
    ///
    /// While it waits at the backend it is registered as a waiting writer: no new
    /// read lease is granted to any instance, so a stream of readers cannot starve
    /// it (see the [module docs](crate::rwlock) for the bound).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let first = locker.write("catalog").await?.fencing_token();
    /// let second = locker.write("catalog").await?;
    /// assert!(second.fencing_token() > first);
    /// # Ok(()) }
    /// ```
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
    pub async fn write(&self, key: impl Into<LockKey>) -> Result<WriteGuard> {
        self.write_within(key, self.shared.config.wait_timeout)
            .await
    }

    /// Like [`write`](Self::write) with an explicit wait timeout.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub async fn write_within(
        &self,
        key: impl Into<LockKey>,
        wait: Duration,
    ) -> Result<WriteGuard> {
        self.shared.rw.write_within(key.into(), wait).await
    }

    /// Takes the write lock of `key` if it is free right now: `None` when a local
    /// task holds or waits for the key's gate, or the backend reports readers or a
    /// writer. One backend request at most; it does not register as a waiting writer.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub async fn try_write(&self, key: impl Into<LockKey>) -> Result<Option<WriteGuard>> {
        self.shared.rw.try_write(key.into()).await
    }

    /// Number of keys with local read-write activity (a reader, a writer, a waiter
    /// or a release in flight). Zero when every task is done.
    pub fn active_rw_keys(&self) -> usize {
        self.shared.rw.len()
    }
}

/// Semaphores.
impl Locker {
    /// A handle on the semaphore `key` with `permits` permits across every instance.
    ///
    /// Cheap: nothing is checked or sent until a permit is asked for. `permits` is
    /// fixed per key at first use, in the backend, for as long as any permit or
    /// waiter of the key lives: asking with another number gets
    /// [`Error::PermitMismatch`]. A `permits` of 0 or above [`MAX_PERMITS`](crate::semaphore::MAX_PERMITS) gets
    /// [`Error::InvalidConfig`] (naming the key) at the first acquire.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let pool = locker.semaphore("db-pool", 2);
    /// let a = pool.acquire().await?;
    /// let b = pool.acquire().await?;
    /// assert!(pool.try_acquire().await?.is_none(), "both permits are held");
    /// a.release().await?;
    /// let c = pool.try_acquire().await?.expect("one came back");
    /// # drop((b, c));
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, key: impl Into<LockKey>, permits: u32) -> Semaphore {
        Semaphore::new(Arc::clone(&self.shared.semaphores), key.into(), permits)
    }

    /// Number of semaphore keys with local waiters (and a request task). Zero when
    /// nobody waits: the per-key state never outlives its use.
    pub fn active_semaphores(&self) -> usize {
        self.shared.semaphores.len()
    }
}

/// Singleflight.
impl Locker {
    /// Runs `f` under the lock of `key`, sharing its result with every concurrent
    /// local caller for the same key (and the same `T`).
    ///
    /// Use it for idempotent work whose result everyone may share: filling a cache
    /// entry, loading a hot row. Callers that arrive after a flight completed start a
    /// new one (one run per lock generation).
    ///
    /// # Concurrent calls on the same key
    ///
    /// One caller leads: it takes the distributed lock (as [`with_lock`](Self::with_lock))
    /// and runs its `f`; the others wait, without a deadline of their own, and receive
    /// a clone of the leader's value or error. If the leader is cancelled, one of the
    /// waiting callers becomes the leader and runs *its* `f`. If the leader panics,
    /// the waiting callers get [`Error::Panicked`], the lock is released, and the
    /// panic resumes in the leader's task.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let (a, b) = tokio::join!(
    ///     locker.singleflight("user:7", || async {
    ///         tokio::task::yield_now().await; // a real load awaits I/O here
    ///         "loaded once".to_string()
    ///     }),
    ///     locker.singleflight("user:7", || async { String::from("not run: shares the first") }),
    /// );
    /// assert_eq!(a?, "loaded once");
    /// assert_eq!(b?, "loaded once");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`with_lock`](Self::with_lock), shared by all callers of the flight, plus
    /// [`Error::Panicked`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A cancelled follower simply stops waiting; a cancelled leader
    /// drops `f` (releasing the lock in the background) and passes the flight on.
    /// Whoever leaves last removes the flight: once no caller is left, the locker
    /// keeps nothing for the key.
    ///
    /// # Panics
    ///
    /// Resumes the panic of `f` in the caller whose `f` panicked.
    pub async fn singleflight<T, F, Fut>(&self, key: impl Into<LockKey>, f: F) -> Result<T>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let key: LockKey = key.into();
        key.validate()?;
        self.check_reentry(&key)?;
        self.shared
            .flights
            .run(key, f, |key, f| self.with_lock(key, |_| f()))
            .await
    }
}
