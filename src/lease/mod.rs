//! A held distributed lock, its watchdog, and the loss signal.
//!
//! The watchdog is one task per [`Locker`](crate::Locker) (see [`renewal`]): a set
//! of held leases, each due for renewal a renewal interval after the previous
//! renewal (or the acquire) was sent, scanned every quarter of that interval. The
//! leases due in one scan go to one short-lived task that renews them in a batch
//! (one backend call, retrying each lease's errors until its validity ends) and
//! puts each back in the set. Short critical sections cost no task and no timer:
//! their leases join and leave the set (a push and a swap-remove under a mutex)
//! long before they are due.
//!
//! # Invariants
//!
//! 0. Every observer decides loss for itself: [`Lease::is_lost`] is true once the
//!    loss was signalled **or** `valid_until` has passed on the monotonic clock, and
//!    the loss future ([`Lease::lost`]) resolves at `valid_until` by its own timer,
//!    whatever the renewal task does (it may be late, or its runtime gone).
//! 1. `valid_until` is measured on the monotonic clock from the moment the acquire
//!    (or the last successful renewal) was *sent*, minus a drift margin, so it is
//!    never later than the moment the backend lets the lock expire.
//! 2. The watchdog signals loss (the `lost` token) at once when the backend answers
//!    "not yours" (or the node refuses writes as a read-only replica), and never
//!    un-signals it. The loss counter is incremented **before** the signal, so a
//!    task woken by the signal sees it counted.
//! 3. The watchdog stops when the lease is finally released (not when it is handed
//!    off: one watchdog serves the lease across all its local holders).
//! 4. From its grant until its final release a lease is registered, by token, with
//!    its backend's [`Signals`] (`Renewals::watch`, `Renewals::forget`): a
//!    takeover message (a forced release deleted that token's lease) marks exactly
//!    that lease lost, at once, never another lease of the key. A cached lease is
//!    not finally released, so it stays registered, and renewed.
//!
//! # Lock order
//!
//! The renewal set's mutex, then a lease's `valid_until` mutex (a leaf). A lease's
//! `registration` mutex is a leaf too: the registry's map is written before it is taken
//! or after it is let go. None is held across an `.await`.

use std::sync::atomic::{AtomicU32, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{LeaseToken, Losable, Registration, Signals};
use crate::key::LockKey;
use crate::stats::StatsInner;

pub(crate) mod acquire;
pub(crate) mod engine;
pub(crate) mod failure;
pub(crate) mod histograms;
#[cfg(test)]
mod model;
pub(crate) mod release;
pub(crate) mod renewal;
mod view;

pub(crate) use crate::backend::drift;
pub(crate) use view::observe_lease;
pub use view::{FencingToken, LockInfo, Loss, LossSignal};

/// The loss reason when the validity window ended without a successful renewal.
pub(crate) const VALIDITY_ENDED: &str = "its validity ran out before a renewal succeeded";
/// The loss reason of a lease held up to the locker's hold limit.
pub(crate) const HOLD_LIMIT_REACHED: &str =
    "it was held up to the locker's hold limit, after which it is not renewed";
/// The loss reason of a lease whose server restarted without its data.
pub(crate) const RESTARTED: &str =
    "its server restarted without its data (or was flushed), which ends every lease it granted";
/// The loss reason of a lease that a forced release deleted at the backend.
pub(crate) const TAKEN_OVER: &str =
    "it was taken over by a forced release (an operator deleted it at the backend)";

/// What a lease holds: how the watchdog renews it.
pub(crate) use crate::backend::LeaseKind;

/// One acquisition of a distributed lock, shared by all local holders it is handed to.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) key: LockKey,
    pub(crate) kind: LeaseKind,
    pub(crate) token: LeaseToken,
    pub(crate) epoch: u64,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    /// Local handoffs so far.
    pub(crate) handoffs: AtomicU32,
    /// Successful renewals so far.
    pub(crate) renewed: AtomicU32,
    /// Other instances waiting, as last reported by the backend.
    pub(crate) waiting: AtomicU32,
    /// Local waiters when the lease was taken (`u32::MAX` until a leader records
    /// them): the handoff budget while other instances wait follows it.
    pub(crate) found_waiting: AtomicU32,
    valid_until: Mutex<Instant>,
    /// The hold limit's end, if the locker has one: validity never extends past it.
    hold_until: OnceLock<Instant>,
    /// Fair mode: local tasks that arrived before this arrived before every waiter
    /// of every other instance, and may be handed the lease (unset: none may while
    /// other instances wait).
    arrival_bound: OnceLock<Instant>,
    /// A lease taken from a grant: the window the server keeps it for until its
    /// first renewal (`lease::acquire::grant_within`).
    grant_window: OnceLock<Duration>,
    /// A mutex lease that may be cached (its key was warm when it was asked for):
    /// the revocations of its key since the request that took it (see
    /// [`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)).
    revocation: OnceLock<crate::backend::Revocation>,
    /// The lease's registration for takeovers, from its grant until its final
    /// release ([`Signals::register`](crate::backend::Signals)).
    registration: Mutex<Option<Registration>>,
    lost: CancellationToken,
    lost_reason: OnceLock<String>,
    stop: CancellationToken,
    stats: Arc<StatsInner>,
    /// The lease's index in the renewal set (`usize::MAX` when not in it). Only
    /// written while the set's mutex is held.
    renewal_index: AtomicUsize,
}

impl Lease {
    pub(crate) fn new(
        key: LockKey,
        token: LeaseToken,
        epoch: u64,
        ttl: Duration,
        sent_at: Instant,
        waiting: u32,
        stats: Arc<StatsInner>,
    ) -> Lease {
        Lease {
            key,
            kind: LeaseKind::Mutex,
            token,
            epoch,
            ttl,
            acquired_at: Instant::now(),
            handoffs: AtomicU32::new(0),
            renewed: AtomicU32::new(0),
            waiting: AtomicU32::new(waiting),
            found_waiting: AtomicU32::new(u32::MAX),
            valid_until: Mutex::new(sent_at + ttl.saturating_sub(drift(ttl))),
            hold_until: OnceLock::new(),
            arrival_bound: OnceLock::new(),
            grant_window: OnceLock::new(),
            revocation: OnceLock::new(),
            registration: Mutex::new(None),
            lost: CancellationToken::new(),
            lost_reason: OnceLock::new(),
            stop: CancellationToken::new(),
            stats,
            renewal_index: AtomicUsize::new(usize::MAX),
        }
    }

    /// The same lease, of another kind (renewed through that kind's backend call).
    pub(crate) fn with_kind(mut self, kind: LeaseKind) -> Lease {
        self.kind = kind;
        self
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_valid_until(&self, at: Instant) {
        let at = self.hold_until.get().map_or(at, |&end| at.min(end));
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }

    /// Ends the lease's validity at `end` at the latest, whatever its renewals do
    /// (the locker's hold limit).
    pub(crate) fn limit_hold(&self, end: Instant) {
        if self.hold_until.set(end).is_ok() {
            self.set_valid_until(self.valid_until());
        }
    }

    /// A lease taken from a grant: its validity counts `window` from its request's
    /// send until its first renewal (set once, before it is shared).
    pub(crate) fn granted_for(&self, window: Duration, sent_at: Instant) {
        if self.grant_window.set(window).is_ok() {
            self.set_valid_until(sent_at + window.saturating_sub(drift(window)));
        }
    }

    /// The window of a lease taken from a grant ([`granted_for`](Self::granted_for)).
    pub(crate) fn grant_window(&self) -> Option<Duration> {
        self.grant_window.get().copied()
    }

    /// Fair mode: sets who may be handed the lease (see `arrival_bound`), once.
    pub(crate) fn set_arrival_bound(&self, at: Instant) {
        let _ = self.arrival_bound.set(at);
    }

    /// Keeps the revocations of the lease's key (once).
    pub(crate) fn set_revocation(&self, revocation: crate::backend::Revocation) {
        let _ = self.revocation.set(revocation);
    }

    /// Registers the lease with its backend's takeovers: a forced release that
    /// deletes it marks it lost at once ([`Losable::taken_over`]). Until
    /// [`unregister`](Self::unregister), or the lease's drop.
    pub(crate) fn register(self: &Arc<Self>, signals: &Signals) {
        let weak: Weak<dyn Losable> = Arc::downgrade(self) as Weak<Self>;
        let registration = signals.register(self.token, weak);
        let previous = self
            .registration
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(registration);
        drop(previous);
    }

    /// Ends the lease's registration with its backend's takeovers (its final
    /// release is under way).
    pub(crate) fn unregister(&self) {
        let registration = self
            .registration
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(registration);
    }

    /// The revocations of the lease's key, if it may be cached.
    pub(crate) fn revocation(&self) -> Option<&crate::backend::Revocation> {
        self.revocation.get()
    }

    /// Fair mode: local tasks that arrived before this may be handed the lease.
    pub(crate) fn arrival_bound(&self) -> Option<Instant> {
        self.arrival_bound.get().copied()
    }

    /// The hold limit's end, if the locker has one.
    pub(crate) fn hold_until(&self) -> Option<Instant> {
        self.hold_until.get().copied()
    }

    /// Whether the quarantine limit (if any) has been reached.
    pub(crate) fn hold_ended(&self) -> bool {
        self.hold_until
            .get()
            .is_some_and(|&end| Instant::now() >= end)
    }

    /// Why a lease whose validity ran out is lost.
    fn expiry_reason(&self) -> &'static str {
        if self.hold_ended() {
            HOLD_LIMIT_REACHED
        } else {
            VALIDITY_ENDED
        }
    }

    /// Time left before the lease must be considered lost (zero once it is lost).
    pub(crate) fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Time left at `now`, or `None` if the lease is lost: signalled, or past its
    /// validity at `now` (then this call signals it, as [`is_lost`](Self::is_lost)
    /// does). One reading of the clock for callers that need both.
    pub(crate) fn left_at(&self, now: Instant) -> Option<Duration> {
        if self.signalled() {
            return None;
        }
        let until = self.valid_until();
        if now >= until {
            self.mark_lost(self.expiry_reason());
            return None;
        }
        Some(until - now)
    }

    /// Whether the lease is lost: signalled, or past its validity on the monotonic
    /// clock (then this call signals it, so every observer agrees).
    pub(crate) fn is_lost(&self) -> bool {
        if self.signalled() {
            return true;
        }
        if Instant::now() >= self.valid_until() {
            self.mark_lost(self.expiry_reason());
            return true;
        }
        false
    }

    /// Resolves when the lease is lost: at the signal, or at `valid_until` by its own
    /// timer (re-read after each wake, since a renewal moves it).
    pub(crate) async fn lost(self: Arc<Self>) {
        loop {
            let until = self.valid_until();
            tokio::select! {
                biased;
                _ = self.lost.cancelled() => return,
                _ = tokio::time::sleep_until(until) => {}
            }
            if Instant::now() >= self.valid_until() {
                // Another caller may have begun marking it (set the reason) and
                // not yet fired the signal: resolve with the signal, as the
                // first branch does, so the loss is counted when this resolves.
                if !self.mark_lost(self.expiry_reason()) {
                    self.lost.cancelled().await;
                }
                return;
            }
        }
    }

    pub(crate) fn lost_reason(&self) -> String {
        self.lost_reason
            .get()
            .cloned()
            .unwrap_or_else(|| "the lease was lost".into())
    }

    /// Whether the loss was signalled, or is being: [`mark_lost`](Self::mark_lost)
    /// sets the reason, once, before the signal fires, and nothing else sets it.
    /// One atomic load, where asking the token takes its mutex: this is asked on
    /// every grant and handoff.
    pub(crate) fn signalled(&self) -> bool {
        self.lost_reason.get().is_some()
    }

    /// Signals loss once; returns `true` the first time. The reason and the loss
    /// counter are set before the signal fires, so whoever is woken by it sees both.
    /// A lease whose final release had begun before it was marked is not
    /// counted: that is read before the mark, so a release that follows a loss
    /// (seen through [`is_lost`](Self::is_lost), which is true from the mark on)
    /// cannot keep the loss from being counted.
    pub(crate) fn mark_lost(&self, reason: impl Into<String>) -> bool {
        let released = self.is_stopped();
        if self.signalled() || self.lost_reason.set(reason.into()).is_err() {
            return false;
        }
        if !released {
            self.stats.lost();
        }
        self.lost.cancel();
        true
    }

    /// Marks the lease finally released: renewal stops.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stop.is_cancelled()
    }
}

impl Losable for Lease {
    /// Signals the loss at once (see [`Signals::take_over`]). Every path that
    /// would start a new local section on the lease (a handoff, a cached lease
    /// taken, a reader joining a shared read lease) checks [`Lease::is_lost`]
    /// first, and the release of a lost lease goes to the backend.
    fn taken_over(&self) {
        if self.mark_lost(TAKEN_OVER) {
            tracing::debug!(key = %self.key, kind = ?self.kind, "lease taken over by a forced release");
        }
    }

    fn key(&self) -> &LockKey {
        &self.key
    }

    fn restarted(&self) {
        if self.mark_lost(RESTARTED) {
            tracing::debug!(key = %self.key, kind = ?self.kind, "lease lost with its server's data");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use super::*;

    /// A lease whose validity has ended, seen by `lost()` while another caller is
    /// between marking it (the reason set) and firing the signal: `lost()` waits
    /// for the signal, so the loss is counted when it resolves; and a release
    /// that follows the mark does not keep the first marker from counting it.
    #[tokio::test(start_paused = true)]
    async fn lost_resolves_with_the_signal_and_a_later_release_keeps_the_count() {
        let stats = Arc::new(StatsInner::default());
        let ttl = Duration::from_secs(1);
        let lease = Arc::new(Lease::new(
            LockKey::from("k"),
            LeaseToken::random(),
            1,
            ttl,
            Instant::now(),
            0,
            Arc::clone(&stats),
        ));
        tokio::time::advance(2 * ttl).await;
        // Another caller's mark, half done: the reason is set, the signal not yet.
        lease.lost_reason.set("the validity ended".into()).unwrap();
        let mut lost = std::pin::pin!(Arc::clone(&lease).lost());
        assert!(
            futures::poll!(lost.as_mut()).is_pending(),
            "lost() resolved before the loss was signalled (and counted)"
        );
        lease.lost.cancel();
        assert_eq!(futures::poll!(lost.as_mut()), Poll::Ready(()));

        // A release that follows the mark: the mark still counts.
        let other = Arc::new(Lease::new(
            LockKey::from("k2"),
            LeaseToken::random(),
            2,
            ttl,
            Instant::now(),
            0,
            Arc::clone(&stats),
        ));
        assert!(other.mark_lost("gone"));
        other.stop();
        assert_eq!(stats.snapshot().leases_lost, 1);
        // Marked after its release began: not counted.
        let released = Arc::new(Lease::new(
            LockKey::from("k3"),
            LeaseToken::random(),
            3,
            ttl,
            Instant::now(),
            0,
            Arc::clone(&stats),
        ));
        released.stop();
        assert!(released.mark_lost("gone"));
        assert_eq!(stats.snapshot().leases_lost, 1);
    }
}
