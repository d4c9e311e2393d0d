//! Every setting of a [`Locker`](crate::Locker), in one place: the public parts
//! users build ([`Handoff`], [`LossPolicy`], per-call [`LockOptions`]; re-exported
//! at the crate root), their defaults and bounds, the raw [`Settings`] a
//! [`LockerBuilder`](crate::LockerBuilder) collects, and the one validation that
//! turns them into the [`Config`] every lock kind reads. The builder itself is only
//! the setters (`locker/builder.rs`); the backend's own settings (timeouts, prefix,
//! replica acknowledgement) live with each backend's builder.

use std::time::Duration;

use crate::backend::LockBackend;
use crate::error::{Error, Result};

/// Local lease handoff settings; see [`LockerBuilder::handoff`](crate::LockerBuilder::handoff). **On by default**
/// ([`Handoff::enabled`] with the default budget).
///
/// With handoff on, a holder that releases while another local task waits for the
/// same key passes the still-valid lease to that task in memory: no backend request
/// at all. It applies to the exclusive lock and to semaphore permits (a released
/// permit goes to the next local waiter of its semaphore, on the same budget). The budget bounds how long one process keeps a lease this way, so other
/// instances are not starved: at most `max_consecutive` handoffs and `max_hold` of
/// total hold time per lease. While the backend reports other instances waiting for
/// the key, both are **halved**, and a lease also serves at most **two handoffs per
/// local task that was waiting when it was taken** (at least eight). A lease with
/// less than `min_validity` left, or whose loss is being signalled, is never handed
/// on.
///
/// # Why it is on by default
///
/// * **Safety does not change.** A handoff passes a lease that this process holds
///   and that is still valid for at least `min_validity` (default a third of the
///   TTL); the holder's critical section has ended before the next one starts (one
///   holder per slot), the watchdog keeps renewing the same lease, and the fencing
///   token's handoff sequence grows, so tokens still strictly increase per key.
/// * **Fairness is bounded.** While another instance waits (the backend's queue is not
///   empty, which every acquire, extend and release of a mutex reports, and a
///   semaphore's acquire) a lease serves at most
///   `max_consecutive / 2` handoffs (32), `max_hold / 2` (125 ms) and two handoffs
///   per local task that was waiting when the lease was taken (at least eight),
///   before it goes back to Redis, whose release wakes the head of the key's FIFO
///   queue of instances and gives it the claim window: the instances take turns. A
///   turn is about as long as the local queue it serves (each waiting task runs
///   about twice; eight sections at least, so a process with one or two busy tasks
///   still pays a backend round trip pair per eight sections, not per two), and a
///   remote task waits roughly one turn per instance ahead of it in the queue. With nobody waiting elsewhere, the full budget only delays this
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
    pub(crate) enabled: bool,
    pub(crate) max_consecutive: u32,
    pub(crate) max_hold: Duration,
    pub(crate) min_validity: Option<Duration>,
    pub(crate) linger: Duration,
}

impl Handoff {
    /// Default bound on consecutive handoffs per lease.
    pub const DEFAULT_MAX_CONSECUTIVE: u32 = 64;
    /// Default bound on the total hold time of one lease across handoffs.
    pub const DEFAULT_MAX_HOLD: Duration = Duration::from_millis(250);
    /// Default time a lease that no local task wants is kept for the next one
    /// (lease caching; see [`linger`](Self::linger)).
    pub const DEFAULT_LINGER: Duration = Duration::from_millis(20);

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
            linger: Self::DEFAULT_LINGER,
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

    /// Lease caching: a holder that releases while no local task waits keeps the
    /// lease up to `d` (default [`DEFAULT_LINGER`](Self::DEFAULT_LINGER), 20 ms)
    /// for the next task of this process that asks for the key, which then takes
    /// it without a backend request — a handoff to a task that arrives a moment
    /// later, within the same budget (`max_consecutive`, `max_hold`,
    /// `min_validity`) and with the same fencing (the handoff sequence grows). If
    /// no local task asks within `d`, the lease is released at the backend, `d`
    /// later than without caching, or sooner: when the budget would no longer let
    /// it be handed on. `Duration::ZERO` turns caching off; fair mode
    /// never caches. It applies to the mutex (`lock`, `with_lock`, `lock_many`),
    /// not to read-write leases or permits.
    ///
    /// **Only where it pays.** A lease is kept only if it was asked for within `d`
    /// of this locker's last backend release of the key (caching that lease would
    /// have served the request: a key locked again and again, as a worker does). A
    /// program that takes a key once and exits never leaves a cached lease
    /// behind, and the first release of a key always goes to the backend. Where
    /// another instance is known to wait for the key (it queued or sent a
    /// revocation while the lease was in use, or the backend said so), the lease
    /// is kept only until the releasing task yields: a task that locks the key
    /// again at once takes it (within the budget), nobody else waits for it. And
    /// a key whose cached lease another instance wanted is not cached for a
    /// second.
    ///
    /// **Revocation.** Another instance (Redis backend) that queues for the key, or
    /// whose `try_lock` finds it held, sends this instance a revocation, and the
    /// idle cached lease is released at once: a long `d` does not make other
    /// instances wait. One that comes while a local task uses the lease does not
    /// end that use (the handoff budget bounds it), and makes the next release
    /// keep the lease only until the releasing task yields. Redlock and the
    /// in-memory backend send no revocations: there a cached lease ends with `d`
    /// or the budget.
    ///
    /// **Takeovers.** A cached lease stays this process's at the backend and keeps
    /// being renewed, and it is taken only if it may be handed on: never once it
    /// is known lost. An operator's forced release tells this instance at once
    /// (Redis backend), so the next `lock` waits for the new holder instead of
    /// starting on the deleted lease. A takeover nobody announces (a `FLUSHALL`, a
    /// failover that lost the key, an eviction) is found by the lease's next
    /// renewal the backend answers ("not the owner"): until then, at most the
    /// renewal interval plus a quarter of it (the watchdog's scan) and a round
    /// trip (or, while the backend does not answer, until the lease's validity
    /// ends), and never later than `max_hold` after the grant, a local section may
    /// still start on the lease, as one could by a
    /// handoff to a waiting task; a resource that checks fencing tokens refuses
    /// their writes once it has accepted one of the new holder's.
    ///
    /// **Exit.** Dropping the last clone of the [`Locker`](crate::Locker) releases
    /// its cached leases and waits for that, at most a second, on either runtime
    /// flavor (on a current-thread runtime, or outside one, from a thread of its
    /// own); on a multi-thread runtime it also waits for the background releases
    /// of every lock kind still under way (dropped guards' and permits'). A
    /// process that exits within `d` of a release without dropping its last
    /// `Locker` (one kept in a `static`, `std::process::exit`) leaves that lease
    /// to expire at its TTL, as if it had crashed. Call
    /// [`Locker::shutdown`](crate::Locker::shutdown) before exiting to be sure.
    ///
    /// A process that loops over a key pays one backend round trip pair per
    /// budget instead of per critical section. What it costs: another instance
    /// that was already waiting may wait up to `d` longer where no revocation
    /// reaches this instance.
    pub fn linger(mut self, d: Duration) -> Self {
        self.linger = d;
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

/// What [`Locker::with_lock`](crate::Locker::with_lock) (and the tower layer) do when a lease is lost while the
/// guarded work runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossPolicy {
    /// Drop the guarded future and return [`Error::LeaseLost`](crate::Error::LeaseLost) (the default).
    #[default]
    Abort,
    /// Only signal: the work runs on; it can watch [`LockGuard::lost`](crate::LockGuard::lost).
    Signal,
}

/// Per-call settings of [`Locker::lock_with_options`](crate::Locker::lock_with_options) (and per route, of
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
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) lease_ttl: Option<Duration>,
    pub(crate) try_only: bool,
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

/// Default lease TTL.
pub(crate) const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Default bound on [`Locker::lock`](crate::Locker::lock).
pub(crate) const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on local waiters per key.
pub(crate) const DEFAULT_MAX_WAITERS: usize = 10_000;
/// The shortest lease TTL accepted.
pub(crate) const MIN_LEASE_TTL: Duration = Duration::from_millis(100);
/// The longest lease TTL accepted (30 days).
pub(crate) const MAX_LEASE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The settings a [`LockerBuilder`](crate::LockerBuilder) collects, not yet
/// checked against each other: [`Settings::validate`] makes them a [`Config`].
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) lease_ttl: Duration,
    pub(crate) wait_timeout: Duration,
    /// `None`: a third of the lease TTL.
    pub(crate) renew_every: Option<Duration>,
    pub(crate) handoff: Handoff,
    pub(crate) max_waiters: usize,
    pub(crate) coalescing: bool,
    pub(crate) on_loss: LossPolicy,
    pub(crate) fair: bool,
    pub(crate) hold_limit: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease_ttl: DEFAULT_LEASE_TTL,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            renew_every: None,
            handoff: Handoff::enabled(),
            max_waiters: DEFAULT_MAX_WAITERS,
            coalescing: true,
            on_loss: LossPolicy::Abort,
            fair: false,
            hold_limit: None,
        }
    }
}

impl Settings {
    /// Checks the settings against each other and against `backend`, and derives
    /// the defaults that depend on others (renewal interval, handoff
    /// `min_validity`): the rules [`LockerBuilder::build`](crate::LockerBuilder::build)
    /// documents.
    pub(crate) fn validate(self, backend: &dyn LockBackend) -> Result<Config> {
        let ttl = self.lease_ttl;
        ttl_in_bounds(ttl).map_err(Error::config)?;
        if self.wait_timeout.is_zero() {
            return Err(Error::config(
                "wait_timeout is zero; use try_lock for a single attempt",
            ));
        }
        let renew_every = self.renew_every.unwrap_or(ttl / 3);
        let usable = ttl.saturating_sub(crate::backend::drift(ttl));
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
        if self.fair && !backend.supports_fair() {
            return Err(Error::config(format!(
                "fair mode is not supported by the backend {:?}: it cannot order waiting \
                 instances (Redlock's independent nodes share no queue); use a Redis or \
                 memory backend, or fair(false)",
                backend
            )));
        }
        if self.hold_limit.is_some_and(|d| d.is_zero()) {
            return Err(Error::config(
                "hold_limit is zero; leave it unset for no limit",
            ));
        }
        if self.fair && !self.coalescing {
            return Err(Error::config(
                "fair mode needs coalescing: an instance queues once per key, for its oldest task",
            ));
        }
        Ok(Config {
            fair: self.fair,
            lease_ttl: ttl,
            wait_timeout: self.wait_timeout,
            renew_every,
            handoff: self.handoff,
            min_validity,
            max_waiters: self.max_waiters,
            coalescing: self.coalescing,
            on_loss: self.on_loss,
            hold_limit: self.hold_limit,
        })
    }
}

/// A locker's validated settings.
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
    /// No lease of this locker is valid longer than this after its grant.
    pub(crate) hold_limit: Option<Duration>,
}

/// Checks that `ttl` is within [`MIN_LEASE_TTL`] and [`MAX_LEASE_TTL`].
fn ttl_in_bounds(ttl: Duration) -> std::result::Result<(), String> {
    if (MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&ttl) {
        return Ok(());
    }
    Err(format!(
        "lease_ttl is {ttl:?}, it must be between {MIN_LEASE_TTL:?} and {MAX_LEASE_TTL:?}"
    ))
}

/// Checks that leases of `ttl` can be renewed in time every `renew_every`: the
/// interval plus the watchdog's scan delay must leave at least half of the
/// lease's validity for the renewal itself.
pub(crate) fn validate_ttl(
    ttl: Duration,
    renew_every: Duration,
) -> std::result::Result<(), String> {
    ttl_in_bounds(ttl)?;
    let usable = ttl.saturating_sub(crate::backend::drift(ttl));
    let latest_start = renew_every.saturating_add(crate::backend::schedule::tick(renew_every));
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

impl LockOptions {
    /// The wait of a call of a kind whose leases take the locker's TTL (read-write
    /// locks, semaphores): `None` for a single attempt; [`Error::InvalidConfig`]
    /// for a per-call lease TTL, which only the exclusive lock takes.
    pub(crate) fn wait_at_locker_ttl(
        &self,
        call: &str,
        key: &crate::key::LockKey,
        default_wait: Duration,
    ) -> crate::Result<Option<Duration>> {
        if self.lease_ttl.is_some() {
            return Err(crate::Error::config(format!(
                "{call}({key}): a per-call lease TTL is for the exclusive lock only"
            )));
        }
        Ok((!self.try_only).then(|| self.wait_timeout.unwrap_or(default_wait)))
    }
}
