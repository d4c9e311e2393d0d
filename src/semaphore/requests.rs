//! The per-key request task: one backend request for the permits of every local
//! waiter, and the FIFO hand-out of what it grants.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::permit::{Permit, PermitPool};
use super::{MAX_BATCH, pending};
use crate::backend::{LeaseToken, LockKind, WhenBusy};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::lease::acquire::Pacer;
use crate::lease::engine::Engine;
use crate::lease::failure::Failure;

/// The semaphores of one locker, per key, over the locker's engine.
#[derive(Debug)]
pub(crate) struct Semaphores {
    pub(super) engine: Arc<Engine>,
    pub(super) keys: Mutex<HashMap<LockKey, Arc<KeyPermits>>>,
}

#[derive(Debug)]
pub(super) struct KeyPermits {
    pub(super) key: LockKey,
    pub(super) permits: u32,
    pub(super) queue: Mutex<Queue>,
    /// A waiter left: the request task checks whether anyone still waits.
    pub(super) left: Notify,
}

#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) waiters: VecDeque<Waiter>,
    pub(super) next_id: u64,
    /// Whether the request task runs.
    pub(super) driving: bool,
}

#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) tx: oneshot::Sender<Result<Permit>>,
}

impl KeyPermits {
    pub(super) fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A waiter's place in its key's queue; dropping it leaves the queue.
pub(super) struct Waiting {
    pub(super) state: Arc<KeyPermits>,
    pub(super) id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut q = self.state.queue();
        if let Some(at) = q.waiters.iter().position(|w| w.id == self.id) {
            q.waiters.remove(at);
            if q.waiters.is_empty() {
                drop(q);
                self.state.left.notify_one();
            }
        }
    }
}

impl Semaphores {
    pub(crate) fn new(engine: Arc<Engine>) -> Semaphores {
        Semaphores {
            engine,
            keys: Mutex::default(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<LockKey, Arc<KeyPermits>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// [`Error::PermitMismatch`] if local waiters of `key` use another number.
    pub(super) fn check_permits(&self, key: &LockKey, permits: u32) -> Result<()> {
        match self.lock().get(key) {
            Some(state) if state.permits != permits => Err(Error::PermitMismatch {
                key: key.clone(),
                permits: state.permits,
                requested: permits,
            }),
            _ => Ok(()),
        }
    }

    /// Queues a waiter for a permit of `key`, starting the key's request task if
    /// none runs.
    pub(super) fn enqueue(
        self: &Arc<Self>,
        key: &LockKey,
        permits: u32,
    ) -> Result<(oneshot::Receiver<Result<Permit>>, Waiting)> {
        if !crate::runtime::available() {
            return Err(Error::backend(
                key,
                Phase::Acquiring,
                "a semaphore needs a Tokio runtime",
            ));
        }
        let mut keys = self.lock();
        let state = Arc::clone(keys.entry(key.clone()).or_insert_with(|| {
            Arc::new(KeyPermits {
                key: key.clone(),
                permits,
                queue: Mutex::default(),
                left: Notify::new(),
            })
        }));
        if state.permits != permits {
            return Err(Error::PermitMismatch {
                key: key.clone(),
                permits: state.permits,
                requested: permits,
            });
        }
        let mut q = state.queue();
        if q.waiters.len() >= self.engine.config.max_waiters {
            return Err(Error::Overloaded {
                key: key.clone(),
                waiters: self.engine.config.max_waiters,
            });
        }
        let (tx, rx) = oneshot::channel();
        let id = q.next_id;
        q.next_id += 1;
        q.waiters.push_back(Waiter { id, tx });
        if !q.driving {
            q.driving = true;
            let driver = Driver {
                semaphores: Arc::clone(self),
                state: Arc::clone(&state),
                finished: false,
            };
            crate::runtime::spawn(driver.run());
        } else {
            self.engine.stats.local_wait();
        }
        drop(q);
        drop(keys);
        Ok((rx, Waiting { state, id }))
    }
}

impl PermitPool for Semaphores {
    fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Passes the permit `lease` (whose holder is done with it) to the first local
    /// waiter of its key, within the handoff budget: no backend request, the same
    /// token, renewed by the same watchdog entry. `false` if it may not be handed
    /// on or nobody waits here; the caller then returns it to the backend.
    ///
    /// Safety: the permit stays one of the key's `N` live permits throughout (it is
    /// valid for at least `min_validity` and is never returned to the backend in
    /// between), and it has one holder at a time: the old holder's [`Permit`] is
    /// finished (`done`) before the new one exists. Fairness: the budget is the
    /// mutex's ([`Engine::may_hand_off`]), halved while the backend reported other
    /// instances waiting. In fair mode none while others wait, and otherwise only
    /// to a waiter queued before `fair_bound` (see [`Permit`]'s `fair_bound`).
    fn hand_off(self: Arc<Self>, lease: &Arc<Lease>, fair_bound: u64) -> bool {
        if !self.engine.may_hand_off(lease) {
            return false;
        }
        let Some(state) = self.lock().get(&lease.key).map(Arc::clone) else {
            return false;
        };
        loop {
            let mut q = state.queue();
            if self.engine.config.fair && q.waiters.front().is_some_and(|w| w.id >= fair_bound) {
                return false;
            }
            let Some(waiter) = q.waiters.pop_front() else {
                return false;
            };
            let emptied = q.waiters.is_empty();
            drop(q);
            if emptied {
                // The request task may be waiting for a wake-up for this waiter.
                state.left.notify_one();
            }
            let queue: Arc<dyn PermitPool> = Arc::clone(&self) as Arc<dyn PermitPool>;
            let permit = Permit::handed_off(&queue, lease, fair_bound);
            match waiter.tx.send(Ok(permit)) {
                Ok(()) => {
                    lease.handoffs.fetch_add(1, Ordering::Relaxed);
                    self.engine.stats.handoff();
                    return true;
                }
                // That waiter is gone (its call was dropped): the next one.
                Err(Ok(mut back)) => back.done = true,
                Err(Err(_)) => return false,
            }
        }
    }
}

/// The request task of one key. If it is dropped unfinished (its runtime shut
/// down), the key's state is dropped with it: its waiters get an error, and the
/// next acquire starts afresh.
pub(super) struct Driver {
    pub(super) semaphores: Arc<Semaphores>,
    pub(super) state: Arc<KeyPermits>,
    pub(super) finished: bool,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut keys = self.semaphores.lock();
        if keys
            .get(&self.state.key)
            .is_some_and(|s| Arc::ptr_eq(s, &self.state))
        {
            keys.remove(&self.state.key);
        }
        let mut q = self.state.queue();
        q.driving = false;
        q.waiters.clear();
    }
}

/// What the request task does next.
pub(super) enum Next {
    /// Ask the backend for this many permits.
    Ask(usize),
    /// Nobody waits: leave the backend's waiting set (if in it) and end.
    Done,
}

impl Driver {
    pub(super) async fn run(mut self) {
        let span = tracing::debug_span!("lockflight.semaphore", key = %self.state.key);
        tracing::Instrument::instrument(self.drive(), span).await;
        self.finished = true;
    }

    /// The waiters still there: how many permits to ask for, or nobody.
    pub(super) fn next(&self) -> Next {
        let mut q = self.state.queue();
        q.waiters.retain(|w| !w.tx.is_closed());
        if q.waiters.is_empty() {
            return Next::Done;
        }
        Next::Ask(
            q.waiters
                .len()
                .min(self.state.permits as usize)
                .min(MAX_BATCH),
        )
    }

    /// Ends the task if nobody waits (removing the key's state); `false` if
    /// someone arrived meanwhile.
    pub(super) fn try_finish(&mut self) -> bool {
        let mut keys = self.semaphores.lock();
        let mut q = self.state.queue();
        if !q.waiters.is_empty() {
            return false;
        }
        q.driving = false;
        drop(q);
        if keys
            .get(&self.state.key)
            .is_some_and(|s| Arc::ptr_eq(s, &self.state))
        {
            keys.remove(&self.state.key);
        }
        self.finished = true;
        true
    }

    pub(super) async fn drive(&mut self) {
        let semaphores = Arc::clone(&self.semaphores);
        let queue: Arc<dyn PermitPool> = Arc::clone(&semaphores) as Arc<dyn PermitPool>;
        let state = Arc::clone(&self.state);
        let key = &state.key;
        let Some(backend) = semaphores.engine.backend.semaphore() else {
            self.fail_all(&Error::Unsupported {
                key: key.clone(),
                what: "semaphores",
            });
            self.try_finish();
            return;
        };
        let ttl = semaphores.engine.config.lease_ttl;
        let mut pacer = Pacer::new(
            semaphores.engine.backend.signals(),
            LockKind::Semaphore,
            key,
            false,
        );
        let mut queued = false;
        loop {
            let k = match self.next() {
                Next::Ask(k) => k,
                Next::Done => {
                    if queued {
                        queued = false;
                        if let Err(e) = backend.leave_permits(key).await {
                            tracing::debug!(%key, error = %e, "leaving the waiting set failed");
                        }
                        continue;
                    }
                    if self.try_finish() {
                        return;
                    }
                    continue;
                }
            };
            let tokens: Vec<LeaseToken> = (0..k)
                .map(|_| semaphores.engine.backend.new_token())
                .collect();
            // Local waiters queued so far arrived before this request was sent.
            let fair_bound = state.queue().next_id;
            let mut pending = pending(&semaphores, key, tokens.clone());
            let sent_at = pacer.sending();
            semaphores.engine.stats.acquire_attempt();
            queued = true;
            let reply = backend
                .acquire_permits(key, state.permits, &tokens, ttl, WhenBusy::Queue)
                .await;
            let retry_in = match reply {
                Ok(granted) => {
                    pending.disarm();
                    pacer.answered();
                    let local = u32::try_from(k).unwrap_or(u32::MAX);
                    for token in &tokens[..granted.granted.min(k)] {
                        let permit = Permit::granted(&queue, key, *token, sent_at, granted.waiting);
                        if let Some(mut permit) = permit {
                            permit.lease.found_waiting.store(local, Ordering::Relaxed);
                            permit.fair_bound = fair_bound;
                            self.hand_out(permit);
                        }
                    }
                    if granted.granted >= k {
                        // Given everything: out of the waiting set.
                        queued = false;
                        continue;
                    }
                    granted.retry_in
                }
                Err(e) => match Failure::of(&e) {
                    Failure::Retry => {
                        // The tokens are released in the background (they may have
                        // been granted); the waiters' own deadlines bound this.
                        drop(pending);
                        tracing::debug!(%key, error = %e, "permit request failed; retrying");
                        pacer.backoff()
                    }
                    failure => {
                        if !failure.may_have_written() {
                            pending.disarm();
                        }
                        drop(pending);
                        self.fail_all(&e);
                        continue;
                    }
                },
            };
            // Wait for a wake-up, the retry delay, or the last waiter leaving.
            if !pacer.watch() {
                continue;
            }
            let retry_at = Instant::now() + retry_in;
            loop {
                tokio::select! {
                    _ = pacer.woken_or(retry_at) => break,
                    _ = state.left.notified() => {
                        if state.queue().waiters.is_empty() {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Gives `permit` to the first local waiter still there; with none, it is
    /// released (dropped) in the background.
    pub(super) fn hand_out(&self, mut permit: Permit) {
        loop {
            let waiter = self.state.queue().waiters.pop_front();
            let Some(waiter) = waiter else {
                drop(permit);
                return;
            };
            match waiter.tx.send(Ok(permit)) {
                Ok(()) => return,
                Err(Ok(back)) => permit = back,
                Err(Err(_)) => return,
            }
        }
    }

    /// Answers every current waiter with `e`.
    pub(super) fn fail_all(&self, e: &Error) {
        let waiters: Vec<Waiter> = self.state.queue().waiters.drain(..).collect();
        for w in waiters {
            let _ = w.tx.send(Err(e.clone()));
        }
    }
}
