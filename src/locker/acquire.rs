//! The leader's acquire loop: the one task per key and process that talks to the
//! backend until it holds the lease or gives up.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{LockGuard, LockerState};
use crate::backend::{LeaseToken, LockBackend};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::LeaseKind;
use crate::lease::acquire::{Armed, Ask, Call, Granted, acquire};
use crate::slot::{Abandon, Inheritance, Slot};

/// The one task that talks to the backend for a key, until it holds the lease or
/// gives up. Dropped unfinished, it passes leadership and what its acquire left at
/// the backend (the token, the queue place) to the next local waiter (see
/// [`Slot::abandon`]); with nobody waiting, its [`Armed`] guard settles them.
struct MutexLeading {
    shared: Arc<LockerState>,
    slot: Option<Arc<Slot>>,
    armed: Armed,
}

impl Drop for MutexLeading {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let (token, queued) = self.armed.left();
        if let Abandon::Succeeded = slot.abandon(&self.shared.slots, Inheritance { token, queued })
        {
            self.armed.disarm();
        }
    }
}

impl LockerState {
    pub(super) fn arc(&self) -> Arc<LockerState> {
        self.me
            .upgrade()
            .expect("a Locker's shared state is alive while it is used")
    }

    /// What a mutex acquire left at the backend (`lead`), for no local task to
    /// take over: its [`Armed`] guard, dropped here, releases the token and leaves
    /// the backend queue in the background (the queue entry is this process's, so
    /// it is left only if no other task of the process still waits for the key's
    /// mutex: without coalescing, or with several lockers on one backend, others
    /// may; a waiter of the key's read-write lock or semaphore waits for another
    /// lock, with its own queue).
    pub(super) fn cleanup(&self, key: &LockKey, lead: Inheritance) {
        // Most releases leave nothing: no guard to build.
        if lead.token.is_none() && !lead.queued {
            return;
        }
        drop(self.armed(key, lead.token.into_iter().collect(), lead));
    }

    /// The guard of a mutex acquire with `tokens` (its token, which is `lead`'s
    /// when it has one) that takes over what an earlier one left (`lead`).
    fn armed(&self, key: &LockKey, tokens: Vec<LeaseToken>, lead: Inheritance) -> Armed {
        Armed::new(&self.engine, LeaseKind::Mutex, key, tokens, ())
            .inheriting(lead.token.is_some(), lead.queued)
    }

    /// Acquires from the backend as the key's leader. `Ok(None)` only in
    /// [`WhenBusy::Return`](crate::backend::WhenBusy::Return) when the lock is busy.
    pub(super) async fn lead(
        &self,
        key: &LockKey,
        slot: Option<Arc<Slot>>,
        inherited: Inheritance,
        call: Call,
    ) -> Result<Option<LockGuard>> {
        let Call { start, ttl, .. } = call;
        let token = inherited
            .token
            .unwrap_or_else(|| self.engine.backend.new_token());
        let mut leading = MutexLeading {
            shared: self.arc(),
            slot,
            armed: self.armed(key, vec![token], inherited),
        };
        let revocation = self.revocations_to_cache(key, start);
        let ask = Ask {
            key,
            kind: LeaseKind::Mutex,
            token,
            call,
            // Without coalescing every task of this process waits on its own: one
            // wake-up wakes one of them (and a task that stops waiting passes one
            // on), not all.
            one_at_a_time: !self.engine.config.coalescing,
        };
        let (backend, fair) = (&self.engine.backend, self.engine.config.fair);
        let granted = acquire(
            &self.engine,
            ask,
            &mut leading.armed,
            |token, mode, sent_at| async move {
                if fair {
                    // This leader is the instance's oldest waiting task (local FIFO):
                    // its age places the instance in the queue.
                    let age = sent_at.saturating_duration_since(start);
                    backend.acquire_fair(key, token, ttl, mode, age).await
                } else {
                    backend.acquire(key, token, ttl, mode).await
                }
            },
        )
        .await?;
        let Some(Granted {
            lease,
            sent_at,
            waiting,
            earliest_other,
        }) = granted
        else {
            return Ok(None);
        };
        leading.armed.disarm();
        if fair {
            // Who may be handed this lease in fair mode: local tasks that arrived
            // before the request was sent when nobody else waited (any later remote
            // waiter arrived after that), or before the earliest other waiter's
            // arrival.
            let bound = match earliest_other {
                _ if waiting == 0 => Some(sent_at),
                Some(age) => sent_at.checked_sub(age),
                None => None,
            };
            if let Some(bound) = bound {
                lease.set_arrival_bound(bound);
            }
        }
        if let Some(slot) = &leading.slot {
            let found = u32::try_from(slot.acquired()).unwrap_or(u32::MAX);
            lease.found_waiting.store(found, Ordering::Relaxed);
        }
        if let Some(revocation) = revocation {
            lease.set_revocation(revocation);
        }
        Ok(Some(LockGuard::new(
            self.arc(),
            leading.slot.take(),
            lease,
            0,
        )))
    }

    pub(super) fn timed_out(&self, key: &LockKey, start: Instant) -> Error {
        self.engine.stats.timeout();
        Error::timeout(key, Phase::Acquiring, start.elapsed())
    }
}
