//! [`Permit`]: one held permit, its loss signal and its release.

use crate::backend::LeaseToken;
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::{Lease, LeaseKind};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::*;

/// A held permit of a [`Semaphore`].
///
/// Release it with [`release`](Permit::release) to learn whether it was still held;
/// dropping it releases it in the background. While it is held the locker's
/// watchdog renews it; [`lost`](Permit::lost) resolves if it is lost, no later
/// than its validity ends.
#[must_use = "the permit is released when it is dropped"]
pub struct Permit {
    pub(super) semaphores: Arc<Semaphores>,
    pub(super) lease: Arc<Lease>,
    pub(super) done: bool,
    pub(super) granted_at: Instant,
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
        semaphores: &Arc<Semaphores>,
        key: &LockKey,
        token: LeaseToken,
        sent_at: Instant,
    ) -> Option<Permit> {
        let ttl = semaphores.config.lease_ttl;
        let lease = Lease::new(
            key.clone(),
            token,
            0,
            ttl,
            sent_at,
            0,
            Arc::clone(&semaphores.stats),
        )
        .with_kind(LeaseKind::Permit);
        if Instant::now() >= lease.valid_until() {
            tracing::debug!(%key, "permit reply arrived after the permit's validity");
            spawn_release(semaphores, key, token);
            return None;
        }
        let lease = Arc::new(lease);
        semaphores.stats.acquired();
        semaphores.renewals.watch(&lease, sent_at);
        Some(Permit {
            semaphores: Arc::clone(semaphores),
            lease,
            done: false,
            granted_at: Instant::now(),
        })
    }

    /// The semaphore's key.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    crate::lease::observe_lease!("permit", signal);

    /// Returns the permit to the backend, which wakes a waiting instance.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the permit was lost (it expired, or the backend no
    /// longer had it); backend errors after brief retries (the permit then expires
    /// at its TTL).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the release is re-run
    /// to completion in a background task (it is idempotent); only its result is
    /// lost.
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        crate::lease::histograms::hold(crate::lease::LeaseKind::Permit, self.granted_at.elapsed());
        let mut rearm = Rearm(Some((
            Arc::clone(&self.semaphores),
            Arc::clone(&self.lease),
        )));
        let result = release(&self.semaphores, &self.lease).await;
        rearm.0 = None;
        result
    }
}

/// Re-runs a permit release in the background if the future running it is dropped.
pub(super) struct Rearm(Option<(Arc<Semaphores>, Arc<Lease>)>);

impl Drop for Rearm {
    fn drop(&mut self) {
        if let Some((semaphores, lease)) = self.0.take() {
            spawn_release(&semaphores, &lease.key, lease.token);
        }
    }
}

/// Stops renewing `lease` and returns it to the backend.
pub(super) async fn release(semaphores: &Arc<Semaphores>, lease: &Arc<Lease>) -> Result<()> {
    let lost_before = lease.is_lost();
    semaphores.renewals.forget(lease);
    crate::lease::histograms::renewals(
        lease.kind,
        lease.renewed.load(std::sync::atomic::Ordering::Relaxed),
    );
    let Some(backend) = semaphores.backend.semaphore() else {
        return Ok(());
    };
    let mut attempt = 0u32;
    let released = loop {
        semaphores.stats.release();
        match backend.release_permit(&lease.key, lease.token).await {
            Err(Error::Backend { .. } | Error::Connect { .. }) if attempt < 2 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(20) * attempt).await;
            }
            // After a failed attempt, "not held" may be that attempt's own doing.
            Ok(false) if attempt > 0 && !lost_before => break true,
            other => break other?,
        }
    };
    if lost_before || !released {
        let reason = if lease.is_lost() {
            lease.lost_reason()
        } else {
            "the permit was no longer held (expired or removed); nothing was returned".into()
        };
        return Err(Error::LeaseLost {
            key: lease.key.clone(),
            phase: Phase::Releasing,
            reason,
        });
    }
    Ok(())
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        crate::lease::histograms::hold(crate::lease::LeaseKind::Permit, self.granted_at.elapsed());
        self.semaphores.renewals.forget(&self.lease);
        crate::lease::histograms::renewals(
            self.lease.kind,
            self.lease
                .renewed
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        spawn_release(&self.semaphores, &self.lease.key, self.lease.token);
    }
}

// ---------------------------------------------------------------------------
// Local state: per key, a FIFO of waiters and one request task.
// ---------------------------------------------------------------------------
