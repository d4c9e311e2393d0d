//! The leader's acquire loop: the one task per key and process that talks to the
//! backend until it holds the lease or gives up.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{LockGuard, LockerState};
use crate::backend::{LeaseToken, LockBackend, LockKind, WhenBusy};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::LeaseKind;
use crate::lease::acquire::{Ask, Granted, InFlight, acquire};
use crate::lease::release::release_token;
use crate::slot::{Abandon, Inheritance, Slot};

/// What one call asks of the leader loop.
#[derive(Clone, Copy, Debug)]
pub(super) struct Call {
    pub(super) start: Instant,
    pub(super) deadline: Instant,
    /// Wait (joining the backend's queue when busy), or one attempt.
    pub(super) mode: WhenBusy,
    /// The TTL of a lease acquired by this call.
    pub(super) ttl: Duration,
}

/// The one task that talks to the backend for a key, until it holds the lease or
/// gives up. Dropping it unfinished passes leadership on (see [`Slot::abandon`]).
pub(super) struct Leading {
    shared: Arc<LockerState>,
    key: LockKey,
    slot: Option<Arc<Slot>>,
    token: LeaseToken,
    lead: Inheritance,
    finished: bool,
}

impl InFlight for Leading {
    fn sending(&mut self, mode: WhenBusy) {
        // From here until a definite answer, the acquire may have landed, and may
        // have queued this instance.
        self.lead.token = Some(self.token);
        self.lead.queued |= mode == WhenBusy::Queue;
    }

    fn answered(&mut self, holds: bool) {
        self.lead.token = holds.then_some(self.token);
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let cleanup = match &self.slot {
            Some(slot) => match slot.abandon(&self.shared.slots, self.lead) {
                Abandon::Succeeded => return,
                Abandon::Cleanup(lead) => lead,
            },
            None => self.lead,
        };
        self.shared.cleanup(&self.key, cleanup);
    }
}

impl LockerState {
    pub(super) fn arc(&self) -> Arc<LockerState> {
        self.me
            .upgrade()
            .expect("a Locker's shared state is alive while it is used")
    }

    /// Releases a token whose acquire may have landed (on the shared schedule,
    /// [`release_token`]) and leaves the backend queue, in the background. The
    /// queue entry is this process's (the backend's), so it is left only if no other
    /// task of the process still waits for the key's mutex (without coalescing, or
    /// with several lockers on one backend, others may); a waiter of the key's
    /// read-write lock or semaphore waits for another lock, with its own queue.
    pub(super) fn cleanup(&self, key: &LockKey, lead: Inheritance) {
        let wakeups = self.engine.backend.signals();
        let lead = Inheritance {
            queued: lead.queued && !wakeups.is_watched(LockKind::Mutex, key.as_bytes()),
            ..lead
        };
        if lead.token.is_none() && !lead.queued {
            return;
        }
        let key = key.clone();
        let engine = Arc::clone(&self.engine);
        self.engine.spawn_background(async move {
            if let Some(token) = lead.token {
                release_token(&engine, LeaseKind::Mutex, &key, token).await;
            }
            if lead.queued {
                engine.stats.left();
                if let Err(e) = engine.backend.leave(&key).await {
                    tracing::debug!(%key, error = %e, "leaving the queue failed");
                }
            }
        });
    }

    /// Acquires from the backend as the key's leader. `Ok(None)` only in
    /// [`WhenBusy::Return`] when the lock is busy.
    pub(super) async fn lead(
        &self,
        key: &LockKey,
        slot: Option<Arc<Slot>>,
        inherited: Inheritance,
        call: Call,
    ) -> Result<Option<LockGuard>> {
        let Call {
            start,
            deadline,
            mode,
            ttl,
        } = call;
        let token = inherited
            .token
            .unwrap_or_else(|| self.engine.backend.new_token());
        let mut leading = Leading {
            shared: self.arc(),
            key: key.clone(),
            slot,
            token,
            lead: Inheritance {
                token: Some(token),
                queued: inherited.queued,
            },
            finished: false,
        };
        // A lease of a warm key may be cached: the revocations of this key from
        // before the request on, kept by the lease (another instance that queues
        // while a local task uses the lease makes its release cache only for a
        // moment).
        let linger = self.engine.config.lease_cache;
        let revocation = (!self.engine.config.fair
            && !linger.is_zero()
            && self.warm.is_warm(key, start, linger))
        .then(|| self.engine.backend.signals().watch_revocation(key));
        let ask = Ask {
            key,
            kind: LeaseKind::Mutex,
            token,
            ttl,
            mode,
            start,
            deadline,
            // Without coalescing every task of this process waits on its own: one
            // wake-up wakes one of them (and a task that stops waiting passes one
            // on), not all.
            one_at_a_time: !self.engine.config.coalescing,
        };
        let (backend, fair) = (&self.engine.backend, self.engine.config.fair);
        let granted = acquire(
            &self.engine,
            ask,
            &mut leading,
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
        leading.finished = true;
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
