//! The leader's acquire loop: the one task per key and process that talks to the
//! backend until it holds the lease or gives up.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{LockGuard, LockerState};
use crate::backend::{Acquire, LockBackend, LockKind};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::LeaseKind;
use crate::lease::acquire::{Failure, Pacer, grant};
use crate::slot::{Abandon, Inheritance, Slot};

/// What one call asks of the leader loop.
#[derive(Clone, Copy, Debug)]
pub(super) struct Call {
    pub(super) start: Instant,
    pub(super) deadline: Instant,
    /// Join the backend's queue when busy (`false` for a single attempt).
    pub(super) queue: bool,
    /// The TTL of a lease acquired by this call.
    pub(super) ttl: Duration,
}

/// The one task that talks to the backend for a key, until it holds the lease or
/// gives up. Dropping it unfinished passes leadership on (see [`Slot::abandon`]).
pub(super) struct Leading {
    shared: Arc<LockerState>,
    key: LockKey,
    slot: Option<Arc<Slot>>,
    lead: Inheritance,
    finished: bool,
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

    /// Releases a token whose acquire may have landed and leaves the backend queue,
    /// in the background. The queue entry is this process's (the backend's), so it is
    /// left only if no other task of the process still waits for the key's mutex
    /// (without coalescing, or with several lockers on one backend, others may); a
    /// waiter of the key's read-write lock or semaphore waits for another lock, with
    /// its own queue.
    pub(super) fn cleanup(&self, key: &LockKey, lead: Inheritance) {
        let wakeups = self.backend.wakeups();
        let lead = Inheritance {
            queued: lead.queued && !wakeups.is_watched(LockKind::Mutex, key.as_bytes()),
            ..lead
        };
        if lead.token.is_none() && !lead.queued {
            return;
        }
        let key = key.clone();
        let backend = Arc::clone(&self.backend);
        let stats = Arc::clone(&self.stats);
        self.spawn_background(async move {
            if let Some(token) = lead.token
                && let Err(e) = {
                    stats.release();
                    backend.release(&key, token).await
                }
            {
                tracing::debug!(%key, error = %e, "releasing an abandoned acquire failed");
            }
            if lead.queued
                && let Err(e) = {
                    stats.left();
                    backend.leave(&key).await
                }
            {
                tracing::debug!(%key, error = %e, "leaving the queue failed");
            }
        });
    }

    /// Acquires from the backend as the key's leader. `Ok(None)` only when `queue` is
    /// false and the lock is busy.
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
            queue,
            ttl,
        } = call;
        let token = inherited.token.unwrap_or_else(|| self.backend.new_token());
        let mut leading = Leading {
            shared: self.arc(),
            key: key.clone(),
            slot,
            lead: Inheritance {
                token: Some(token),
                queued: inherited.queued,
            },
            finished: false,
        };
        // Without coalescing every task of this process waits on its own: one
        // wake-up wakes one of them (and a task that stops waiting passes one on),
        // not all.
        let mut pacer = Pacer::new(
            self.backend.wakeups(),
            LockKind::Mutex,
            key,
            !self.config.coalescing,
        );
        // A lease of a warm key may be cached: the revocations of this key from
        // before the request on, kept by the lease (another instance that queues
        // while a local task uses the lease makes its release cache only for a
        // moment).
        let linger = self.config.handoff.linger;
        let mut revocation =
            (!self.config.fair && !linger.is_zero() && self.warm.is_warm(key, start, linger))
                .then(|| self.backend.wakeups().watch_revocation(key));
        loop {
            let sent_at = pacer.sending();
            // From here until a definite answer, the acquire may have landed, and may
            // have queued this instance.
            leading.lead.token = Some(token);
            leading.lead.queued |= queue;
            self.stats.acquire_attempt();
            let reply = if self.config.fair {
                // This leader is the instance's oldest waiting task (local FIFO): its
                // age places the instance in the queue.
                let age = sent_at.saturating_duration_since(start);
                tokio::time::timeout_at(
                    deadline,
                    self.backend.acquire_fair(key, token, ttl, queue, age),
                )
                .await
            } else {
                tokio::time::timeout_at(deadline, self.backend.acquire(key, token, ttl, queue))
                    .await
            };
            let reply = match reply {
                Ok(reply) => reply,
                Err(_) => return Err(self.timed_out(key, start)),
            };
            match reply {
                Ok(Acquire::Acquired {
                    epoch,
                    waiting,
                    earliest_other,
                }) => {
                    if epoch == 0 && self.backend.fencing() {
                        return Err(Error::backend(
                            key,
                            Phase::Acquiring,
                            "the backend granted the lock without a fencing epoch",
                        ));
                    }
                    let granted = grant(
                        &self.renewals,
                        &self.stats,
                        key,
                        LeaseKind::Mutex,
                        token,
                        epoch,
                        ttl,
                        sent_at,
                        waiting,
                    );
                    let Some(lease) = granted else {
                        // Not held: ask again with the same token, which re-arms it
                        // if it still exists.
                        if Instant::now() >= deadline {
                            return Err(self.timed_out(key, start));
                        }
                        continue;
                    };
                    leading.finished = true;
                    if self.config.fair {
                        // Who may be handed this lease in fair mode: local tasks that
                        // arrived before the request was sent when nobody else
                        // waited (any later remote waiter arrived after that), or
                        // before the earliest other waiter's arrival.
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
                    if let Some(revocation) = revocation.take() {
                        lease.set_revocation(revocation);
                    }

                    return Ok(Some(LockGuard::new(
                        self.arc(),
                        leading.slot.take(),
                        lease,
                        0,
                    )));
                }
                Ok(Acquire::Busy { retry_in }) => {
                    leading.lead.token = None;
                    if !queue {
                        return Ok(None);
                    }
                    if !pacer.watch() {
                        continue;
                    }
                    tokio::select! {
                        _ = pacer.woken_or(Instant::now() + retry_in) => {}
                        _ = tokio::time::sleep_until(deadline) => {
                            return Err(self.timed_out(key, start));
                        }
                    }
                }
                Err(e) => match Failure::of(&e) {
                    // A single attempt (`try_lock`) reports a missing quorum or too
                    // few replica acknowledgements at once: the nodes answered.
                    Failure::Retry if queue || !Failure::unavailable(&e) => {
                        // The token stays armed: a retry (or the cleanup) reconciles it.
                        tracing::debug!(%key, error = %e, "acquire failed; retrying");
                        let pause = pacer.backoff();
                        if Instant::now() + pause >= deadline {
                            return Err(e);
                        }
                        tokio::time::sleep(pause).await;
                    }
                    failure => {
                        // Refused at once, or a definite answer; a refusal keeps the
                        // token armed for the cleanup, which releases whatever a
                        // partly run script (or an unacknowledged grant) wrote.
                        if !failure.may_have_written() {
                            leading.lead.token = None;
                        }
                        return Err(e);
                    }
                },
            }
        }
    }

    pub(super) fn timed_out(&self, key: &LockKey, start: Instant) -> Error {
        self.stats.timeout();
        Error::Timeout {
            key: key.clone(),
            phase: Phase::Acquiring,
            waited: start.elapsed(),
        }
    }
}
