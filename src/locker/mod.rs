//! [`Locker`]: the user's handle to every lock kind.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{LockBackend, WhenBusy};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::LockInfo;
use crate::lease::acquire::Call;
use crate::lease::engine::Engine;
use crate::rw::RwLocks;
use crate::semaphore::Semaphores;
use crate::singleflight::Flights;
use crate::slot::{Forward, Grant, Inheritance, Join, Slot, SlotMap};
use crate::stats::Stats;

mod acquire;
mod builder;
mod cache;
mod env;
mod family;
mod guard;
mod health;
mod release;
mod rwlock;

pub use crate::settings::{Contention, Handoff, LockOptions, LossPolicy};
use crate::settings::{Settings, validate_ttl};
pub use builder::LockerBuilder;
pub use guard::LockGuard;
pub use rwlock::RwLock;

/// The handle a service uses to take distributed locks.
///
/// Cheap to clone; clones share everything. Build **one per process** per backend:
/// coalescing works among the tasks that share a `Locker`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use std::time::Duration;
/// use lockflight::{Handoff, Locker, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new())
///     .lease_ttl(Duration::from_secs(30))
///     .wait_timeout(Duration::from_secs(5))
///     .handoff(Handoff::enabled().max_consecutive(64))
///     .build()?;
///
/// let guard = locker.lock("sku:555").await?;
/// let token = guard.fencing_token(); // hand it to the resource with every write
/// guard.release().await?;
///
/// let stock = locker
///     .with_lock("sku:555", |info| async move { info.fencing_token > token })
///     .await?;
/// assert!(stock);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    shared: Arc<LockerState>,
    /// Shared by the clones: the last one dropped releases the cached leases.
    _last: Arc<LastHandle>,
}

/// Dropped with the last clone of a [`Locker`]: stops lease caching and releases
/// the leases still cached ([`LockerState::release_cached_at_exit`]).
struct LastHandle(Arc<LockerState>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        self.0.release_cached_at_exit();
    }
}

impl Locker {
    pub(crate) fn from_state(shared: Arc<LockerState>) -> Locker {
        Locker {
            _last: Arc::new(LastHandle(Arc::clone(&shared))),
            shared,
        }
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.shared.engine.backend)
            .field("config", &self.shared.engine.config)
            .field("active_keys", &self.shared.slots.len())
            .finish()
    }
}

/// A locker's state: the [`Engine`] every lock kind runs on, and each kind's
/// local per-key state (the engine is a field, `shared.engine.backend`, not a
/// deref: a kind's state and the engine stay two things).
pub(crate) struct LockerState {
    me: Weak<LockerState>,
    pub(crate) engine: Arc<Engine>,
    /// The exclusive locks' slots.
    pub(crate) slots: SlotMap,
    /// The shared computations of [`Locker::singleflight`].
    pub(crate) flights: Flights,
    /// The read-write locks' local state.
    pub(crate) rw: Arc<RwLocks>,
    /// The semaphores' local state.
    pub(crate) semaphores: Arc<Semaphores>,
    /// Set by [`Locker::shutdown`] and by dropping the last `Locker`: no lease is
    /// cached any more.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// The keys whose leases may be cached ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)).
    pub(crate) warm: cache::warm::WarmKeys,
    /// The backend's health as the edge and the probe saw it.
    pub(crate) health: health::Health,
}

impl LockerState {
    fn new(engine: Engine) -> Arc<LockerState> {
        let engine = Arc::new(engine);
        Arc::new_cyclic(|me| LockerState {
            me: me.clone(),
            slots: SlotMap::default(),
            closing: Default::default(),
            warm: Default::default(),
            flights: Flights::default(),
            rw: Arc::new(RwLocks::new(Arc::clone(&engine))),
            semaphores: Arc::new(Semaphores::new(Arc::clone(&engine))),
            health: health::Health::default(),
            engine,
        })
    }
}

impl Locker {
    /// Starts configuring a locker over `backend`.
    pub fn builder(backend: impl LockBackend) -> LockerBuilder {
        LockerBuilder {
            backend: Arc::new(backend),
            settings: Settings::default(),
        }
    }

    /// Takes the lock of `key`, waiting up to the configured wait timeout.
    ///
    /// Within this process at most one task per key talks to the backend; the others
    /// wait in a local FIFO and are granted either leadership or (with handoff) the
    /// lease itself. Locks are not reentrant: where the held keys are known (inside
    /// [`with_lock`](Self::with_lock)'s closure, behind the lock layer) asking again for
    /// a key the running future holds fails at once; elsewhere it waits behind itself.
    /// Holding belongs to the guarded future, not to a thread or a task.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for an empty or oversized key; [`Error::Reentrant`] for a
    /// key the running future already holds (above); [`Error::Timeout`] when the wait
    /// timeout passes; [`Error::Overloaded`] when `max_waiters` tasks already wait for
    /// the key; [`Error::ForeignValue`], [`Error::NoPermission`] and [`Error::Backend`]
    /// from the backend (transient backend errors are retried until the deadline).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped waiter leaves the local queue without disturbing it; a
    /// dropped leader passes leadership and its token to the next waiter, or releases
    /// that token and leaves the backend queue in the background when nobody waits.
    pub async fn lock(&self, key: impl Into<LockKey>) -> Result<LockGuard> {
        self.lock_within(key, self.shared.engine.config.wait_timeout)
            .await
    }

    /// [`lock`](Self::lock) with an explicit wait timeout (what the lock layer and
    /// `lock_many` call).
    pub(crate) async fn lock_within(
        &self,
        key: impl Into<LockKey>,
        wait: Duration,
    ) -> Result<LockGuard> {
        let ttl = self.shared.engine.config.lease_ttl;
        let call = Call::new(wait, ttl, WhenBusy::Queue);
        self.acquire(key.into(), call).await
    }

    /// Like [`lock`](Self::lock) with per-call settings: a wait timeout, a lease
    /// TTL, or no waiting at all.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use std::time::Duration;
    /// use lockflight::{Error, LockOptions, Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let held = locker.lock("sku:555").await?;
    /// let busy = locker.lock_with_options("sku:555", LockOptions::new().try_only()).await;
    /// assert!(matches!(busy, Err(Error::Busy { .. })));
    /// drop(held);
    /// let guard = locker
    ///     .lock_with_options("sku:555", LockOptions::new().wait_timeout(Duration::from_secs(1)))
    ///     .await?;
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock); [`Error::Busy`] for a busy key with
    /// [`LockOptions::try_only`]; [`Error::InvalidConfig`] for a lease TTL that the
    /// locker cannot renew in time.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn lock_with_options(
        &self,
        key: impl Into<LockKey>,
        options: LockOptions,
    ) -> Result<LockGuard> {
        let key = key.into();
        let config = &self.shared.engine.config;
        let ttl = match options.lease_ttl {
            Some(ttl) => {
                validate_ttl(ttl, config.renew_every).map_err(|reason| {
                    Error::config(format!("lock_with_options({key}): {reason}"))
                })?;
                ttl
            }
            None => config.lease_ttl,
        };
        let wait = options.wait_timeout.unwrap_or(config.wait_timeout);
        let mode = match options.try_only {
            true => WhenBusy::Return,
            false => WhenBusy::Queue,
        };
        let call = Call {
            hold_limit: options.hold_limit,
            ..Call::new(wait, ttl, mode)
        };
        self.acquire(key, call).await
    }

    /// Takes the lock of `key` if it is free right now: one backend request, no
    /// waiting. Returns `None` when another task of this process or another instance
    /// holds it.
    ///
    /// A lease another instance keeps cached ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)) counts as held:
    /// the try then sends that instance a revocation (Redis backend), so a try a
    /// round trip later finds the key free if that instance no longer uses it.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), except that a busy lock is `Ok(None)`, not a timeout
    /// (a backend that does not answer within the wait timeout is a timeout).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a request that may have landed is released in the background.
    pub async fn try_lock(&self, key: impl Into<LockKey>) -> Result<Option<LockGuard>> {
        let config = &self.shared.engine.config;
        let (wait, ttl) = (config.wait_timeout, config.lease_ttl);
        match self
            .acquire(key.into(), Call::new(wait, ttl, WhenBusy::Return))
            .await
        {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::Busy { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every acquire of the mutex: `lock`, `lock_within`, `lock_with_options` and
    /// `try_lock` differ only in their [`Call`]. Its deadline bounds the whole call
    /// (in [`WhenBusy::Return`], the one backend request); a busy key in
    /// [`WhenBusy::Return`] is [`Error::Busy`], the one error no other path gives.
    pub(crate) async fn acquire(&self, key: LockKey, call: Call) -> Result<LockGuard> {
        key.validate()?;
        self.check_reentry(&key)?;
        let span = tracing::debug_span!("lockflight.lock", key = %key);
        let got = self.acquire_at(key, call).instrument(span).await;
        if got.is_ok() {
            crate::lease::histograms::wait(crate::lease::LeaseKind::Mutex, call.start);
        }
        got
    }

    /// The one path of an acquire: join the key's slot (a cached lease, a place in
    /// the local queue, or leadership) and, as the leader, acquire at the backend.
    async fn acquire_at(&self, key: LockKey, call: Call) -> Result<LockGuard> {
        let shared = &self.shared;
        let Call {
            start, deadline, ..
        } = call;
        let queue = call.mode == WhenBusy::Queue;
        let mut own_timer = false;
        loop {
            let (slot, lead) = if !shared.engine.config.coalescing {
                (None, Inheritance::default())
            } else {
                let fwd: Arc<dyn Forward> = shared.arc();
                let max = shared.engine.config.max_waiters;
                let joined = match call.mode {
                    WhenBusy::Queue => {
                        Slot::join(&shared.slots, &key, max, (start, deadline), &fwd)
                    }
                    WhenBusy::Return => Slot::try_join(&shared.slots, &key, start, &fwd),
                };
                match joined {
                    Join::Leader(slot) => (Some(slot), Inheritance::default()),
                    Join::Cached(slot, lease, seq) => {
                        let taken = shared.take_cached(slot, lease, seq, start, deadline);
                        match taken.await? {
                            // A call with a hold limit of its own (a scheduled
                            // job's) needs a lease that ends by it: a cached one
                            // was granted for another call. It goes back to the
                            // backend and the call acquires afresh.
                            Some(guard) if call.hold_limit.is_some() => {
                                if let Err(e) = guard.release_at_backend().await {
                                    tracing::debug!(%key, error = %e, "the release of a cached lease failed");
                                }
                                continue;
                            }
                            Some(guard) => return Ok(guard),
                            None => continue,
                        }
                    }
                    Join::Wait(_) | Join::Overloaded if !queue => {
                        return Err(Error::Busy { key });
                    }
                    Join::Overloaded => {
                        return Err(Error::Overloaded {
                            key,
                            waiters: shared.engine.config.max_waiters,
                        });
                    }
                    Join::Wait(mut place) => {
                        shared.engine.stats.local_wait();
                        // The slot's watcher keeps the deadline when it runs on
                        // this runtime: a waiter dropped ungranted timed out, or
                        // before the deadline, a watcher that ended with its
                        // runtime or could not start. Then the call queues again
                        // with a timer of its own (boxed: the rare path), which
                        // fails as a timer fails (no runtime or no time driver)
                        // instead of spinning. A waiter whose slot's watcher runs
                        // on another runtime has the timer from the start: that
                        // runtime may be alive but not driven.
                        let granted = if own_timer || place.needs_own_timer() {
                            let wait = tokio::time::timeout_at(deadline, place.granted());
                            Box::pin(wait).await.ok().flatten()
                        } else {
                            place.granted().await
                        };
                        match granted {
                            None if Instant::now() < deadline => {
                                own_timer = true;
                                continue;
                            }
                            None => {
                                shared.engine.stats.timeout();
                                return Err(Error::timeout(
                                    &key,
                                    Phase::WaitingLocally,
                                    start.elapsed(),
                                ));
                            }
                            Some(Grant::Lease(lease, seq)) => {
                                let slot = Arc::clone(place.slot());
                                let guard = LockGuard::new(shared.arc(), Some(slot), lease, seq);
                                if !guard.is_lost() {
                                    return Ok(guard);
                                }
                                // The handed-on lease ran out while this task woke up:
                                // it is not held. Let it go and compete again.
                                tracing::debug!(%key, "a handed-off lease expired before its grant");
                                drop(guard);
                                continue;
                            }
                            Some(Grant::Leadership(lead)) => (Some(Arc::clone(place.slot())), lead),
                        }
                    }
                }
            };
            // Boxed: the backend path is the rare one (a handed-on or cached lease
            // serves most calls), and its future would otherwise size (and be
            // copied with) every call's.
            return match Box::pin(shared.lead(&key, slot, lead, call)).await? {
                Some(guard) => Ok(guard),
                None if queue => Err(Error::backend(
                    &key,
                    Phase::Acquiring,
                    "busy reply to a waiting acquire",
                )),
                None => Err(Error::Busy { key }),
            };
        }
    }

    /// Releases every lease this locker keeps cached for its next local task
    /// ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)), stops caching, and waits for the lease work already
    /// under way in the background, of every lock kind (the releases of dropped
    /// guards and permits and of leases whose linger ended, the cleanups of
    /// abandoned acquires): call it before the program exits, so that no released
    /// key waits for its lease TTL. Locks taken afterwards work as before, without
    /// caching; guards still held are not affected. No lease stays cached once it
    /// has returned, not even one whose guard was released while it ran.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// locker.lock("report").await?.release().await?; // may stay cached a moment
    /// locker.shutdown().await; // now it is released
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, releases it began finish in the background and
    /// caching stays off; leases it had not reached yet are released when their
    /// linger ends.
    pub async fn shutdown(&self) {
        self.shared.release_cached().await;
    }

    /// Runs `work` while holding the lock of `key`, then releases it.
    ///
    /// `work` receives the [`LockInfo`]: key, fencing token and a
    /// [`LossSignal`](crate::guard::LossSignal). With the default [`LossPolicy::Abort`], a
    /// lease lost while `work` runs drops its future at its next `.await`; with
    /// [`LossPolicy::Signal`] the work runs on and watches `info.loss` itself.
    ///
    /// `Ok` means no loss of the lease was known when `work` finished: the release deleted
    /// the lease at the backend or handed it on in memory (see [`LockGuard::release`]).
    /// Other release problems (the backend unreachable) are logged, not returned: the
    /// lock expires at its TTL.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), plus [`Error::LeaseLost`] (and `work`'s output dropped)
    /// when the lease was lost while `work` ran, or the release found the lock no longer
    /// this lease's (it expired or was taken over): the work ran past its lease.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` and releases (or hands off) the lock in the
    /// background.
    pub async fn with_lock<F, Fut, T>(&self, key: impl Into<LockKey>, work: F) -> Result<T>
    where
        F: FnOnce(LockInfo) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock(key).await?;
        let work = crate::reentry::scope(self.id(), guard.key().clone(), work(guard.info()));
        let out = match self.shared.engine.config.on_loss {
            LossPolicy::Signal => work.await,
            LossPolicy::Abort => {
                let lost = guard.lost();
                tokio::select! {
                    biased;
                    _ = lost => return Err(guard.lost_error()),
                    out = work => out,
                }
            }
        };
        if guard.is_lost() {
            // Only reachable under `LossPolicy::Signal`: the work ran on after the
            // loss, so its outcome was not protected by the lock.
            return Err(guard.lost_error());
        }
        match guard.release().await {
            Ok(()) => Ok(out),
            Err(e @ Error::LeaseLost { .. }) => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "release after with_lock failed");
                Ok(out)
            }
        }
    }

    /// Counters since the locker was built, and the keys in use now
    /// ([`Stats::keys_in_use`]).
    pub fn stats(&self) -> Stats {
        let mut stats = self.shared.engine.stats.snapshot();
        let keys = self.active_keys() + self.active_rw_keys() + self.active_semaphores();
        stats.keys_in_use = keys as u64;
        stats
    }

    /// Number of exclusive-lock keys with local activity (a holder, a leader,
    /// waiters or a cached lease). Zero when every task is done: slots never
    /// outlive their use.
    pub(crate) fn active_keys(&self) -> usize {
        self.shared.slots.len()
    }

    /// The backend (what an election writes its leader record to).
    pub(crate) fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::clone(&self.shared.engine.backend)
    }

    /// The locker's counters.
    pub(crate) fn counters(&self) -> &crate::stats::StatsInner {
        &self.shared.engine.stats
    }

    /// The configured lease TTL.
    pub(crate) fn lease_ttl(&self) -> Duration {
        self.shared.engine.config.lease_ttl
    }

    /// The configured renewal interval.
    pub(crate) fn renew_every(&self) -> Duration {
        self.shared.engine.config.renew_every
    }

    /// The configured wait timeout.
    pub(crate) fn wait_timeout(&self) -> Duration {
        self.shared.engine.config.wait_timeout
    }

    /// This locker's identity (shared by its clones), for the reentry check.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// [`Error::Reentrant`] if the running future already holds `key` here.
    pub(crate) fn check_reentry(&self, key: &LockKey) -> Result<()> {
        if crate::reentry::holds(self.id(), key) {
            return Err(Error::Reentrant { key: key.clone() });
        }
        Ok(())
    }

    pub(crate) fn loss_policy(&self) -> LossPolicy {
        self.shared.engine.config.on_loss
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<LockerState> {
        &self.shared
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::backend::MemoryBackend;
    use crate::error::Phase;
    use crate::error::{Error, Result};
    use crate::locker::{LockGuard, Locker};
    use crate::settings::LockOptions;

    fn waiting(
        locker: &Locker,
        wait: u64,
    ) -> impl std::future::Future<Output = (Result<LockGuard>, Duration)> + Send + 'static {
        let locker = locker.clone();
        async move {
            let start = Instant::now();
            let options = LockOptions::new().wait_timeout(Duration::from_secs(wait));
            let got = locker.lock_with_options("k", options).await;
            (got, start.elapsed())
        }
    }

    fn timed_out(got: Result<LockGuard>) -> Duration {
        match got {
            Err(Error::Timeout {
                phase: Phase::WaitingLocally,
                waited,
                ..
            }) => waited,
            other => panic!("not a local wait timeout: {other:?}"),
        }
    }

    /// Waiters queued with deadlines in any order each time out at their own
    /// deadline while the key stays held (one watcher serves them, moving its
    /// alarm earlier as earlier deadlines queue); a patient one is granted the
    /// lock when it is released.
    #[tokio::test(start_paused = true)]
    async fn each_local_waiter_times_out_at_its_own_deadline() {
        let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
        let held = locker.lock("k").await.unwrap();
        let mut tasks = Vec::new();
        for wait in [9, 3, 5, 1, 7] {
            tasks.push((wait, tokio::spawn(waiting(&locker, wait))));
            tokio::task::yield_now().await;
        }
        let patient = tokio::spawn(waiting(&locker, 3_600));
        for (wait, task) in tasks {
            let (got, elapsed) = task.await.unwrap();
            let waited = timed_out(got);
            assert_eq!(waited, Duration::from_secs(wait), "waited {waited:?}");
            assert_eq!(elapsed, Duration::from_secs(wait));
        }
        held.release().await.unwrap();
        let (got, _) = patient.await.unwrap();
        got.unwrap().release().await.unwrap();
        assert_eq!(locker.active_keys(), 0);
    }

    /// The slot's watcher runs on the runtime of the waiter that started it. When
    /// that runtime shuts down, a waiter of another runtime still times out at its
    /// deadline (it joins again and starts a watcher where it runs), and one that
    /// waits longer is granted the lock.
    #[test]
    fn a_watcher_that_ends_with_its_runtime_leaves_no_waiter_without_a_deadline() {
        let paused = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap()
        };
        let main = paused();
        let other = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let locker =
            main.block_on(async { Locker::builder(MemoryBackend::new()).build().unwrap() });
        let held = main.block_on(locker.lock("k")).unwrap();
        // The first waiter, on the other runtime, starts the slot's watcher there.
        let first = other.spawn(waiting(&locker, 60));
        other.block_on(async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        let short = main.spawn(waiting(&locker, 2));
        let long = main.spawn(waiting(&locker, 3_600));
        main.block_on(async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        drop(other); // the watcher and the first waiter end with it
        drop(first);
        let (got, elapsed) = main.block_on(short).unwrap();
        assert_eq!(timed_out(got), Duration::from_secs(2));
        assert_eq!(elapsed, Duration::from_secs(2));
        main.block_on(held.release()).unwrap();
        let (got, _) = main.block_on(long).unwrap();
        main.block_on(got.unwrap().release()).unwrap();
    }

    /// Defect: the slot's watcher, started by a waiter on a current-thread
    /// runtime, kept the deadlines of every waiter of the key; with that runtime
    /// alive but no longer driven (between two `block_on`s), a waiter of another
    /// runtime waited past its deadline until the key was released. A waiter of
    /// another runtime than the watcher's keeps its own timer and times out at its
    /// deadline.
    #[test]
    fn a_waiter_times_out_while_the_watchers_runtime_is_not_driven() {
        let main = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let idle = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let locker =
            main.block_on(async { Locker::builder(MemoryBackend::new()).build().unwrap() });
        let held = main.block_on(locker.lock("k")).unwrap();
        // The first waiter, on a runtime driven only now, starts the slot's
        // watcher there; then nothing drives that runtime again.
        let first = idle.spawn(waiting(&locker, 60));
        idle.block_on(async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        let short = main.spawn(waiting(&locker, 2));
        let long = main.spawn(waiting(&locker, 3_600));
        // Paused: the clock jumps to the earliest timer, so a waiter without a
        // timer of its own meets the bound at 10 s instead of its deadline.
        let (got, elapsed) = main
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), short).await })
            .expect("the waiter outlived its deadline: its timer ran on the idle runtime")
            .unwrap();
        assert_eq!(timed_out(got), Duration::from_secs(2));
        assert_eq!(elapsed, Duration::from_secs(2));
        // The first waiter is first in line: it leaves with its runtime, and the
        // release goes to the next.
        drop(first);
        drop(idle);
        main.block_on(held.release()).unwrap();
        let (got, _) = main.block_on(long).unwrap();
        main.block_on(got.unwrap().release()).unwrap();
    }
}
