//! [`LockGuard`]: what a task holds of the exclusive lock of a key.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::lease::{FencingToken, LockInfo};
use crate::slot::Slot;

use super::LockerState;

/// A held lock.
///
/// Release it with [`release`](LockGuard::release) to learn whether the lease was
/// still held; dropping it releases (or hands off) in the background. While it is
/// held a watchdog renews the lease; [`lost`](LockGuard::lost) resolves if the lease
/// is lost, no later than its validity ends.
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    shared: Arc<LockerState>,
    slot: Option<Arc<Slot>>,
    lease: Arc<Lease>,
    seq: u64,
    done: bool,
    granted_at: crate::lease::histograms::Since,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lease.key)
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(
        shared: Arc<LockerState>,
        slot: Option<Arc<Slot>>,
        lease: Arc<Lease>,
        seq: u64,
    ) -> LockGuard {
        LockGuard {
            shared,
            slot,
            lease,
            seq,
            done: false,
            granted_at: crate::lease::histograms::Since::now(),
        }
    }

    /// The lock key.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    /// This critical section's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.lease.fencing_token(self.seq)
    }

    /// Key, fencing token and loss signal, as a cloneable value.
    pub fn info(&self) -> LockInfo {
        LockInfo {
            key: self.lease.key.clone(),
            fencing_token: self.fencing_token(),
            loss: self.loss_signal(),
        }
    }

    crate::lease::observe_lease!("lease", signal);

    /// The backend of the lease.
    pub(crate) fn backend(&self) -> Arc<dyn crate::backend::LockBackend> {
        Arc::clone(&self.shared.engine.backend)
    }

    pub(crate) fn lost_error(&self) -> Error {
        self.lease.lost_error(Phase::Renewing)
    }

    /// Releases the lock: hands it to a local waiter or keeps it for the next
    /// local task (with handoff on, within its budget: [`Handoff`](crate::Handoff)),
    /// or deletes it at the backend and wakes the next waiting instance.
    ///
    /// `Ok` of a release at the backend means the backend deleted the lease, so it was
    /// held until then; `Ok` of a release in memory means no loss of the lease was known
    /// when this section ended. A lease known lost (its loss signalled, or its validity
    /// over) is never handed on or kept: its release goes to the backend. A takeover
    /// nobody announces (a `FLUSHALL`, a failover that lost the key) becomes known at the
    /// lease's next renewal.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the backend no longer held this lease (it expired or
    /// was taken over; nothing was deleted); backend errors after brief retries (the
    /// lock then expires at its TTL).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the release is re-run
    /// to completion in a background task (it is idempotent); only its result is lost.
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        crate::lease::histograms::hold(crate::lease::LeaseKind::Mutex, self.granted_at);
        let end = self
            .shared
            .finish(self.slot.take(), Arc::clone(&self.lease), self.seq);
        match end.into_release(&self.lease)? {
            // Boxed: the backend path is the rare one (see `Locker::lock`).
            Some(job) => Box::pin(job.run()).await,
            None => Ok(()),
        }
    }
}

impl LockGuard {
    /// Ends this hold by leaving the lease at the backend until `ttl` from now,
    /// where nobody else can take it ([`LockerState::keep`]): what a scheduled
    /// job does after its work, until `at_least` has passed.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the backend no longer held the lease; backend
    /// errors as they come (the lease then expires at its TTL, which is at least
    /// `ttl`'s end).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the lease is left
    /// as it is: it expires at its TTL.
    pub(crate) async fn keep_for(mut self, ttl: std::time::Duration) -> Result<()> {
        self.done = true;
        crate::lease::histograms::hold(crate::lease::LeaseKind::Mutex, self.granted_at);
        let job = self
            .shared
            .keep(self.slot.take(), Arc::clone(&self.lease), self.seq, ttl);
        job.run().await
    }
}

impl LockGuard {
    /// Ends this hold with the lease's backend release: never handed to a local
    /// waiter nor cached ([`LockerState::finish_at_backend`]).
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release): the release is re-run in the background.
    pub(crate) async fn release_at_backend(mut self) -> Result<()> {
        self.done = true;
        crate::lease::histograms::hold(crate::lease::LeaseKind::Mutex, self.granted_at);
        let job =
            self.shared
                .finish_at_backend(self.slot.take(), Arc::clone(&self.lease), self.seq);
        Box::pin(job.run()).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        crate::lease::histograms::hold(crate::lease::LeaseKind::Mutex, self.granted_at);
        self.shared
            .finish(self.slot.take(), Arc::clone(&self.lease), self.seq)
            .in_background();
    }
}
