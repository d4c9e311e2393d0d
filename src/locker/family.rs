//! The lock family on [`Locker`]: read-write locks ([`RwLock`] handles),
//! semaphores ([`semaphore`](crate::semaphore)) and singleflight. Each kind keeps
//! its per-key state in its own module, below the locker; these calls are the
//! handle's doors to them. (`Locker::election` lives in
//! [`election`](crate::election), above the locker: an election campaigns
//! through [`Locker::lock`].)

use std::future::Future;
use std::sync::Arc;

use crate::error::Result;
use crate::key::LockKey;
use crate::semaphore::Semaphore;

#[allow(unused_imports)] // intra-doc links
use crate::error::Error;

use super::Locker;
use super::rwlock::RwLock;

/// Read-write locks.
impl Locker {
    /// A handle on the read-write lock of `key`: [`RwLock::read`],
    /// [`RwLock::write`] and their variants. Cheap: the key is checked and
    /// nothing is sent until a lock is asked for.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let first = locker.rwlock("catalog").write().await?.fencing_token();
    /// let second = locker.rwlock("catalog").write().await?;
    /// assert!(second.fencing_token() > first);
    /// # Ok(()) }
    /// ```
    pub fn rwlock(&self, key: impl Into<LockKey>) -> RwLock {
        RwLock::new(self.clone(), key.into())
    }

    /// Number of keys with local read-write activity (a reader, a writer, a waiter
    /// or a release in flight). Zero when every task is done.
    pub(crate) fn active_rw_keys(&self) -> usize {
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
    pub(crate) fn active_semaphores(&self) -> usize {
        self.shared.semaphores.len()
    }
}

/// Singleflight.
impl Locker {
    /// Runs `f` under the lock of `key`, sharing its result with every concurrent local
    /// caller for the same key (and the same `T`): for idempotent work whose result
    /// everyone may share. One caller leads: it takes the lock (as
    /// [`with_lock`](Self::with_lock)) and runs its `f`; the others wait, without a
    /// deadline of their own, for a clone of its value or error. A caller that arrives
    /// after a flight completed starts a new one.
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
    /// As [`with_lock`](Self::with_lock), shared by the flight's callers; [`Error::Panicked`]
    /// for the waiting callers when the leader's `f` panics (the lock is released).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A cancelled follower stops waiting; a cancelled leader drops `f`
    /// (releasing the lock in the background) and a waiting caller leads with *its* `f`.
    /// Once no caller is left, the locker keeps nothing for the key.
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

    /// [`singleflight`](Self::singleflight) without the lock: the leader's `f`
    /// takes what it needs itself (the idempotency layer takes the lease and reads
    /// its fencing token). Flights are per key and per `T`, so a private `T` never
    /// meets a user's flight.
    pub(crate) async fn coalesce<T, F, Fut>(&self, key: LockKey, f: F) -> Result<T>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        key.validate()?;
        self.check_reentry(&key)?;
        self.shared.flights.run(key, f, |_, f| f()).await
    }
}
