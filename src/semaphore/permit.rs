//! [`Permit`]: one held permit, its loss signal and its release.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use crate::backend::LeaseToken;
use crate::error::Result;
use crate::key::LockKey;
use crate::lease::acquire::{NewLease, grant};
use crate::lease::engine::Engine;
use crate::lease::release::{End, Release, retire};
use crate::lease::{Lease, LeaseKind};

/// Where a permit goes when its holder is done with it: the locker's semaphores
/// (`requests.rs`), which make permits and so import this file. A permit reaches
/// them only through this trait, so the two files do not import each other.
pub(super) trait PermitPool: Send + Sync + 'static {
    /// The engine the permits run on.
    fn engine(&self) -> &Arc<Engine>;

    /// Passes the permit `lease` to the next local waiter of its key, within the
    /// handoff budget; `false` if it goes back to the backend instead.
    fn hand_off(self: Arc<Self>, lease: &Arc<Lease>, fair_bound: u64) -> bool;
}

/// A held permit of a [`Semaphore`](super::Semaphore).
///
/// Release it with [`release`](Permit::release) to learn whether it was still held;
/// dropping it does the same in the background. Either way it passes to the next
/// local waiter of the semaphore when the handoff budget allows
/// ([`Handoff`](crate::Handoff)), else it goes back to the backend. While it is held the locker's
/// watchdog renews it; [`lost`](Permit::lost) resolves if it is lost, no later
/// than its validity ends.
#[must_use = "the permit is released when it is dropped"]
pub struct Permit {
    pub(super) semaphores: Arc<dyn PermitPool>,
    pub(super) lease: Arc<Lease>,
    pub(super) done: bool,
    pub(super) granted_at: crate::lease::histograms::Since,
    /// In fair mode, the permit passes only to local waiters queued before this
    /// (queue ids below it): those that arrived before the request that granted it
    /// was sent, so before any other instance the backend did not report.
    pub(super) fair_bound: u64,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.lease.key)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Permit {
    /// A permit granted for a request sent at `sent_at`, watched by the watchdog;
    /// `None` (and released in the background) if the reply came back after its
    /// validity window.
    pub(super) fn granted(
        semaphores: &Arc<dyn PermitPool>,
        key: &LockKey,
        token: LeaseToken,
        sent_at: Instant,
        waiting: u32,
    ) -> Option<Permit> {
        let engine = semaphores.engine();
        let granted = grant(
            engine,
            NewLease {
                key,
                kind: LeaseKind::Permit,
                token,
                ttl: engine.config.lease_ttl,
                epoch: 0,
                sent_at,
                waiting,
                hold_limit: None,
            },
        );
        let Some(lease) = granted else {
            // Not held (the reply came after its validity): give the token back.
            retire(engine, LeaseKind::Permit, key, token);
            return None;
        };
        Some(Permit::new(semaphores, lease))
    }

    /// The permit of a granted `lease`.
    pub(super) fn new(semaphores: &Arc<dyn PermitPool>, lease: Arc<Lease>) -> Permit {
        Permit {
            semaphores: Arc::clone(semaphores),
            lease,
            done: false,
            granted_at: crate::lease::histograms::Since::now(),
            fair_bound: 0,
        }
    }

    /// The same permit for its next local holder ([`PermitPool::hand_off`]).
    pub(super) fn handed_off(
        semaphores: &Arc<dyn PermitPool>,
        lease: &Arc<Lease>,
        fair_bound: u64,
    ) -> Permit {
        Permit {
            semaphores: Arc::clone(semaphores),
            lease: Arc::clone(lease),
            done: false,
            granted_at: crate::lease::histograms::Since::now(),
            fair_bound,
        }
    }

    /// The semaphore's key.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    crate::lease::observe_lease!("permit", signal);

    /// Ends this holder's use of the permit. If another task of this locker waits
    /// for the key and the handoff budget allows ([`Handoff`](crate::Handoff)), the
    /// still-valid permit passes to it in memory (no backend request); otherwise
    /// it goes back to the backend, which wakes a waiting instance.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if the backend no longer had the permit (it expired,
    /// or was removed; nothing was returned). `Ok` means the release removed it at
    /// the backend (it was held until then), or handed it to the next local holder
    /// while no loss of it was known (a permit known lost, as a forced release's
    /// message makes it at once, is never handed on: it goes back to the backend).
    /// Backend errors after its retries (the permit then expires at its TTL).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the release is re-run
    /// to completion in a background task (it is idempotent); only its result is
    /// lost.
    pub async fn release(mut self) -> Result<()> {
        match self.end().into_release(&self.lease)? {
            Some(job) => job.run().await,
            None => Ok(()),
        }
    }

    /// Ends this holder's use: handed to the next local waiter, or the backend
    /// release (nothing once ended).
    fn end(&mut self) -> End<()> {
        if std::mem::replace(&mut self.done, true) {
            return End::Kept;
        }
        crate::lease::histograms::hold(LeaseKind::Permit, self.granted_at);
        if Arc::clone(&self.semaphores).hand_off(&self.lease, self.fair_bound) {
            return End::Kept;
        }
        let engine = Arc::clone(self.semaphores.engine());
        End::Release(Release::new(engine, Arc::clone(&self.lease), ()))
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.end().in_background();
    }
}
