//! The guards a holder gets, and what they say about their lease.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard};

use super::{Entry, LocalLock, RwLocal};
use crate::error::Result;
use crate::key::LockKey;
use crate::lease::release::{End, Release};
use crate::lease::{FencingToken, Lease, LeaseKind, LockInfo};

/// The backend release of `lease`, keeping `entry` and `local_lock` until it is done.
fn release_job(lease: &Arc<Lease>, entry: Entry, local_lock: LocalLock) -> End<RwLocal> {
    let engine = Arc::clone(&entry.locks.engine);
    let hold = RwLocal {
        _entry: entry,
        _local_lock: local_lock,
    };
    End::Release(Release::new(engine, Arc::clone(lease), hold))
}

/// A shared read lock of a key: other readers (of this and other instances) may
/// hold it too, no writer does.
///
/// Release it with [`release`](ReadGuard::release) to learn whether the lease was
/// still held; dropping it releases in the background. The read lease is shared by
/// the overlapping readers of this process and released by the last of them; the
/// watchdog renews it while any of them holds it, and its loss is signalled to each.
#[must_use = "the read lock is released when the guard is dropped"]
pub struct ReadGuard {
    pub(super) lease: Arc<Lease>,
    pub(super) entry: Option<Entry>,
    pub(super) local_lock: Option<OwnedRwLockReadGuard<()>>,
    pub(super) granted_at: crate::lease::histograms::Since,
}

impl fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadGuard")
            .field("key", &self.lease.key)
            .field("last_write", &self.last_write())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl ReadGuard {
    /// The lock key.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    /// The fencing token of the last write lease of the key when the read lease was
    /// acquired (`FencingToken::default()`, epoch 0, if the backend recorded none):
    /// what this reader sees is what that write left. No write happens while the
    /// read lease is held.
    ///
    /// With Redis the record is kept for at least a minute (ten lease TTLs if
    /// longer) after the last use of the lock.
    pub fn last_write(&self) -> FencingToken {
        self.lease.fencing_token(0)
    }

    crate::lease::observe_lease!("read lease", signal);

    /// Leaves the shared read lease; the last local reader releases it at the
    /// backend, which wakes the instances waiting for the key (on Redis, the
    /// last read lease's release may instead give the write lease to a writer of
    /// another instance that waits).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if the read lease was lost:
    /// for the last local reader, if the backend no longer held it (it expired,
    /// was deleted or taken over: the read may have overlapped a write; nothing
    /// was deleted); for a reader that leaves others on the lease, if its loss was
    /// known (signalled, as a forced release's message does at once, or its
    /// validity over). `Ok` from the last reader means the release deleted the
    /// lease, so no write overlapped it; `Ok` from a reader that leaves others on
    /// it means no loss of it was known when that reader left. Backend errors of
    /// the last reader's release after its retries (the lease then expires at its
    /// TTL).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the release is re-run
    /// to completion in a background task; only its result is lost.
    pub async fn release(mut self) -> Result<()> {
        match self.leave().into_release(&self.lease)? {
            Some(job) => job.run().await,
            None => Ok(()),
        }
    }

    /// Leaves the share; the backend release when this was the last holder.
    fn leave(&mut self) -> End<RwLocal> {
        let (Some(entry), Some(local_lock)) = (self.entry.take(), self.local_lock.take()) else {
            return End::Kept;
        };
        crate::lease::histograms::hold(LeaseKind::Read, self.granted_at);
        let last = entry.rw.share().leave(&self.lease);
        if !last {
            // Others still share it: what this reader learns is whether it was
            // lost while this reader held it.
            return End::Kept;
        }
        entry.rw.changed.notify_waiters();
        release_job(&self.lease, entry, LocalLock::Read(local_lock))
    }
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        self.leave().in_background();
    }
}

/// The exclusive write lock of a key: no other writer and no reader, in any
/// instance, holds it.
///
/// Release it with [`release`](WriteGuard::release) to learn whether the lease was
/// still held; dropping it releases in the background. The watchdog renews the
/// lease while it is held.
#[must_use = "the write lock is released when the guard is dropped"]
pub struct WriteGuard {
    pub(super) lease: Arc<Lease>,
    pub(super) job: Option<(Entry, OwnedRwLockWriteGuard<()>)>,
    pub(super) granted_at: crate::lease::histograms::Since,
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field("key", &self.lease.key)
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl WriteGuard {
    /// The lock key.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    /// This write's fencing token: strictly greater than the token of every
    /// earlier write lease of the key (`seq` is always 0).
    pub fn fencing_token(&self) -> FencingToken {
        self.lease.fencing_token(0)
    }

    /// Key, fencing token and loss signal, as a cloneable value (as
    /// [`LockGuard::info`](crate::LockGuard::info) gives them).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let write = locker.rwlock("catalog").write().await?;
    /// let info = write.info();
    /// assert_eq!(info.key.as_str(), Some("catalog"));
    /// assert_eq!(info.fencing_token, write.fencing_token());
    /// write.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn info(&self) -> LockInfo {
        LockInfo {
            key: self.lease.key.clone(),
            fencing_token: self.fencing_token(),
            loss: self.loss_signal(),
        }
    }

    crate::lease::observe_lease!("write lease", signal);

    /// Releases the write lock at the backend, which wakes the instances waiting
    /// for the key (on Redis, it may instead give the write lease to a writer of
    /// another instance that waits).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if the backend no longer held
    /// the lease (it expired, was deleted or taken over; nothing was deleted). `Ok`
    /// means the release deleted it, so nobody else held the lock meanwhile.
    /// Backend errors after its retries (the lease then expires at its TTL).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the release is re-run
    /// to completion in a background task; only its result is lost.
    pub async fn release(mut self) -> Result<()> {
        match self.leave().into_release(&self.lease)? {
            Some(job) => job.run().await,
            None => Ok(()),
        }
    }

    fn leave(&mut self) -> End<RwLocal> {
        let Some((entry, local_lock)) = self.job.take() else {
            return End::Kept;
        };
        crate::lease::histograms::hold(LeaseKind::Write, self.granted_at);
        release_job(&self.lease, entry, LocalLock::Write(local_lock))
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.leave().in_background();
    }
}
