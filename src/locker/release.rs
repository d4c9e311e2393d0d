//! The end of a hold: local handoff within the budget, or the backend release
//! (in the background when the guard is dropped).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;
use tracing::Instrument;

use super::{LockGuard, LockerState};
use crate::backend::LockBackend;
use crate::engine::deadline_after;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::lease::release::{self, Attempts};
use crate::slot::{Abandon, Forward, Grant, Inheritance, Release, Slot};

impl LockerState {
    /// Ends a holder's use of `lease` (as handoff number `seq`): hands it to the next
    /// local waiter when allowed, or returns the backend release to run.
    pub(crate) fn finish(
        &self,
        slot: Option<Arc<Slot>>,
        lease: Arc<Lease>,
        seq: u64,
    ) -> Option<ReleaseJob> {
        if let Some(slot) = &slot {
            let handoff = self.may_hand_off(&lease);
            // Fair: only to a waiter that arrived before every other instance's
            // waiter (the lease's arrival bound; none: no handoff in fair mode).
            let arrived_by = self
                .config
                .fair
                .then(|| lease.arrival_bound().unwrap_or(lease.acquired_at));
            // Caching: only a lease that keeps its key's revocations (a warm
            // key's, taken with caching on; see `lead`), while the locker is not
            // closing and the key not cooled; and it needs a runtime for its linger
            // timer (a guard may be dropped outside one).
            let cache = lease
                .revocation()
                .filter(|_| {
                    !self.closing.load(Ordering::Relaxed) && !self.warm.is_cooled(&lease.key)
                })
                .and_then(|r| Some((r, tokio::runtime::Handle::try_current().ok()?)));
            match slot.release(&lease, seq + 1, handoff, cache.is_some(), arrived_by) {
                Release::HandedOff => {
                    lease.handoffs.fetch_add(1, Ordering::Relaxed);
                    self.stats.handoff();
                    return None;
                }
                Release::Cached(caching) => {
                    // `shutdown` sets `closing` before it scans the slots, and the
                    // slot's mutex orders that scan with this caching: if `closing`
                    // is still unset here, the scan comes after and finds the lease;
                    // if it is set, the scan may have missed it, so the lease is
                    // taken back at once (unless the scan took it) and released as
                    // if it had not been cached.
                    if self.closing.load(Ordering::SeqCst) {
                        let (lease, _) = slot.expire(caching)?;
                        return Some(ReleaseJob::new(self.arc(), Some(Arc::clone(slot)), lease));
                    }
                    let (revocation, runtime) = cache.expect("cached only when asked to");
                    let (shared, slot) = (self.arc(), Arc::clone(slot));
                    // Where another instance is known to wait (it revoked the lease
                    // while it was in use, or the backend said so), only until the
                    // releasing task yields: long enough for a task of this process
                    // that locks again at once, not for one that comes later.
                    let contended =
                        revocation.is_revoked() || lease.waiting.load(Ordering::Relaxed) > 0;
                    // No longer than the lease may be handed on: past its budget
                    // (or near its hold limit) nobody can take it, and without a
                    // revocation (Redlock, memory) a long linger would keep it from
                    // other instances for nothing.
                    let until = deadline_after(Instant::now(), self.config.handoff.linger)
                        .min(self.hand_off_ends(&lease));
                    // Watched since the lease was requested: another instance that
                    // queues from now on ends the caching at once (a revocation).
                    let mut revocation = revocation.clone();
                    runtime.spawn(async move {
                        let revoked = if contended {
                            // Another instance waits: keep the lease only until the
                            // releasing task yields (this task, just spawned, runs
                            // then), for a task that locks again at once, as a
                            // process with one busy task does.
                            false
                        } else {
                            tokio::select! {
                                _ = tokio::time::sleep_until(until) => false,
                                _ = revocation.revoked() => {
                                    tracing::debug!(key = %slot.key(), "cached lease revoked");
                                    true
                                }
                            }
                        };
                        drop(revocation);
                        // Counted before the lease leaves the cache, so that a
                        // `shutdown` that finds it gone waits for its release (and
                        // not before: a wait for this task would wait out the linger).
                        let _under_way = shared.background.under_way();
                        if let Some((lease, _)) = slot.expire(caching) {
                            if revoked || contended {
                                // Kept for nothing while another instance wanted it.
                                shared.warm.cool(slot.key());
                            }
                            let job = ReleaseJob::new(shared, Some(slot), lease);
                            if let Err(e) = job.run().await {
                                tracing::debug!(error = %e, "releasing a cached lease failed");
                            }
                        }
                    });
                    return None;
                }
                Release::Backend => {}
            }
        }
        Some(ReleaseJob::new(self.arc(), slot, lease))
    }
}

impl LockerState {
    /// A task that joined `slot` found its lease cached (as handoff number `seq`):
    /// the guard, if the lease may still be handed on; otherwise the lease is
    /// released at the backend (awaited until the caller's `deadline`, then, as
    /// when this future is dropped, finished in the background) and `None` tells
    /// the caller to join again.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when `deadline` passes during that release (the call
    /// started at `start`).
    pub(super) async fn take_cached(
        &self,
        slot: Arc<Slot>,
        lease: Arc<Lease>,
        seq: u64,
        start: Instant,
        deadline: Instant,
    ) -> Result<Option<LockGuard>> {
        if self.may_hand_off(&lease) {
            lease.handoffs.fetch_add(1, Ordering::Relaxed);
            self.stats.handoff();
            return Ok(Some(LockGuard::new(self.arc(), Some(slot), lease, seq)));
        }
        // Spent, lost or too short-lived to hand on: release it at the backend.
        let key = lease.key.clone();
        let release = slot.release(&lease, seq, false, false, None);
        debug_assert_eq!(release, Release::Backend);
        let job = ReleaseJob::new(self.arc(), Some(slot), lease);
        match tokio::time::timeout_at(deadline, job.run()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "releasing a spent cached lease failed"),
            Err(_) => return Err(self.timed_out(&key, start)),
        }
        Ok(None)
    }
}

impl LockerState {
    /// Stops caching, releases every cached lease at the backend, side by side,
    /// and waits for the lease work already under way in the background, of
    /// every kind ([`BackgroundWork`](crate::engine::BackgroundWork)).
    pub(super) async fn release_cached(&self) {
        self.release_cached_leases().await;
        self.background.idle().await;
    }

    /// Stops caching and releases every cached lease at the backend, side by
    /// side; the first half of [`release_cached`](Self::release_cached).
    async fn release_cached_leases(&self) {
        // Before the scan: a lease cached after it sees `closing` (see `finish`).
        self.closing.store(true, Ordering::SeqCst);
        let slots: Vec<Arc<Slot>> = self.slots.iter().map(|e| Arc::clone(e.value())).collect();
        let jobs = slots.into_iter().filter_map(|slot| {
            let (lease, _) = slot.uncache()?;
            Some(ReleaseJob::new(self.arc(), Some(slot), lease))
        });
        for outcome in futures::future::join_all(jobs.map(ReleaseJob::run)).await {
            if let Err(e) = outcome {
                tracing::debug!(error = %e, "releasing a cached lease at shutdown failed");
            }
        }
    }
}

/// How long dropping the last [`Locker`](super::Locker) waits for its cached
/// leases' release and the background lease work under way.
const EXIT_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl LockerState {
    /// The last `Locker` is dropped: stop caching, release the cached leases, and
    /// let the background lease work under way, of every kind, end. The dropping
    /// thread waits for that, at most [`EXIT_RELEASE_WAIT`], so a `main` that
    /// returns right after leaves nothing locked, on either runtime flavor.
    ///
    /// * On a multi-thread runtime, a task on it runs the releases and waits for
    ///   the background work, and the drop waits for the task in `block_in_place`
    ///   on a `std` channel: no Tokio timer and no polling on the dropping thread,
    ///   so a runtime that is shutting down (which drops the task unrun) ends the
    ///   wait at once.
    /// * On a current-thread runtime, or with no runtime, no task of the locker's
    ///   runtime can run while the drop waits (the one thread is the dropping
    ///   one, and `main` returning drops every task unrun right after): the cached
    ///   leases are released on a thread of their own with its own runtime and
    ///   connections (`backend::detached`). Background work under way there (a
    ///   dropped guard's release) is left to its runtime, as before: it runs if
    ///   the runtime goes on, else the lease expires at its TTL.
    ///
    /// With nothing cached and no release under way, nothing is started or
    /// waited for.
    pub(super) fn release_cached_at_exit(self: &Arc<Self>) {
        self.closing.store(true, Ordering::SeqCst);
        let under_way = !self.background.is_idle();
        let cached = self.slots.iter().any(|e| e.value().is_cached());
        if !under_way && !cached {
            return;
        }
        let runtime = tokio::runtime::Handle::try_current().ok();
        let multi_thread = runtime
            .as_ref()
            .is_some_and(|r| r.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if cached && !multi_thread {
            let shared = Arc::clone(self);
            let released = crate::backend::detached::run(
                async move { shared.release_cached_leases().await },
                EXIT_RELEASE_WAIT,
            );
            if !released {
                tracing::debug!("the cached leases were not released in time at the last drop");
            }
        }
        let Some(runtime) = runtime else {
            return;
        };
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let shared = Arc::clone(self);
        runtime.spawn(async move {
            let _done = done; // dropped when the releases end, or with the task
            let _ = tokio::time::timeout(EXIT_RELEASE_WAIT, shared.release_cached()).await;
        });
        if multi_thread {
            let _ = tokio::task::block_in_place(|| finished.recv_timeout(EXIT_RELEASE_WAIT));
        }
    }
}

impl Forward for LockerState {
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
                if let Some(job) = self.finish(Some(Arc::clone(slot)), lease, seq.saturating_sub(1))
                {
                    job.spawn();
                }
            }
        }
    }
}

/// A backend release still to be done; it completes even if its caller goes away.
pub(crate) struct ReleaseJob {
    shared: Arc<LockerState>,
    slot: Option<Arc<Slot>>,
    lease: Arc<Lease>,
    attempts: Attempts,
}

/// Re-runs a release from scratch in the background if the future running it is
/// dropped half-way (release is idempotent per token).
pub(super) struct Rearm(Option<ReleaseJob>);

impl Drop for Rearm {
    fn drop(&mut self) {
        if let Some(job) = self.0.take() {
            job.spawn();
        }
    }
}

/// A release handed to a background task. If the task is dropped before it runs
/// (its runtime is shutting down), the local state is settled anyway: the lease
/// stops being renewed and expires at its TTL, and the slot lets its next waiter
/// lead (or goes idle) instead of staying in `Releasing` forever.
pub(super) struct Background(Option<ReleaseJob>);

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(job) = self.0.take() {
            job.settle_locally();
        }
    }
}

impl ReleaseJob {
    /// The backend release of `lease`, held by `slot` (none without coalescing),
    /// from its first attempt.
    fn new(shared: Arc<LockerState>, slot: Option<Arc<Slot>>, lease: Arc<Lease>) -> ReleaseJob {
        // The key's next lease, if taken soon, may be cached.
        shared.warm.released(&lease.key);
        ReleaseJob {
            shared,
            slot,
            lease,
            attempts: Attempts::default(),
        }
    }

    /// Releases at the backend (on the shared schedule, [`Attempts`]), then lets the
    /// next local waiter lead. If this future is dropped before it finishes, the
    /// release is re-run in the background, continuing the same schedule.
    pub(crate) async fn run(self) -> Result<()> {
        let span = tracing::debug_span!("lockflight.release", key = %self.lease.key);
        self.run_inner().instrument(span).await
    }

    pub(super) async fn run_inner(self) -> Result<()> {
        let mut rearm = Rearm(Some(self));
        let job = rearm.0.as_mut().expect("armed");
        let (shared, lease) = (Arc::clone(&job.shared), Arc::clone(&job.lease));
        shared.renewals.forget(&lease);
        crate::lease::histograms::renewals(lease.kind, lease.renewed.load(Ordering::Relaxed));
        // Fair: a local waiter keeps this instance's place in the backend's queue
        // (its arrival time), so the release wakes whoever arrived first.
        let requeue = match &job.slot {
            Some(slot) if shared.config.fair => slot.oldest_waiter(),
            _ => None,
        };
        let backend = &shared.backend;
        let result = job
            .attempts
            .send(&shared.stats, || async {
                let reply = match requeue {
                    None => backend.release(&lease.key, lease.token).await,
                    Some(at) => {
                        let age = Instant::now().saturating_duration_since(at);
                        backend.release_fair(&lease.key, lease.token, age).await
                    }
                };
                reply.map(|r| r.released)
            })
            .await;
        let job = rearm.0.take().expect("armed");
        // A release that failed may still hold the lock at the backend, and a copy
        // of it may still be on the wire. Its token is retired: it is released once
        // more in the background and never acquired again (a re-grant to the next
        // local leader could be deleted by that late copy while the leader believes
        // it holds the lock); the next leader takes a fresh token, and the release's
        // wake-up (it is queued if the lock was still held) lets it in.
        // A requeued instance is (maybe) in the backend's queue: whoever inherits the
        // lead leaves it if nobody wants the lock any more.
        if let Err(e) = &result
            && (e.is_indeterminate() || matches!(e, Error::Refused { .. }))
        {
            job.shared.cleanup(
                &lease.key,
                Inheritance {
                    token: Some(lease.token),
                    queued: false,
                },
            );
        }
        job.settle(Inheritance {
            token: None,
            queued: requeue.is_some(),
        });
        release::outcome(&lease, result?)
    }

    /// Lets the next local waiter lead, inheriting `lead`; with nobody waiting, the
    /// slot goes idle and `lead`'s token (if any) is released in the background.
    pub(super) fn settle(self, lead: Inheritance) {
        let Some(slot) = &self.slot else {
            self.shared.cleanup(&self.lease.key, lead);
            return;
        };
        if let Some(lead) = slot.released(&self.shared.slots, lead) {
            self.shared.cleanup(&self.lease.key, lead);
        }
    }

    /// Settles the local state without a backend release: the lease expires at its
    /// TTL.
    pub(super) fn settle_locally(self) {
        self.shared.renewals.forget(&self.lease);
        crate::lease::histograms::renewals(
            self.lease.kind,
            self.lease.renewed.load(Ordering::Relaxed),
        );
        if let Some(slot) = &self.slot {
            let _ = slot.released(&self.shared.slots, Inheritance::default());
        }
    }

    /// Runs in the background. Without a Tokio runtime (a guard dropped outside
    /// one), or if the runtime shuts down before the task runs, the backend release
    /// is skipped — the lease expires at its TTL — and the next local waiter is
    /// promoted at once.
    pub(crate) fn spawn(self) {
        let shared = Arc::clone(&self.shared);
        // Dropped unrun (no runtime here, or it shuts down first), it settles
        // the local state.
        let mut pending = Background(Some(self));
        shared.spawn_background(async move {
            let job = pending.0.take().expect("set above");
            if let Err(e) = job.run().await {
                tracing::debug!(error = %e, "background release failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::{Handoff, Locker, MemoryBackend};

    /// With a long linger and no revocation (the memory backend sends none, as
    /// Redlock), a cached lease is released once it can no longer be handed on,
    /// not when the linger ends: here at the end of its hold budget (`max_hold`).
    #[tokio::test(start_paused = true)]
    async fn an_idle_cached_lease_is_released_at_the_end_of_its_budget() {
        let backend = MemoryBackend::new();
        let a = Locker::builder(backend.clone())
            .handoff(Handoff::enabled().linger(Duration::from_secs(600)))
            .build()
            .unwrap();
        let b = Locker::builder(backend).build().unwrap();
        a.lock("k").await.unwrap().release().await.unwrap();
        a.lock("k").await.unwrap().release().await.unwrap();
        assert_eq!(a.active_keys(), 1, "the warm key's lease is not cached");
        tokio::time::sleep(Handoff::DEFAULT_MAX_HOLD - Duration::from_millis(1)).await;
        assert_eq!(a.active_keys(), 1, "released before its budget ended");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(a.active_keys(), 0, "kept past its budget");
        assert!(b.try_lock("k").await.unwrap().is_some());
    }

    /// As above, with a hold limit and a budget that outlasts it: the cached lease
    /// is released `min_validity` (a third of the TTL) before the limit, when it
    /// can no longer be handed on.
    #[tokio::test(start_paused = true)]
    async fn an_idle_cached_lease_is_released_before_its_hold_limit() {
        let backend = MemoryBackend::new();
        let a = Locker::builder(backend.clone())
            .lease_ttl(Duration::from_secs(3))
            .hold_limit(Duration::from_secs(5))
            .handoff(
                Handoff::enabled()
                    .max_hold(Duration::from_secs(600))
                    .linger(Duration::from_secs(600)),
            )
            .build()
            .unwrap();
        let b = Locker::builder(backend).build().unwrap();
        a.lock("k").await.unwrap().release().await.unwrap();
        a.lock("k").await.unwrap().release().await.unwrap();
        assert_eq!(a.active_keys(), 1, "the warm key's lease is not cached");
        tokio::time::sleep(Duration::from_millis(3_999)).await;
        assert_eq!(a.active_keys(), 1, "released while it could be handed on");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(a.active_keys(), 0, "kept past the hold limit's margin");
        assert!(b.try_lock("k").await.unwrap().is_some());
    }

    /// Busy for about `n` spins: shifts one side of a race against the other.
    fn spin(n: u32) {
        for _ in 0..n {
            std::hint::spin_loop();
        }
    }

    /// A guard dropped on one thread while another runs `shutdown`, started
    /// together and shifted against each other round by round: whatever the
    /// interleaving, once both have returned and the background work they left
    /// is done, no lease is cached (a 1 h linger) and the slot map is empty.
    #[test]
    fn a_release_racing_shutdown_leaves_nothing_cached() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for round in 0..4_000u32 {
            let locker = Locker::builder(MemoryBackend::new())
                .handoff(Handoff::enabled().linger(Duration::from_secs(3600)))
                .build()
                .unwrap();
            let guard = rt.block_on(async {
                // Released at the backend once: the key is warm, its next lease cached.
                locker.lock("k").await.unwrap().release().await.unwrap();
                locker.lock("k").await.unwrap()
            });
            let go = AtomicBool::new(false);
            let (go, rt, closer) = (&go, &rt, &locker);
            std::thread::scope(|s| {
                s.spawn(move || {
                    let _runtime = rt.enter();
                    while !go.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    spin(round % 97);
                    drop(guard);
                });
                s.spawn(move || {
                    while !go.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    spin(round % 89);
                    rt.block_on(closer.shutdown());
                });
                go.store(true, Ordering::Release);
            });
            rt.block_on(locker.shared().background.idle());
            assert_eq!(
                locker.active_keys(),
                0,
                "round {round}: a lease stayed cached after shutdown returned"
            );
        }
    }
}
