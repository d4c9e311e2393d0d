//! The end of a hold: local handoff within the budget, or the backend release
//! (in the background when the guard is dropped).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::LockerState;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::lease::release::{End, Ran, Release as BackendRelease, Settle};
use crate::slot::{Abandon, Forward, Grant, Inheritance, ReleaseStep, Slot};

impl LockerState {
    /// Ends a holder's use of `lease` (as handoff number `seq`): hands it to the next
    /// local waiter when allowed, or returns the backend release to run.
    pub(crate) fn finish(
        &self,
        slot: Option<Arc<Slot>>,
        lease: Arc<Lease>,
        seq: u64,
    ) -> End<SlotEnd> {
        if let Some(slot) = &slot {
            // One reading of the clock for this synchronous step: the handoff
            // decision and the caching's deadline.
            let now = Instant::now();
            let handoff = self.engine.may_hand_off_at(&lease, now);
            // Fair: only to a waiter that arrived before every other instance's
            // waiter (the lease's arrival bound; none: no handoff in fair mode).
            let arrived_by = self
                .engine
                .config
                .fair
                .then(|| lease.arrival_bound().unwrap_or(lease.acquired_at));
            let keep = self.caching(&lease, now);
            match slot.release(&lease, seq + 1, handoff, keep, arrived_by) {
                ReleaseStep::HandedOff => {
                    lease.handoffs.fetch_add(1, Ordering::Relaxed);
                    self.engine.stats.handoff();
                    return End::Kept;
                }
                ReleaseStep::Cached(caching, start) => {
                    let keep = keep.expect("cached only when asked to");
                    return self.cached(slot, &lease, caching, start, keep);
                }
                ReleaseStep::Backend => {}
            }
        }
        End::Release(self.release_job(slot, lease))
    }

    /// Ends a holder's use of `lease` (as handoff number `seq`) by leaving it at
    /// the backend until `ttl` from now: no handoff, no caching, and no release
    /// ([`BackendRelease::keeping`]); the slot's next waiter leads, and meets the
    /// lease at the backend.
    pub(crate) fn keep(
        &self,
        slot: Option<Arc<Slot>>,
        lease: Arc<Lease>,
        seq: u64,
        ttl: std::time::Duration,
    ) -> BackendRelease<SlotEnd> {
        leave_slot(slot.as_ref(), &lease, seq);
        let end = SlotEnd {
            shared: self.arc(),
            key: lease.key.clone(),
            slot,
        };
        BackendRelease::keeping(Arc::clone(&self.engine), lease, end, ttl)
    }

    /// Ends a holder's use of `lease` (as handoff number `seq`) with its backend
    /// release: no handoff and no caching, so the key's next holder, here or
    /// elsewhere, takes a lease of its own (a scheduled job's end: the next tick
    /// gets a fresh TTL, hold limit and fencing token).
    pub(crate) fn finish_at_backend(
        &self,
        slot: Option<Arc<Slot>>,
        lease: Arc<Lease>,
        seq: u64,
    ) -> BackendRelease<SlotEnd> {
        leave_slot(slot.as_ref(), &lease, seq);
        self.release_job(slot, lease)
    }

    /// The backend release of `lease`, held by `slot` (none without coalescing),
    /// from its first attempt.
    pub(super) fn release_job(
        &self,
        slot: Option<Arc<Slot>>,
        lease: Arc<Lease>,
    ) -> BackendRelease<SlotEnd> {
        // The key's next lease, if taken soon, may be cached.
        self.warm.released(&lease.key);
        let end = SlotEnd {
            shared: self.arc(),
            key: lease.key.clone(),
            slot,
        };
        BackendRelease::new(Arc::clone(&self.engine), lease, end)
    }
}

/// Leaves `slot` without handing `lease` on or caching it: the backend ends it.
fn leave_slot(slot: Option<&Arc<Slot>>, lease: &Arc<Lease>, seq: u64) {
    if let Some(slot) = slot {
        let step = slot.release(lease, seq + 1, false, None, None);
        debug_assert_eq!(step, ReleaseStep::Backend);
    }
}

impl Forward for LockerState {
    fn watch(&self, slot: &Arc<Slot>) {
        if crate::runtime::spawn(Arc::clone(slot).watch()).is_none() {
            slot.watch_dropped();
        }
    }

    fn forward(&self, slot: &Arc<Slot>, grant: Grant) {
        match grant {
            Grant::Leadership(lead) => {
                if let Abandon::Cleanup(lead) = slot.abandon(&self.slots, lead) {
                    self.cleanup(slot.key(), lead);
                }
            }
            Grant::Lease(lease, seq) => {
                // The waiter never used it: pass it on as if it had just finished,
                // without claiming a sequence number it did not use.
                self.finish(Some(Arc::clone(slot)), lease, seq.saturating_sub(1))
                    .in_background();
            }
        }
    }
}

/// What a mutex release lets go: its slot, whose next waiter leads (inheriting
/// this instance's place in the backend's queue after a fair release), or which
/// goes idle.
pub(crate) struct SlotEnd {
    shared: Arc<LockerState>,
    key: LockKey,
    slot: Option<Arc<Slot>>,
}

impl Settle for SlotEnd {
    /// Fair: a local waiter keeps this instance's place in the backend's queue
    /// (its arrival time), so the release wakes whoever arrived first.
    fn requeue(&self) -> Option<Instant> {
        match &self.slot {
            Some(slot) if self.shared.engine.config.fair => slot.oldest_waiter(),
            _ => None,
        }
    }

    /// Lets the next local waiter lead; with nobody waiting, the slot goes idle
    /// and a requeued instance leaves the backend's queue (in the background).
    fn settle(self, how: Ran) {
        let lead = Inheritance {
            token: None,
            queued: how == Ran::Sent { requeued: true },
        };
        let left = match &self.slot {
            Some(slot) => slot.released(&self.shared.slots, lead),
            None => Some(lead),
        };
        if let Some(lead) = left {
            self.shared.cleanup(&self.key, lead);
        }
    }
}
