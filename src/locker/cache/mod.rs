//! Lease caching ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)),
//! in one place: which acquires watch their key's revocations (a warm key's,
//! `warm.rs`), which releases keep their lease in the slot ([`caching`]), the
//! task that ends a caching (its linger, or another instance's revocation), a task
//! taking a cached lease, and the releases of every cached lease at
//! [`shutdown`](crate::Locker::shutdown) and at the last `Locker`'s drop. The slot
//! holds the cached lease and orders these steps (`Slot::release`, `Slot::linger`,
//! `Slot::expire`, `Slot::uncache`); ARCHITECTURE.md ("Lease caching") says why
//! a cached lease keeps every guarantee.
//!
//! [`caching`]: LockerState::caching

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::time::Instant;

use super::{LockGuard, LockerState};
use crate::backend::Revocation;
use crate::error::Result;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::lease::engine::deadline_after;
use crate::lease::release::{End, Release as BackendRelease};
use crate::slot::{Caching, Linger, ReleaseStep, Slot};

pub(super) mod warm;

use super::release::SlotEnd;

impl LockerState {
    /// The revocations of `key` for an acquire that started at `start`, when the
    /// lease it gets may be cached: watched from before the request on and kept
    /// by the lease (another instance that queues while a local task uses the
    /// lease makes its release cache only for a moment). Never in fair mode, and
    /// only for a warm key.
    pub(super) fn revocations_to_cache(&self, key: &LockKey, start: Instant) -> Option<Revocation> {
        let linger = self.engine.config.lease_cache;
        (!self.engine.config.fair && !linger.is_zero() && self.warm.is_warm(key, start, linger))
            .then(|| self.engine.backend.signals().watch_revocation(key))
    }

    /// How the release of `lease` at `now` may cache it, if at all.
    pub(super) fn caching(&self, lease: &Lease, now: Instant) -> Option<Caching> {
        // Only a lease that keeps its key's revocations (a warm key's, taken
        // with caching on: `revocations_to_cache`), while the locker is not
        // closing and the key not cooled; and it needs a runtime for its linger
        // timer (a guard may be dropped outside one).
        let cache = lease
            .revocation()
            .filter(|_| !self.closing.load(Ordering::Relaxed) && !self.warm.is_cooled(&lease.key))
            .filter(|_| crate::runtime::available());
        // Where another instance is known to wait (it revoked the lease while
        // it was in use, or the backend said so), only until the releasing
        // task yields: long enough for a task of this process that locks again
        // at once, not for one that comes later.
        let contended =
            cache.is_some_and(|r| r.is_revoked()) || lease.waiting.load(Ordering::Relaxed) > 0;
        cache.map(|_| {
            Caching {
                // No longer than the lease may be handed on: past its budget (or
                // near its hold limit) nobody can take it, and without a
                // revocation (Redlock, memory) a long linger would keep it from
                // other instances for nothing.
                until: if contended {
                    now
                } else {
                    deadline_after(now, self.engine.config.lease_cache)
                        .min(self.engine.hand_off_ends(lease))
                },
                linger: !contended,
            }
        })
    }

    /// The slot kept `lease` (its caching number `caching`, as `keep` asked):
    /// starts what ends the caching, a linger task (`start`: none runs for the
    /// lease yet) or, where another instance waits, a release as soon as the
    /// releasing task yields; or, when `shutdown` may have missed it, takes it
    /// back at once.
    pub(super) fn cached(
        &self,
        slot: &Arc<Slot>,
        lease: &Arc<Lease>,
        caching: u64,
        start: bool,
        keep: Caching,
    ) -> End<SlotEnd> {
        // `shutdown` sets `closing` before it scans the slots, and the
        // slot's mutex orders that scan with this caching: if `closing`
        // is still unset here, the scan comes after and finds the lease;
        // if it is set, the scan may have missed it, so the lease is
        // taken back at once (unless the scan took it) and released as
        // if it had not been cached.
        if self.closing.load(Ordering::SeqCst) {
            return match slot.expire(caching) {
                Some((lease, _)) => End::Release(self.release_job(Some(Arc::clone(slot)), lease)),
                None => End::Kept,
            };
        }
        let (shared, slot) = (self.arc(), Arc::clone(slot));
        if !keep.linger {
            // Kept only until the releasing task yields (this task, just
            // spawned, runs then), for a task that locks again at once,
            // as a process with one busy task does.
            crate::runtime::spawn(async move {
                // Counted before the lease leaves the cache, so that a
                // `shutdown` that finds it gone waits for its release.
                let _under_way = shared.engine.background.under_way();
                if let Some((lease, _)) = slot.expire(caching) {
                    // Kept for nothing while another instance wanted it.
                    shared.warm.cool(slot.key());
                    shared.release_expired(slot, lease).await;
                }
            });
        } else if start {
            // Watched since the lease was requested: another instance
            // that queues from now on ends the caching at once.
            let revocation = lease
                .revocation()
                .expect("cached only when watched")
                .clone();
            let lease = Arc::downgrade(lease);
            let until = keep.until;
            crate::runtime::spawn(shared.linger(slot, lease, revocation, until));
        }
        End::Kept
    }

    /// The linger task of `lease`, cached in `slot` until `until` (moved on by
    /// later cachings): releases it at the backend once a linger ends with the
    /// lease still cached, or at once when another instance revokes it; ends
    /// when the lease is in use, so that the next caching starts a new one. One
    /// task serves every caching of a lease within its lingers, not one per
    /// release.
    async fn linger(
        self: Arc<Self>,
        slot: Arc<Slot>,
        lease: Weak<Lease>,
        mut revocation: Revocation,
        mut until: Instant,
    ) {
        let mut guard = LingerGuard {
            slot: Arc::clone(&slot),
            lease: lease.clone(),
            armed: true,
        };
        let (taken, revoked, under_way) = loop {
            let revoked = tokio::select! {
                _ = tokio::time::sleep_until(until) => false,
                _ = revocation.revoked() => true,
            };
            // Counted before the lease leaves the cache, so that a `shutdown` that
            // finds it gone waits for its release (and not before: a wait for this
            // task would wait out the linger).
            let under_way = self.engine.background.under_way();
            match slot.linger(&lease, Instant::now(), revoked) {
                Linger::Until(next) => until = next,
                Linger::Done => {
                    guard.armed = false;
                    return;
                }
                Linger::Expired(taken) => break (taken, revoked, under_way),
            }
        };
        guard.armed = false;
        drop(revocation);
        if revoked {
            tracing::debug!(key = %slot.key(), "cached lease revoked");
            // Kept for nothing while another instance wanted it.
            self.warm.cool(slot.key());
        }
        self.release_expired(slot, taken).await;
        drop(under_way);
    }

    /// Releases at the backend a lease a linger timer took back from `slot`.
    async fn release_expired(&self, slot: Arc<Slot>, lease: Arc<Lease>) {
        let job = self.release_job(Some(slot), lease);
        if let Err(e) = job.run().await {
            tracing::debug!(error = %e, "releasing a cached lease failed");
        }
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
    /// [`Error::Timeout`](crate::Error::Timeout) when `deadline` passes during that release (the call
    /// started at `start`).
    pub(super) async fn take_cached(
        &self,
        slot: Arc<Slot>,
        lease: Arc<Lease>,
        seq: u64,
        start: Instant,
        deadline: Instant,
    ) -> Result<Option<LockGuard>> {
        if self.engine.may_hand_off(&lease) {
            lease.handoffs.fetch_add(1, Ordering::Relaxed);
            self.engine.stats.handoff();
            return Ok(Some(LockGuard::new(self.arc(), Some(slot), lease, seq)));
        }
        // Spent, lost or too short-lived to hand on: release it at the backend.
        // Boxed, so that the rare backend path does not size the caller's future.
        Box::pin(async move {
            let key = lease.key.clone();
            let release = slot.release(&lease, seq, false, None, None);
            debug_assert_eq!(release, ReleaseStep::Backend);
            let job = self.release_job(Some(slot), lease);
            match tokio::time::timeout_at(deadline, job.run()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "releasing a spent cached lease failed"),
                Err(_) => return Err(self.timed_out(&key, start)),
            }
            Ok(None)
        })
        .await
    }
}

impl LockerState {
    /// Stops caching, releases every cached lease at the backend, side by side,
    /// and waits for the lease work already under way in the background, of
    /// every kind ([`BackgroundWork`](crate::lease::engine::BackgroundWork)).
    pub(super) async fn release_cached(&self) {
        self.release_cached_leases().await;
        self.engine.background.idle().await;
    }

    /// Stops caching and releases every cached lease at the backend, side by
    /// side; the first half of [`release_cached`](Self::release_cached).
    async fn release_cached_leases(&self) {
        // Before the scan: a lease cached after it sees `closing` (see `finish`).
        self.closing.store(true, Ordering::SeqCst);
        let slots: Vec<Arc<Slot>> = self.slots.iter().map(|e| Arc::clone(e.value())).collect();
        let jobs = slots.into_iter().filter_map(|slot| {
            let (lease, _) = slot.uncache()?;
            Some(self.release_job(Some(slot), lease))
        });
        for outcome in futures::future::join_all(jobs.map(BackendRelease::run)).await {
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
    ///   dropped guard's release) is left to its runtime: it runs if the runtime
    ///   goes on, else the lease expires at its TTL.
    ///
    /// With nothing cached and no release under way, nothing is started or
    /// waited for.
    pub(super) fn release_cached_at_exit(self: &Arc<Self>) {
        self.closing.store(true, Ordering::SeqCst);
        let under_way = !self.engine.background.is_idle();
        // The slots are cloned out of the map first: a slot's mutex is never taken
        // under a shard lock of the map (the lock order is slot, then shard; a
        // release that empties a slot holds its mutex while it removes it).
        let slots: Vec<Arc<Slot>> = self.slots.iter().map(|e| Arc::clone(e.value())).collect();
        let cached = slots.iter().any(|slot| slot.is_cached());
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
        if runtime.is_none() {
            return;
        }
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let shared = Arc::clone(self);
        crate::runtime::spawn(async move {
            let _done = done; // dropped when the releases end, or with the task
            let _ = tokio::time::timeout(EXIT_RELEASE_WAIT, shared.release_cached()).await;
        });
        if multi_thread {
            let _ = tokio::task::block_in_place(|| finished.recv_timeout(EXIT_RELEASE_WAIT));
        }
    }
}

/// Clears a linger task's record in its slot if the task's future is dropped
/// before it ends by itself (a runtime shutting down).
struct LingerGuard {
    slot: Arc<Slot>,
    lease: Weak<Lease>,
    armed: bool,
}

impl Drop for LingerGuard {
    fn drop(&mut self) {
        if self.armed {
            self.slot.linger_dropped(&self.lease);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::backend::MemoryBackend;
    use crate::locker::Locker;
    use crate::settings::Handoff;

    /// With a long linger and no revocation (the memory backend sends none, as
    /// Redlock), a cached lease is released once it can no longer be handed on,
    /// not when the linger ends: here at the end of its hold budget (`max_hold`).
    #[tokio::test(start_paused = true)]
    async fn an_idle_cached_lease_is_released_at_the_end_of_its_budget() {
        let backend = MemoryBackend::new();
        let a = Locker::builder(backend.clone())
            .cache_leases_for(Duration::from_secs(600))
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
            .handoff(Handoff::enabled().max_hold(Duration::from_secs(600)))
            .cache_leases_for(Duration::from_secs(600))
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
                .cache_leases_for(Duration::from_secs(3600))
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
            rt.block_on(locker.shared().engine.background.idle());
            assert_eq!(
                locker.active_keys(),
                0,
                "round {round}: a lease stayed cached after shutdown returned"
            );
        }
    }
}
