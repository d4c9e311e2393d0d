//! A held distributed lock, its watchdog, and the loss signal.
//!
//! # Invariants
//!
//! 1. `valid_until` is measured on the monotonic clock from the moment the acquire
//!    (or the last successful renewal) was *sent*, minus a drift margin, so it is
//!    never later than the moment the backend lets the lock expire.
//! 2. The watchdog signals loss (the `lost` token) no later than `valid_until`, at
//!    once when the backend answers "not yours", and never un-signals it.
//! 3. The watchdog stops when the lease is finally released (not when it is handed
//!    off: one watchdog serves the lease across all its local holders).
//!
//! # Lock order
//!
//! The `valid_until` mutex is a leaf: nothing else is locked while it is held, and it
//! is never held across an `.await`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Extend, LeaseToken, LockBackend};
use crate::key::LockKey;
use crate::stats::StatsInner;

/// The safety margin subtracted from every validity window: 1 % of the TTL + 2 ms,
/// for clock drift between this process and the backend.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// One acquisition of a distributed lock, shared by all local holders it is handed to.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) key: LockKey,
    pub(crate) token: LeaseToken,
    pub(crate) epoch: u64,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    /// Local handoffs so far.
    pub(crate) handoffs: AtomicU32,
    /// Other instances waiting, as last reported by the backend.
    pub(crate) waiting: AtomicU32,
    valid_until: Mutex<Instant>,
    lost: CancellationToken,
    lost_reason: OnceLock<String>,
    stop: CancellationToken,
}

impl Lease {
    pub(crate) fn new(
        key: LockKey,
        token: LeaseToken,
        epoch: u64,
        ttl: Duration,
        sent_at: Instant,
        waiting: u32,
    ) -> Lease {
        Lease {
            key,
            token,
            epoch,
            ttl,
            acquired_at: Instant::now(),
            handoffs: AtomicU32::new(0),
            waiting: AtomicU32::new(waiting),
            valid_until: Mutex::new(sent_at + ttl.saturating_sub(drift(ttl))),
            lost: CancellationToken::new(),
            lost_reason: OnceLock::new(),
            stop: CancellationToken::new(),
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_valid_until(&self, at: Instant) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }

    /// Time left before the lease must be considered lost (zero once it is lost).
    pub(crate) fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    pub(crate) fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }

    pub(crate) fn lost_reason(&self) -> String {
        self.lost_reason
            .get()
            .cloned()
            .unwrap_or_else(|| "the lease was lost".into())
    }

    /// Signals loss once; returns `true` the first time.
    pub(crate) fn mark_lost(&self, reason: impl Into<String>) -> bool {
        if self.lost.is_cancelled() {
            return false;
        }
        let _ = self.lost_reason.set(reason.into());
        self.lost.cancel();
        true
    }

    /// Stops the watchdog (final release).
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stop.is_cancelled()
    }
}

/// Renews `lease` every `every` until it is stopped or lost.
pub(crate) async fn watchdog(
    lease: Arc<Lease>,
    backend: Arc<dyn LockBackend>,
    every: Duration,
    stats: Arc<StatsInner>,
) {
    let retry = (every / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    let mut next = Instant::now() + every;
    loop {
        let valid_until = lease.valid_until();
        tokio::select! {
            biased;
            _ = lease.stop.cancelled() => return,
            _ = tokio::time::sleep_until(valid_until) => {
                if !lease.is_stopped() && lease.mark_lost("its validity ran out before a renewal succeeded") {
                    stats.lost();
                }
                return;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent_at = Instant::now();
        stats.renew_attempt();
        let outcome = tokio::select! {
            biased;
            _ = lease.stop.cancelled() => return,
            _ = tokio::time::sleep_until(valid_until) => continue,
            r = backend.extend(&lease.key, lease.token, lease.ttl) => r,
        };
        match outcome {
            Ok(Extend::Extended { waiting }) => {
                stats.renewed();
                lease.waiting.store(waiting, Ordering::Relaxed);
                lease.set_valid_until(sent_at + lease.ttl.saturating_sub(drift(lease.ttl)));
                next = sent_at + every;
            }
            Ok(Extend::NotOwner) => {
                if !lease.is_stopped()
                    && lease.mark_lost("the backend reports the lock is no longer ours")
                {
                    stats.lost();
                }
                return;
            }
            Err(e) => {
                tracing::debug!(key = %lease.key, error = %e, "renewal failed; retrying");
                next = Instant::now() + retry;
            }
        }
    }
}
