//! The lock kinds as the cells see them: one way to take, hold and release each,
//! through a [`Locker`] (what users call) or through the backend trait (what the
//! lease protocol sends).

use std::time::Duration;

use lockflight::backend::rw::RwBackend;
use lockflight::backend::semaphore::SemaphoreBackend;
use lockflight::backend::{Acquire, LeaseToken, LockBackend};
use lockflight::rwlock::{ReadGuard, WriteGuard};
use lockflight::semaphore::Permit;
use lockflight::{LockGuard, LockKey, Locker, RedisBackend, Result};

/// A lock kind. The semaphore has one permit, so that every kind is exclusive
/// against another instance asking for the same kind (two read leases are not:
/// the read cells use a writer as the other instance where they need exclusion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Mutex,
    Read,
    Write,
    Permit,
}

/// The permits of the semaphore cells.
const PERMITS: u32 = 1;

/// One held lock of any kind.
pub(crate) enum Held {
    Lock(LockGuard),
    Read(ReadGuard),
    Write(WriteGuard),
    Permit(Permit),
}

impl Kind {
    /// Takes `key` through `locker`, waiting up to `wait`.
    pub(crate) async fn acquire(self, locker: &Locker, key: &str, wait: Duration) -> Result<Held> {
        Ok(match self {
            Kind::Mutex => Held::Lock(locker.lock_within(key, wait).await?),
            Kind::Read => Held::Read(locker.read_within(key, wait).await?),
            Kind::Write => Held::Write(locker.write_within(key, wait).await?),
            Kind::Permit => {
                Held::Permit(locker.semaphore(key, PERMITS).acquire_within(wait).await?)
            }
        })
    }

    /// Takes `key` through `locker` if it is free now.
    pub(crate) async fn try_acquire(self, locker: &Locker, key: &str) -> Result<Option<Held>> {
        Ok(match self {
            Kind::Mutex => locker.try_lock(key).await?.map(Held::Lock),
            Kind::Read => locker.try_read(key).await?.map(Held::Read),
            Kind::Write => locker.try_write(key).await?.map(Held::Write),
            Kind::Permit => locker
                .semaphore(key, PERMITS)
                .try_acquire()
                .await?
                .map(Held::Permit),
        })
    }

    /// The kind that excludes this one from another instance: a writer for a
    /// reader, the same kind otherwise.
    pub(crate) fn rival(self) -> Kind {
        match self {
            Kind::Read => Kind::Write,
            other => other,
        }
    }

    /// Asks `backend` for a lease of `key` with `token`, without waiting; whether
    /// it was granted.
    pub(crate) async fn backend_acquire(
        self,
        backend: &RedisBackend,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<bool> {
        let granted = |a: Acquire| matches!(a, Acquire::Acquired { .. });
        Ok(match self {
            Kind::Mutex => granted(LockBackend::acquire(backend, key, token, ttl, false).await?),
            Kind::Read => granted(backend.acquire_read(key, token, ttl, false).await?),
            Kind::Write => granted(backend.acquire_write(key, token, ttl, false).await?),
            Kind::Permit => {
                backend
                    .acquire_permits(key, PERMITS, &[token], ttl, false)
                    .await?
                    .granted
                    == 1
            }
        })
    }

    /// Releases the lease `token` of `key` at `backend`: whether the backend says
    /// this release (or an earlier attempt of it) deleted the lease.
    pub(crate) async fn backend_release(
        self,
        backend: &RedisBackend,
        key: &LockKey,
        token: LeaseToken,
    ) -> Result<bool> {
        Ok(match self {
            Kind::Mutex => LockBackend::release(backend, key, token).await?.released,
            Kind::Read => backend.release_read(key, token).await?.released,
            Kind::Write => backend.release_write(key, token).await?.released,
            Kind::Permit => backend.release_permit(key, token).await?,
        })
    }
}

impl Held {
    /// Releases the lock, reporting what the backend said.
    pub(crate) async fn release(self) -> Result<()> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Permit(p) => p.release().await,
        }
    }
}
