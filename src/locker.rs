//! [`Locker`]: the user's handle, and its validated settings.

use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Acquire, LeaseToken, LockBackend, Released};
use crate::error::{Error, Phase, Result};
use crate::guard::{LockGuard, LockInfo};
use crate::key::LockKey;
use crate::lease::renewal::Renewals;
use crate::lease::{self, Lease};
use crate::singleflight::Flights;
use crate::slot::{Abandon, Forward, Grant, Join, Lead, Release, Slot, SlotMap};
use crate::stats::{Stats, StatsInner};

/// Local lease handoff settings; see [`LockerBuilder::handoff`]. **On by default**
/// ([`Handoff::enabled`] with the default budget).
///
/// With handoff on, a holder that releases while another local task waits for the
/// same key passes the still-valid lease to that task in memory: no backend request
/// at all. The budget bounds how long one process keeps a lease this way, so other
/// instances are not starved: at most `max_consecutive` handoffs and `max_hold` of
/// total hold time per lease, both **halved** while the backend reports other
/// instances waiting for the key. A lease with less than `min_validity` left, or
/// whose loss is being signalled, is never handed on.
///
/// # Why it is on by default
///
/// * **Safety does not change.** A handoff passes a lease that this process holds
///   and that is still valid for at least `min_validity` (default a third of the
///   TTL); the holder's critical section has ended before the next one starts (one
///   holder per slot), the watchdog keeps renewing the same lease, and the fencing
///   token's handoff sequence grows, so tokens still strictly increase per key.
/// * **Fairness is bounded.** While another instance waits (the backend's queue is not
///   empty, which every acquire, extend and release reports) a lease serves at most
///   `max_consecutive / 2` handoffs (32) and `max_hold / 2` (125 ms) before it goes
///   back to Redis, whose release wakes the head of the key's FIFO queue of
///   instances and gives it the claim window: the instances take turns. So a
///   remote instance waits at most about one budget per instance ahead of it in the
///   queue; with nobody waiting elsewhere, the full budget only delays this
///   process's own tasks, which get the lease in local FIFO order. Measured on the
///   contention benchmark (BENCHMARKS.md): 4 processes × 8 or 64 tasks on one hot
///   key each get 15–35 % of the critical sections.
/// * **Cost.** One backend round trip pair per lease instead of per critical
///   section: on a hot key the default runs a few times faster than a plain Redis
///   lock with a fraction of the server commands.
///
/// Turn it off ([`Handoff::disabled`]) when strict cross-instance FIFO order per
/// critical section matters more than throughput; lower the budget
/// ([`max_consecutive`](Self::max_consecutive), [`max_hold`](Self::max_hold)) to
/// shorten the turns.
///
/// ```
/// use std::time::Duration;
/// use lockflight::Handoff;
///
/// let h = Handoff::enabled().max_consecutive(32).max_hold(Duration::from_millis(100));
/// assert!(h.is_enabled());
/// assert!(!Handoff::disabled().is_enabled());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Handoff {
    enabled: bool,
    max_consecutive: u32,
    max_hold: Duration,
    min_validity: Option<Duration>,
}

impl Handoff {
    /// Default bound on consecutive handoffs per lease.
    pub const DEFAULT_MAX_CONSECUTIVE: u32 = 64;
    /// Default bound on the total hold time of one lease across handoffs.
    pub const DEFAULT_MAX_HOLD: Duration = Duration::from_millis(250);

    /// No handoff: every critical section acquires from the backend.
    pub fn disabled() -> Self {
        Handoff {
            enabled: false,
            ..Self::enabled()
        }
    }

    /// Handoff with the default budget (the default).
    pub fn enabled() -> Self {
        Handoff {
            enabled: true,
            max_consecutive: Self::DEFAULT_MAX_CONSECUTIVE,
            max_hold: Self::DEFAULT_MAX_HOLD,
            min_validity: None,
        }
    }

    /// At most `n` handoffs per lease (at least 1).
    pub fn max_consecutive(mut self, n: u32) -> Self {
        self.max_consecutive = n;
        self
    }

    /// At most `d` of total hold time per lease.
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.max_hold = d;
        self
    }

    /// Never hand on a lease with less than `d` of validity left (default: a third
    /// of the lease TTL).
    pub fn min_validity(mut self, d: Duration) -> Self {
        self.min_validity = Some(d);
        self
    }

    /// Whether handoff is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }
}

impl Default for Handoff {
    /// [`Handoff::enabled`] with the default budget.
    fn default() -> Self {
        Self::enabled()
    }
}

/// What [`Locker::with_lock`] (and the tower layer) do when a lease is lost while the
/// guarded work runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossPolicy {
    /// Drop the guarded future and return [`Error::LeaseLost`] (the default).
    #[default]
    Abort,
    /// Only signal: the work runs on; it can watch [`LockGuard::lost`].
    Signal,
}

/// Per-call settings of [`Locker::lock_with`] (and per route, of
/// [`LockLayer::options`](crate::layer::LockLayer::options)); each unset field
/// takes the locker's setting.
///
/// ```
/// use std::time::Duration;
/// use lockflight::LockOptions;
///
/// // Wait at most 200 ms, hold for at most 10 s without renewal.
/// let quick = LockOptions::new()
///     .wait_timeout(Duration::from_millis(200))
///     .lease_ttl(Duration::from_secs(10));
/// // Fail fast: Error::Busy at once when the key is held.
/// let fail_fast = LockOptions::new().try_only();
/// # let _ = (quick, fail_fast);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct LockOptions {
    wait_timeout: Option<Duration>,
    lease_ttl: Option<Duration>,
    try_only: bool,
}

impl LockOptions {
    /// The locker's settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long this call waits for the lock (`Duration::MAX`: as long as it
    /// takes).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// The TTL of a lease this call acquires from the backend. It must fit the
    /// locker's renewal interval (the rule of
    /// [`LockerBuilder::build`](crate::LockerBuilder::build)). A lease handed to
    /// this call by another local task (handoff) keeps its own TTL.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// Do not wait: [`Error::Busy`] at once when another task of this process or
    /// another instance holds the lock (one backend request at most).
    pub fn try_only(mut self) -> Self {
        self.try_only = true;
        self
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) lease_ttl: Duration,
    pub(crate) wait_timeout: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) handoff: Handoff,
    pub(crate) min_validity: Duration,
    pub(crate) max_waiters: usize,
    pub(crate) coalescing: bool,
    pub(crate) on_loss: LossPolicy,
    pub(crate) fair: bool,
}

/// Settings of a [`Locker`]; see [`Locker::builder`].
#[must_use]
pub struct LockerBuilder {
    backend: Arc<dyn LockBackend>,
    lease_ttl: Duration,
    wait_timeout: Duration,
    renew_every: Option<Duration>,
    handoff: Handoff,
    max_waiters: usize,
    coalescing: bool,
    on_loss: LossPolicy,
    fair: bool,
}

impl fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockerBuilder")
            .field("backend", &self.backend)
            .field("lease_ttl", &self.lease_ttl)
            .field("wait_timeout", &self.wait_timeout)
            .field("renew_every", &self.renew_every)
            .field("handoff", &self.handoff)
            .field("max_waiters", &self.max_waiters)
            .field("coalescing", &self.coalescing)
            .field("on_loss", &self.on_loss)
            .field("fair", &self.fair)
            .finish()
    }
}

impl LockerBuilder {
    /// Default lease TTL.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
    /// Default bound on [`Locker::lock`].
    pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Default bound on local waiters per key.
    pub const DEFAULT_MAX_WAITERS: usize = 10_000;
    /// The shortest lease TTL accepted.
    pub const MIN_LEASE_TTL: Duration = Duration::from_millis(100);
    /// The longest lease TTL accepted (30 days): longer ones overflow clocks and
    /// Redis expiry arithmetic, and a lock nobody can take for a month is a bug.
    pub const MAX_LEASE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

    /// How long a lease lives without renewal (default 30 s, at least 100 ms). The
    /// watchdog renews it every third of that while it is held.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long [`Locker::lock`] waits before [`Error::Timeout`] (default 5 s).
    /// `Duration::MAX` waits as long as it takes.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = timeout;
        self
    }

    /// How often the watchdog renews a held lease (default: a third of the TTL).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Local lease handoff (default [`Handoff::enabled`] with the default budget:
    /// 64 handoffs or 250 ms per lease, halved while other instances wait; see
    /// [`Handoff`] for why this is safe and fair).
    pub fn handoff(mut self, handoff: Handoff) -> Self {
        self.handoff = handoff;
        self
    }

    /// Bound on tasks waiting locally per key (default 10,000); the excess gets
    /// [`Error::Overloaded`] at once.
    pub fn max_waiters(mut self, n: usize) -> Self {
        self.max_waiters = n;
        self
    }

    /// Per-process coalescing (default on). Off, every task competes with the
    /// backend on its own and handoff is impossible: a wake-up for the instance
    /// wakes every local task waiting for the key (a herd). Not part of the
    /// supported API: kept, hidden, only as the naive baseline of the benchmarks
    /// and tests.
    #[doc(hidden)]
    pub fn coalescing(mut self, on: bool) -> Self {
        self.coalescing = on;
        self
    }

    /// Fair mode (default off): the lock is granted in order of arrival across
    /// instances, not only within one.
    ///
    /// By default a free lock goes to whoever asks first: after a TTL expiry (or
    /// while the head of the queue has not yet been told) a newcomer can take it
    /// ahead of instances that have been waiting, and a holder hands the lease to
    /// its own local waiters (within the [`Handoff`] budget) while other instances
    /// wait. That is the cheap, high-throughput behaviour. In fair mode:
    ///
    /// * **Queue position = arrival.** An instance's place in the key's queue is the
    ///   arrival time of its oldest waiting task (the acquire carries that task's
    ///   age; the backend scores the entry *its clock − age*). When that task is
    ///   granted, the next local waiter asks with its own age, so it takes its own
    ///   place: behind remote tasks that arrived before it, ahead of those after.
    /// * **No barging.** A free lock goes only to the earliest live entry of the
    ///   queue (or to anyone when nobody else waits), also after a TTL expiry
    ///   without release: a later caller is queued and the earliest one is woken.
    ///   [`try_lock`](Locker::try_lock) and [`LockOptions::try_only`] answer busy
    ///   when an earlier task of another instance waits.
    /// * **Handoff only in order.** A lease is handed to a local waiter only if the
    ///   backend reported no other instance waiting (as last reported: by the
    ///   acquire or the latest renewal) and that waiter arrived before the lease was
    ///   acquired (remote tasks that arrived later were not counted, and come after
    ///   it); otherwise it is released through the backend, which wakes the
    ///   earliest instance (maybe this one again). Within an instance tasks are
    ///   served FIFO.
    ///
    /// **The guarantee.** Among the fair lockers of a key, tasks get the lock in
    /// the order in which they started waiting (called `lock`), across instances,
    /// and FIFO within an instance, up to the resolution of the measurement: a
    /// task's arrival is taken on its own machine and placed on the server's clock
    /// (*TIME − age*) when its instance asks, so two tasks of different instances
    /// that arrive within about one network round trip (plus scheduling jitter) of
    /// each other may be served in either order. A release through the backend
    /// requeues the releasing instance at its next local task's arrival before it
    /// picks whom to wake, so that task keeps its true place too. Limits: an
    /// instance that stops asking (crashed, frozen) keeps its place until its queue
    /// entry expires (the backend's queue entry TTL, 3 s by default; meanwhile
    /// later tasks wait, none barges); a task that gives up leaves the order;
    /// non-fair lockers of the same key ignore it.
    ///
    /// **Cost.** Under contention nearly every critical section goes through the
    /// backend (an acquire and a release, plus the re-asks of waiting instances)
    /// instead of being handed off in memory: with 4 instances on one hot key,
    /// about 2.2–2.7 backend round trips per critical section, against 0.1 in the
    /// default mode with several tasks per instance (about 3 in both modes with one
    /// task per instance). Inside the scripts fair mode adds a few O(log n) sorted
    /// set commands when the queue is not empty; an uncontended lock costs exactly
    /// what it costs in the default mode.
    ///
    /// The backend must support it ([`LockBackend::supports_fair`]): Redis and
    /// memory do; [`Locker::builder`] over Redlock (whose independent nodes have no
    /// common queue to order by) fails to build with [`Error::InvalidConfig`].
    ///
    /// ```
    /// # fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).fair(true).build()?;
    /// # let _ = locker;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// What [`Locker::with_lock`] does on lease loss (default [`LossPolicy::Abort`]).
    pub fn on_loss(mut self, policy: LossPolicy) -> Self {
        self.on_loss = policy;
        self
    }

    /// Validates the settings and builds the locker.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the setting: a TTL under 100 ms or over
    /// [`MAX_LEASE_TTL`](Self::MAX_LEASE_TTL), a zero wait timeout, a renewal
    /// interval that is zero or too slow to renew in time (the interval plus the
    /// watchdog's scan delay must leave at least half of the lease's validity for
    /// the renewal itself), zero `max_waiters`, a handoff budget of zero, or a
    /// handoff `min_validity` not shorter than the lease's validity, or fair mode
    /// over a backend without it (Redlock) or without coalescing.
    pub fn build(self) -> Result<Locker> {
        let ttl = self.lease_ttl;
        if ttl < Self::MIN_LEASE_TTL || ttl > Self::MAX_LEASE_TTL {
            return Err(Error::config(format!(
                "lease_ttl is {ttl:?}, it must be between {:?} and {:?}",
                Self::MIN_LEASE_TTL,
                Self::MAX_LEASE_TTL
            )));
        }
        if self.wait_timeout.is_zero() {
            return Err(Error::config(
                "wait_timeout is zero; use try_lock for a single attempt",
            ));
        }
        let renew_every = self.renew_every.unwrap_or(ttl / 3);
        let usable = ttl.saturating_sub(lease::drift(ttl));
        validate_ttl(ttl, renew_every).map_err(Error::config)?;
        if self.max_waiters == 0 {
            return Err(Error::config("max_waiters is zero"));
        }
        let min_validity = self.handoff.min_validity.unwrap_or(ttl / 3);
        if self.handoff.enabled {
            if self.handoff.max_consecutive == 0 || self.handoff.max_hold.is_zero() {
                return Err(Error::config(
                    "handoff budget is zero (max_consecutive and max_hold must be above zero)",
                ));
            }
            if min_validity >= usable {
                return Err(Error::config(format!(
                    "handoff min_validity is {min_validity:?}, it must be below the lease \
                     validity of {usable:?}"
                )));
            }
        }
        if self.fair && !self.backend.supports_fair() {
            return Err(Error::config(format!(
                "fair mode is not supported by the backend {:?}: it cannot order waiting \
                 instances (Redlock's independent nodes share no queue); use a Redis or \
                 memory backend, or fair(false)",
                self.backend
            )));
        }
        if self.fair && !self.coalescing {
            return Err(Error::config(
                "fair mode needs coalescing: an instance queues once per key, for its oldest task",
            ));
        }
        let config = Config {
            fair: self.fair,
            lease_ttl: ttl,
            wait_timeout: self.wait_timeout,
            renew_every,
            handoff: self.handoff,
            min_validity,
            max_waiters: self.max_waiters,
            coalescing: self.coalescing,
            on_loss: self.on_loss,
        };
        let backend = self.backend;
        let stats = Arc::<StatsInner>::default();
        let renewals = Arc::new(Renewals::new(
            Arc::clone(&backend),
            config.renew_every,
            Arc::clone(&stats),
        ));
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            backend,
            config,
            stats,
            renewals,
            slots: SlotMap::default(),
            flights: Flights::default(),
            rw: Default::default(),
            semaphores: Default::default(),
        });
        Ok(Locker { shared })
    }
}

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
    shared: Arc<Shared>,
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.shared.backend)
            .field("config", &self.shared.config)
            .field("active_keys", &self.shared.slots.len())
            .finish()
    }
}

pub(crate) struct Shared {
    me: Weak<Shared>,
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) config: Config,
    pub(crate) stats: Arc<StatsInner>,
    pub(crate) slots: SlotMap,
    pub(crate) flights: Flights,
    pub(crate) renewals: Arc<Renewals>,
    /// The read-write locks' local state.
    pub(crate) rw: crate::rwlock::RwLocks,
    /// The semaphores' local state.
    pub(crate) semaphores: crate::semaphore::Semaphores,
}

impl Locker {
    /// Starts configuring a locker over `backend`.
    pub fn builder(backend: impl LockBackend) -> LockerBuilder {
        LockerBuilder {
            backend: Arc::new(backend),
            lease_ttl: LockerBuilder::DEFAULT_LEASE_TTL,
            wait_timeout: LockerBuilder::DEFAULT_WAIT_TIMEOUT,
            renew_every: None,
            handoff: Handoff::enabled(),
            max_waiters: LockerBuilder::DEFAULT_MAX_WAITERS,
            coalescing: true,
            on_loss: LossPolicy::Abort,
            fair: false,
        }
    }

    /// Takes the lock of `key`, waiting up to the configured wait timeout.
    ///
    /// Within this process at most one task per key talks to the backend; the others
    /// wait in a local FIFO and are granted either leadership or (with handoff) the
    /// lease itself.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for an empty or oversized key; [`Error::Reentrant`] at
    /// once when the running future already holds `key` (it runs inside
    /// [`with_lock`](Self::with_lock) or behind the lock layer for it, see
    /// "Reentrancy" below); [`Error::Timeout`] when the wait timeout passes; [`Error::Overloaded`] when `max_waiters` tasks already
    /// wait for the key; [`Error::ForeignValue`], [`Error::NoPermission`] and
    /// [`Error::Backend`] from the backend (transient backend errors are retried
    /// until the deadline).
    ///
    /// # Reentrancy
    ///
    /// Locks are not reentrant: a second `lock` of a held key would wait behind
    /// itself. Inside [`with_lock`](Self::with_lock)'s closure and behind the lock
    /// layer, the held keys are known (a task-local scope around the guarded
    /// future), so asking again fails at once with [`Error::Reentrant`]. Holding is
    /// scoped to the guarded future, not to a thread or a task: tasks move between
    /// threads, and one task may run independent futures (`join!`) that each wait
    /// for the lock in turn, correctly.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped waiter leaves the local queue without disturbing it; a
    /// dropped leader passes leadership (and its token, so an acquire that may have
    /// landed is reconciled) to the next waiter, or releases that token and leaves the
    /// backend queue in the background when nobody waits.
    pub async fn lock(&self, key: impl Into<LockKey>) -> Result<LockGuard> {
        self.lock_within(key, self.shared.config.wait_timeout).await
    }

    /// Like [`lock`](Self::lock) with an explicit wait timeout.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn lock_within(&self, key: impl Into<LockKey>, wait: Duration) -> Result<LockGuard> {
        let key = key.into();
        key.validate()?;
        self.check_reentry(&key)?;
        let span = tracing::debug_span!("lockflight.lock", key = %key);
        let ttl = self.shared.config.lease_ttl;
        self.lock_inner(key, wait, ttl).instrument(span).await
    }

    /// Records the wait of a granted call.
    fn granted<T>(start: Instant, result: Result<T>) -> Result<T> {
        if result.is_ok() {
            crate::stats::histograms::wait(start.elapsed());
        }
        result
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
    /// let busy = locker.lock_with("sku:555", LockOptions::new().try_only()).await;
    /// assert!(matches!(busy, Err(Error::Busy { .. })));
    /// drop(held);
    /// let guard = locker
    ///     .lock_with("sku:555", LockOptions::new().wait_timeout(Duration::from_secs(1)))
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
    pub async fn lock_with(
        &self,
        key: impl Into<LockKey>,
        options: LockOptions,
    ) -> Result<LockGuard> {
        let key = key.into();
        key.validate()?;
        self.check_reentry(&key)?;
        let config = &self.shared.config;
        let ttl = match options.lease_ttl {
            Some(ttl) => {
                validate_ttl(ttl, config.renew_every)
                    .map_err(|reason| Error::config(format!("lock_with({key}): {reason}")))?;
                ttl
            }
            None => config.lease_ttl,
        };
        let span = tracing::debug_span!("lockflight.lock", key = %key);
        if options.try_only {
            return match self.try_lock_inner(&key, ttl).instrument(span).await? {
                Some(guard) => Ok(guard),
                None => Err(Error::Busy { key }),
            };
        }
        let wait = options.wait_timeout.unwrap_or(config.wait_timeout);
        self.lock_inner(key, wait, ttl).instrument(span).await
    }

    async fn lock_inner(&self, key: LockKey, wait: Duration, ttl: Duration) -> Result<LockGuard> {
        let start = Instant::now();
        Self::granted(start, self.lock_inner_at(key, start, wait, ttl).await)
    }

    async fn lock_inner_at(
        &self,
        key: LockKey,
        start: Instant,
        wait: Duration,
        ttl: Duration,
    ) -> Result<LockGuard> {
        let deadline = deadline_after(start, wait);
        let shared = &self.shared;
        loop {
            let (slot, lead) = if !shared.config.coalescing {
                (None, Lead::default())
            } else {
                let fwd: Arc<dyn Forward> = shared.arc();
                match Slot::join(&shared.slots, &key, shared.config.max_waiters, &fwd) {
                    Join::Lead(slot) => (Some(slot), Lead::default()),
                    Join::Overloaded => {
                        return Err(Error::Overloaded {
                            key,
                            waiters: shared.config.max_waiters,
                        });
                    }
                    Join::Wait(mut ticket) => {
                        shared.stats.local_wait();
                        match tokio::time::timeout_at(deadline, ticket.granted()).await {
                            Err(_) => {
                                shared.stats.timeout();
                                return Err(Error::Timeout {
                                    key,
                                    phase: Phase::WaitingLocally,
                                    waited: start.elapsed(),
                                });
                            }
                            Ok(Grant::Lease(lease, seq)) => {
                                let slot = Arc::clone(ticket.slot());
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
                            Ok(Grant::Lead(lead)) => (Some(Arc::clone(ticket.slot())), lead),
                        }
                    }
                }
            };
            return shared
                .lead(
                    &key,
                    slot,
                    lead,
                    Call {
                        start,
                        deadline,
                        queue: true,
                        ttl,
                    },
                )
                .await?
                .ok_or_else(|| {
                    Error::backend(&key, Phase::Acquiring, "busy reply to a waiting acquire")
                });
        }
    }

    /// Takes the lock of `key` if it is free right now: one backend request, no
    /// waiting. Returns `None` when another task of this process or another instance
    /// holds it.
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
        let key = key.into();
        key.validate()?;
        self.check_reentry(&key)?;
        self.try_lock_inner(&key, self.shared.config.lease_ttl)
            .await
    }

    async fn try_lock_inner(&self, key: &LockKey, ttl: Duration) -> Result<Option<LockGuard>> {
        let start = Instant::now();
        match self.try_lock_at(key, start, ttl).await {
            Ok(Some(guard)) => Self::granted(start, Ok(Some(guard))),
            other => other,
        }
    }

    async fn try_lock_at(
        &self,
        key: &LockKey,
        start: Instant,
        ttl: Duration,
    ) -> Result<Option<LockGuard>> {
        let key = key.clone();
        let deadline = deadline_after(start, self.shared.config.wait_timeout);
        let shared = &self.shared;
        let slot = if shared.config.coalescing {
            let fwd: Arc<dyn Forward> = shared.arc();
            match Slot::try_join(&shared.slots, &key, &fwd) {
                Some(slot) => Some(slot),
                None => return Ok(None),
            }
        } else {
            None
        };
        shared
            .lead(
                &key,
                slot,
                Lead::default(),
                Call {
                    start,
                    deadline,
                    queue: false,
                    ttl,
                },
            )
            .await
    }

    /// Runs `work` while holding the lock of `key`, then releases it.
    ///
    /// `work` receives the [`LockInfo`]: key, fencing token and a
    /// [`LossSignal`](crate::guard::LossSignal). With the default [`LossPolicy::Abort`], if
    /// the lease is lost while `work` runs, its future is dropped at its next
    /// `.await` and the call returns [`Error::LeaseLost`]. With
    /// [`LossPolicy::Signal`] the work runs on and watches `info.loss` itself.
    ///
    /// If the lease was lost by the time `work` finished (possible under
    /// [`LossPolicy::Signal`]), or the release after `work` finds that the lock
    /// was no longer this lease's (it expired or was taken over while `work` ran),
    /// the call returns [`Error::LeaseLost`] and `work`'s output is dropped: the
    /// work ran past its lease. Other release problems
    /// (the backend unreachable) are logged, not returned: the work completed within
    /// its validity, and the lock expires at its TTL.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), plus [`Error::LeaseLost`].
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
        let out = match self.shared.config.on_loss {
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

    /// Counters since the locker was built.
    pub fn stats(&self) -> Stats {
        self.shared.stats.snapshot()
    }

    /// Number of keys with local activity (a holder, a leader or waiters). Zero when
    /// every task is done: slots never outlive their use.
    pub fn active_keys(&self) -> usize {
        self.shared.slots.len()
    }

    /// The configured wait timeout.
    pub(crate) fn wait_timeout(&self) -> Duration {
        self.shared.config.wait_timeout
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
        self.shared.config.on_loss
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// What one call asks of the leader loop.
#[derive(Clone, Copy, Debug)]
struct Call {
    start: Instant,
    deadline: Instant,
    /// Join the backend's queue when busy (`false` for a single attempt).
    queue: bool,
    /// The TTL of a lease acquired by this call.
    ttl: Duration,
}

/// The one task that talks to the backend for a key, until it holds the lease or
/// gives up. Dropping it unfinished passes leadership on (see [`Slot::abandon`]).
struct Leading {
    shared: Arc<Shared>,
    key: LockKey,
    slot: Option<Arc<Slot>>,
    lead: Lead,
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

impl Shared {
    fn arc(&self) -> Arc<Shared> {
        self.me
            .upgrade()
            .expect("a Locker's shared state is alive while it is used")
    }

    /// Releases a token whose acquire may have landed and leaves the backend queue,
    /// in the background.
    fn cleanup(&self, key: &LockKey, lead: Lead) {
        if lead.token.is_none() && !lead.queued {
            return;
        }
        let key = key.clone();
        let backend = Arc::clone(&self.backend);
        let stats = Arc::clone(&self.stats);
        spawn_detached(async move {
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
    async fn lead(
        &self,
        key: &LockKey,
        slot: Option<Arc<Slot>>,
        inherited: Lead,
        call: Call,
    ) -> Result<Option<LockGuard>> {
        let Call {
            start,
            deadline,
            queue,
            ttl,
        } = call;
        let token = inherited.token.unwrap_or_else(LeaseToken::random);
        let mut leading = Leading {
            shared: self.arc(),
            key: key.clone(),
            slot,
            lead: Lead {
                token: Some(token),
                queued: inherited.queued,
            },
            finished: false,
        };
        let wakeups = self.backend.wakeups();
        let mut wakeup: Option<crate::backend::Wakeup> = None;
        let mut backoff = Duration::from_millis(10);
        loop {
            let generation = wakeups.generation(key.as_bytes());
            let sent_at = Instant::now();
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
                Ok(Acquire::Acquired { epoch, waiting }) => {
                    if epoch == 0 && self.backend.fencing() {
                        leading.lead.token = Some(token);
                        return Err(Error::backend(
                            key,
                            Phase::Acquiring,
                            "the backend granted the lock without a fencing epoch",
                        ));
                    }
                    let lease = Arc::new(Lease::new(
                        key.clone(),
                        token,
                        epoch,
                        ttl,
                        sent_at,
                        waiting,
                        Arc::clone(&self.stats),
                    ));
                    if Instant::now() >= lease.valid_until() {
                        // The reply came back after the lease's validity ended (a slow
                        // network, a stalled runtime): it is not held. Ask again with
                        // the same token, which re-arms it if it still exists.
                        tracing::debug!(%key, "acquire reply arrived after the lease's validity");
                        if Instant::now() >= deadline {
                            return Err(self.timed_out(key, start));
                        }
                        continue;
                    }
                    self.stats.acquired();
                    leading.finished = true;
                    if let Some(slot) = &leading.slot {
                        slot.acquired();
                    }
                    self.renewals.watch(&lease, sent_at);
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
                    backoff = Duration::from_millis(10);
                    let wakeup = match &mut wakeup {
                        Some(w) => w,
                        None => {
                            // Watch only now that we wait; a wake-up that arrived
                            // before this registration shows in the generation.
                            let w = wakeup.insert(wakeups.watch(key));
                            if wakeups.generation(key.as_bytes()) != generation {
                                continue;
                            }
                            w
                        }
                    };
                    tokio::select! {
                        _ = wakeup.woken() => {}
                        _ = tokio::time::sleep(retry_in) => {}
                        _ = tokio::time::sleep_until(deadline) => {
                            return Err(self.timed_out(key, start));
                        }
                    }
                }
                Err(
                    e @ (Error::Backend { .. }
                    | Error::Connect { .. }
                    | Error::QuorumNotReached { .. }),
                ) => {
                    // Transient: the request may or may not have landed; the token
                    // stays armed so a retry (or the cleanup) reconciles it. A
                    // single attempt (`try_lock`) reports a missing quorum at once:
                    // the nodes answered, and a majority of them is out of reach.
                    if !queue && matches!(e, Error::QuorumNotReached { .. }) {
                        return Err(e);
                    }
                    tracing::debug!(%key, error = %e, "acquire failed; retrying");
                    if Instant::now() + backoff >= deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e @ (Error::Refused { .. } | Error::NoPermission { .. })) => {
                    // Refused by the server (out of memory, a read-only replica, a
                    // command the ACL user lacks): answered at once. Keep the token
                    // armed for the cleanup, which releases whatever a partly run
                    // script might have written.
                    return Err(e);
                }
                Err(e) => {
                    // A definite refusal (foreign value, bad input): the scripts read
                    // everything that can fail before they write.
                    leading.lead.token = None;
                    return Err(e);
                }
            }
        }
    }

    fn timed_out(&self, key: &LockKey, start: Instant) -> Error {
        self.stats.timeout();
        Error::Timeout {
            key: key.clone(),
            phase: Phase::Acquiring,
            waited: start.elapsed(),
        }
    }

    /// Whether `lease` may go to a local waiter instead of back to the backend.
    pub(crate) fn may_hand_off(&self, lease: &Lease) -> bool {
        let h = &self.config.handoff;
        if !h.enabled || lease.is_lost() || lease.remaining() < self.config.min_validity {
            return false;
        }
        let waiting = lease.waiting.load(Ordering::Relaxed);
        if self.config.fair && waiting > 0 {
            return false;
        }
        let (max_n, max_hold) = if waiting > 0 {
            (h.max_consecutive.div_ceil(2), h.max_hold / 2)
        } else {
            (h.max_consecutive, h.max_hold)
        };
        lease.handoffs.load(Ordering::Relaxed) < max_n && lease.acquired_at.elapsed() < max_hold
    }

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
            // Fair: only to a waiter that arrived before the acquire that found no
            // other instance waiting (any later remote waiter arrived after it).
            let arrived_by = self.config.fair.then_some(lease.acquired_at);
            if slot.release(&lease, seq + 1, handoff, arrived_by) == Release::HandedOff {
                lease.handoffs.fetch_add(1, Ordering::Relaxed);
                self.stats.handoff();
                return None;
            }
        }
        Some(ReleaseJob {
            shared: self.arc(),
            slot,
            lease,
        })
    }
}

impl Forward for Shared {
    fn forward(&self, slot: &Arc<Slot>, grant: Grant) {
        match grant {
            Grant::Lead(lead) => {
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
    shared: Arc<Shared>,
    slot: Option<Arc<Slot>>,
    lease: Arc<Lease>,
}

/// Re-runs a release from scratch in the background if the future running it is
/// dropped half-way (release is idempotent per token).
struct Rearm(Option<ReleaseJob>);

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
struct Background(Option<ReleaseJob>);

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(job) = self.0.take() {
            job.settle_locally();
        }
    }
}

impl ReleaseJob {
    /// Releases at the backend (retrying transient errors briefly), then lets the
    /// next local waiter lead. If this future is dropped before it finishes, the
    /// release is re-run in the background.
    pub(crate) async fn run(self) -> Result<()> {
        let span = tracing::debug_span!("lockflight.release", key = %self.lease.key);
        self.run_inner().instrument(span).await
    }

    async fn run_inner(self) -> Result<()> {
        let mut rearm = Rearm(Some(self));
        let job = rearm.0.as_ref().expect("armed");
        let (shared, lease) = (Arc::clone(&job.shared), Arc::clone(&job.lease));
        shared.renewals.forget(&lease);
        crate::stats::histograms::renewals(lease.renewed.load(Ordering::Relaxed));
        let mut attempt = 0u32;
        // Fair: a local waiter keeps this instance's place in the backend's queue
        // (its arrival time), so the release wakes whoever arrived first.
        let requeue = match &job.slot {
            Some(slot) if shared.config.fair => slot.oldest_waiter(),
            _ => None,
        };
        let result = loop {
            shared.stats.release();
            let reply = match requeue {
                None => shared.backend.release(&lease.key, lease.token).await,
                Some(at) => {
                    let age = Instant::now().saturating_duration_since(at);
                    shared
                        .backend
                        .release_fair(&lease.key, lease.token, age)
                        .await
                }
            };
            match reply {
                Err(Error::Backend { .. } | Error::Connect { .. }) if attempt < 2 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20) * attempt).await;
                }
                other => break other,
            }
        };
        let job = rearm.0.take().expect("armed");
        // A release that failed may still hold the lock at the backend: the next
        // local leader inherits the token and reconciles it (its acquire finds the
        // lock already ours) instead of everyone waiting out the TTL.
        // A requeued instance is (maybe) in the backend's queue: whoever inherits the
        // lead leaves it if nobody wants the lock any more.
        let queued = requeue.is_some();
        let unsettled = match &result {
            Err(Error::Backend { .. } | Error::Connect { .. } | Error::Refused { .. }) => Lead {
                token: Some(lease.token),
                queued,
            },
            _ => Lead {
                token: None,
                queued,
            },
        };
        job.settle(unsettled);
        match result? {
            Released { released: true, .. } => Ok(()),
            Released {
                released: false, ..
            } => {
                let reason = if lease.is_lost() {
                    lease.lost_reason()
                } else {
                    "the lock was no longer held by this lease (expired or taken over); \
                     nothing was deleted"
                        .into()
                };
                Err(Error::LeaseLost {
                    key: lease.key.clone(),
                    phase: Phase::Releasing,
                    reason,
                })
            }
        }
    }

    /// Lets the next local waiter lead, inheriting `lead`; with nobody waiting, the
    /// slot goes idle and `lead`'s token (if any) is released in the background.
    fn settle(self, lead: Lead) {
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
    fn settle_locally(self) {
        self.shared.renewals.forget(&self.lease);
        crate::stats::histograms::renewals(self.lease.renewed.load(Ordering::Relaxed));
        if let Some(slot) = &self.slot {
            let _ = slot.released(&self.shared.slots, Lead::default());
        }
    }

    /// Runs in the background. Without a Tokio runtime (a guard dropped outside
    /// one), or if the runtime shuts down before the task runs, the backend release
    /// is skipped — the lease expires at its TTL — and the next local waiter is
    /// promoted at once.
    pub(crate) fn spawn(self) {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let mut pending = Background(Some(self));
                handle.spawn(async move {
                    let job = pending.0.take().expect("set above");
                    if let Err(e) = job.run().await {
                        tracing::debug!(error = %e, "background release failed");
                    }
                });
            }
            Err(_) => self.settle_locally(),
        }
    }
}

/// Checks that leases of `ttl` can be renewed in time every `renew_every`: the
/// interval plus the watchdog's scan delay must leave at least half of the
/// lease's validity for the renewal itself.
fn validate_ttl(ttl: Duration, renew_every: Duration) -> std::result::Result<(), String> {
    if !(LockerBuilder::MIN_LEASE_TTL..=LockerBuilder::MAX_LEASE_TTL).contains(&ttl) {
        return Err(format!(
            "lease_ttl is {ttl:?}, it must be between {:?} and {:?}",
            LockerBuilder::MIN_LEASE_TTL,
            LockerBuilder::MAX_LEASE_TTL
        ));
    }
    let usable = ttl.saturating_sub(lease::drift(ttl));
    let latest_start = renew_every.saturating_add(crate::lease::renewal::tick(renew_every));
    if renew_every.is_zero() || latest_start > usable / 2 {
        return Err(format!(
            "renew_every is {renew_every:?}; a renewal may then start {latest_start:?} \
             after the acquire, which leaves less than half of the lease validity of \
             {usable:?} (lease_ttl {ttl:?} minus the drift margin) to renew in time; use a \
             renew_every of at most {:?} or a longer lease_ttl",
            usable * 2 / 5
        ));
    }
    Ok(())
}

/// `start + wait`, or a far future when that overflows (a wait of `Duration::MAX`
/// waits as long as it takes, like [`tokio::time::sleep`]).
fn deadline_after(start: Instant, wait: Duration) -> Instant {
    start
        .checked_add(wait)
        .unwrap_or_else(|| start + Duration::from_secs(86_400 * 365 * 30))
}

/// Spawns `fut` on the current runtime, if there is one.
fn spawn_detached<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(fut);
    }
}
