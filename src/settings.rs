//! Every setting of a [`Locker`](crate::Locker), in one place: the public parts
//! users build ([`Handoff`], [`Contention`], [`LossPolicy`], per-call [`LockOptions`]; re-exported
//! at the crate root), their defaults and bounds, the raw [`Settings`] a
//! [`LockerBuilder`](crate::LockerBuilder) collects, and the one validation that
//! turns them into the [`Config`] every lock kind reads. The builder itself is only
//! the setters (`locker/builder.rs`); the backend's own settings (timeouts, prefix,
//! replica acknowledgement) live with each backend's builder.

use std::time::Duration;

use crate::backend::LockBackend;
use crate::error::{Error, Result};

/// The local handoff budget; see [`LockerBuilder::handoff`](crate::LockerBuilder::handoff).
/// **On by default** ([`Handoff::enabled`] with the default budget).
///
/// With handoff on, a holder that releases while another local task waits for the
/// same key passes the still-valid lease to that task in memory, without a backend
/// request: for the exclusive lock and for semaphore permits. The budget bounds how
/// long one process keeps a lease this way:
///
/// * at most `max_consecutive` handoffs and `max_hold` of total hold time per lease;
/// * while the backend reports other instances waiting for the key, both are
///   halved, and a lease serves at most two handoffs per local task that was
///   waiting when it was taken (at least eight);
/// * a lease with less than `min_validity` left, or whose loss is being signalled,
///   is never handed on.
///
/// A handoff keeps every guarantee (exclusion, renewal, strictly increasing fencing
/// tokens); ARCHITECTURE.md explains why. [`Handoff::disabled`] sends every critical
/// section to the backend, and turns the default lease caching off
/// ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)).
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

/// How the tasks of one process contend for a key's exclusive lock; see
/// [`LockerBuilder::contention`](crate::LockerBuilder::contention).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Contention {
    /// One backend contender per key per process (the default): one task asks the
    /// backend, the others wait in a local FIFO and get the lease by handoff.
    #[default]
    Coalesced,
    /// [`Coalesced`](Self::Coalesced), and the lock granted in order of arrival
    /// across instances. Needs a backend that can order waiting instances
    /// (Redis and memory can, Redlock cannot).
    Fair,
    /// Every task asks the backend on its own, as a separate client would: no
    /// local queue, no handoff, no lease caching.
    PerTask,
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
    /// The latest end of a lease this call acquires, from its request (a
    /// scheduled job's `at_most`); the earlier of it and the locker's hold limit
    /// holds.
    pub(crate) hold_limit: Option<Duration>,
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

/// Default of [`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for).
pub(crate) const DEFAULT_LEASE_CACHE: Duration = Duration::from_millis(20);
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
    /// `None`: [`DEFAULT_LEASE_CACHE`] where caching applies, else zero.
    pub(crate) lease_cache: Option<Duration>,
    pub(crate) max_waiters: usize,
    pub(crate) contention: Contention,
    pub(crate) on_loss: LossPolicy,
    pub(crate) hold_limit: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease_ttl: DEFAULT_LEASE_TTL,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            renew_every: None,
            handoff: Handoff::enabled(),
            lease_cache: None,
            max_waiters: DEFAULT_MAX_WAITERS,
            contention: Contention::Coalesced,
            on_loss: LossPolicy::Abort,
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
        let fair = self.contention == Contention::Fair;
        if fair && !backend.supports_fair() {
            return Err(Error::config(format!(
                "fair mode is not supported by the backend {:?}: it cannot order waiting \
                 instances (Redlock's independent nodes share no queue); use a Redis or \
                 memory backend, or Contention::Coalesced",
                backend
            )));
        }
        if self.hold_limit.is_some_and(|d| d.is_zero()) {
            return Err(Error::config(
                "hold_limit is zero; leave it unset for no limit",
            ));
        }
        let lease_cache = self.lease_cache(fair)?;
        Ok(Config {
            fair,
            lease_ttl: ttl,
            wait_timeout: self.wait_timeout,
            renew_every,
            handoff: self.handoff,
            min_validity,
            max_waiters: self.max_waiters,
            coalescing: self.contention != Contention::PerTask,
            lease_cache,
            on_loss: self.on_loss,
            hold_limit: self.hold_limit,
        })
    }

    /// How long a released lease is cached: the setting, or its default where
    /// caching applies (handoff on, [`Contention::Coalesced`]) and zero elsewhere;
    /// an error for a non-zero setting where caching does not apply.
    fn lease_cache(&self, fair: bool) -> Result<Duration> {
        let applies = self.handoff.enabled && self.contention == Contention::Coalesced;
        match self.lease_cache {
            None if applies => Ok(DEFAULT_LEASE_CACHE),
            None => Ok(Duration::ZERO),
            Some(d) if d.is_zero() || applies => Ok(d),
            Some(d) => {
                let why = if !self.handoff.enabled {
                    "a cached lease is taken under the handoff budget, and handoff is disabled"
                } else if fair {
                    "fair mode grants in arrival order, a cached lease would jump the queue"
                } else {
                    "Contention::PerTask has no local slot to keep a lease in"
                };
                Err(Error::config(format!(
                    "cache_leases_for({d:?}): {why}; use Duration::ZERO or leave it unset"
                )))
            }
        }
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
    /// Derived from [`Contention`]: not [`Contention::PerTask`].
    pub(crate) coalescing: bool,
    /// How long a released lease no local task wants is kept (zero: never).
    pub(crate) lease_cache: Duration,
    pub(crate) on_loss: LossPolicy,
    /// Derived from [`Contention`]: [`Contention::Fair`].
    pub(crate) fair: bool,
    /// No lease of this locker is valid longer than this after its grant.
    pub(crate) hold_limit: Option<Duration>,
}

/// Checks that `ttl` is within [`MIN_LEASE_TTL`] and [`MAX_LEASE_TTL`].
pub(crate) fn ttl_in_bounds(ttl: Duration) -> std::result::Result<(), String> {
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
    ) -> Result<Option<Duration>> {
        if self.lease_ttl.is_some() {
            return Err(Error::config(format!(
                "{call}({key}): a per-call lease TTL is for the exclusive lock only"
            )));
        }
        Ok((!self.try_only).then(|| self.wait_timeout.unwrap_or(default_wait)))
    }
}
