//! [`LockerBuilder`]: the setters of a [`Locker`](super::Locker)'s settings. The
//! settings themselves, their defaults and their validation live in
//! `crate::settings`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Locker, LockerState};
use crate::backend::LockBackend;
use crate::error::Result;
use crate::lease::engine::Engine;
use crate::settings::{self, Contention, Handoff, LossPolicy, Settings};

/// Settings of a [`Locker`]; see [`Locker::builder`]. A clone shares the backend
/// (lockers built from clones are one instance of it) and copies the settings.
#[must_use]
#[derive(Clone)]
pub struct LockerBuilder {
    pub(super) backend: Arc<dyn LockBackend>,
    pub(super) settings: Settings,
}

impl fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockerBuilder")
            .field("backend", &self.backend)
            .field("settings", &self.settings)
            .finish()
    }
}

impl LockerBuilder {
    /// Default lease TTL.
    pub const DEFAULT_LEASE_TTL: Duration = settings::DEFAULT_LEASE_TTL;
    /// Default bound on [`Locker::lock`].
    pub const DEFAULT_WAIT_TIMEOUT: Duration = settings::DEFAULT_WAIT_TIMEOUT;
    /// Default bound on local waiters per key.
    pub const DEFAULT_MAX_WAITERS: usize = settings::DEFAULT_MAX_WAITERS;
    /// The shortest lease TTL accepted.
    pub const MIN_LEASE_TTL: Duration = settings::MIN_LEASE_TTL;
    /// The longest lease TTL accepted (30 days): longer ones overflow clocks and
    /// Redis expiry arithmetic, and a lock nobody can take for a month is a bug.
    pub const MAX_LEASE_TTL: Duration = settings::MAX_LEASE_TTL;
    /// Default of [`cache_leases_for`](Self::cache_leases_for) where caching applies.
    pub const DEFAULT_LEASE_CACHE: Duration = settings::DEFAULT_LEASE_CACHE;

    /// How long a lease lives without renewal (default 30 s, at least 100 ms). The
    /// watchdog renews it every third of that while it is held.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lease_ttl = ttl;
        self
    }

    /// How long [`Locker::lock`] waits before [`Error::Timeout`](crate::Error::Timeout) (default 5 s).
    /// `Duration::MAX` waits as long as it takes.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.settings.wait_timeout = timeout;
        self
    }

    /// How often the watchdog renews a held lease (default: a third of the TTL).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.settings.renew_every = Some(every);
        self
    }

    /// The local handoff budget (default [`Handoff::enabled`]: 64 handoffs or
    /// 250 ms per lease, halved while other instances wait; see [`Handoff`]).
    /// [`Handoff::disabled`] also makes the default lease caching zero
    /// ([`cache_leases_for`](Self::cache_leases_for)).
    pub fn handoff(mut self, handoff: Handoff) -> Self {
        self.settings.handoff = handoff;
        self
    }

    /// Bound on tasks waiting locally per key (default 10,000); the excess gets
    /// [`Error::Overloaded`](crate::Error::Overloaded) at once.
    pub fn max_waiters(mut self, n: usize) -> Self {
        self.settings.max_waiters = n;
        self
    }

    /// How the tasks of this process contend for a key's exclusive lock (default
    /// [`Contention::Coalesced`]).
    ///
    /// * [`Coalesced`](Contention::Coalesced): one task per key and process asks
    ///   the backend; the others wait in a local FIFO and get the lease by handoff.
    /// * [`Fair`](Contention::Fair): coalesced, and granted (handoff included) in order
    ///   of arrival across the fair lockers of a key: FIFO within an instance, across
    ///   instances up to about one round trip; no barging after a TTL expiry;
    ///   [`try_lock`](Locker::try_lock) answers busy while an earlier task of another
    ///   instance waits; no lease caching.
    /// * [`PerTask`](Contention::PerTask): every task asks the backend on its own, as a
    ///   separate client would; no local queue, handoff or caching; a wake-up for the
    ///   instance wakes one of its waiting tasks.
    ///
    /// Exclusion, fencing, loss signals, truthful releases and cancel safety are the
    /// same in every mode; ARCHITECTURE.md, "The order of requests", says what changes.
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) fails with [`Error::InvalidConfig`](crate::Error::InvalidConfig) for
    /// [`Contention::Fair`] over a backend that cannot order waiting instances
    /// (Redis and memory can, Redlock cannot).
    ///
    /// ```
    /// use lockflight::{Contention, Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).contention(Contention::Fair).build()?;
    /// # let _ = locker;
    /// # Ok::<(), lockflight::Error>(())
    /// ```
    pub fn contention(mut self, contention: Contention) -> Self {
        self.settings.contention = contention;
        self
    }

    /// Lease caching for the exclusive lock: a holder that releases while no local
    /// task waits keeps the lease up to `d` for the next task of this process that
    /// asks for the key, which takes it without a backend request.
    ///
    /// Default [`DEFAULT_LEASE_CACHE`](Self::DEFAULT_LEASE_CACHE) (20 ms) with
    /// handoff on and [`Contention::Coalesced`]; zero (off) otherwise.
    /// `Duration::ZERO` turns it off.
    ///
    /// Invariants: a cached lease is taken as a handoff, under the [`Handoff`]
    /// budget and with growing fencing tokens; it stays this process's at the
    /// backend and is renewed; it is kept only for a key locked again within `d`
    /// of its last backend release; it is released at the backend when `d` ends,
    /// when its budget would no longer let it be handed on, when another instance
    /// asks for the key (Redis backend: a revocation), on [`Locker::shutdown`], or
    /// when the last clone of the `Locker` is dropped (waiting at most a second).
    /// A process that exits without either leaves a cached lease to its TTL.
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) fails with [`Error::InvalidConfig`](crate::Error::InvalidConfig)
    /// for a non-zero `d` with [`Handoff::disabled`], [`Contention::Fair`] or
    /// [`Contention::PerTask`], where a lease cannot be cached.
    pub fn cache_leases_for(mut self, d: Duration) -> Self {
        self.settings.lease_cache = Some(d);
        self
    }

    /// The longest any lease of this locker is held (default: no limit): a lease is
    /// not renewed past `limit` after its grant, and is **lost** then — its loss
    /// signal fires, [`Locker::with_lock`] (with [`LossPolicy::Abort`]) drops the
    /// work and returns [`Error::LeaseLost`](crate::Error::LeaseLost), a guard's
    /// release reports the loss. So a stuck or runaway task cannot hold a key
    /// forever: the key is free at the backend once the guard is dropped, or at the
    /// latest one lease TTL after the limit. Every lock kind (mutex, read and write
    /// leases, permits, `lock_many`); a lease handed on to another local task keeps
    /// its original limit, so handoff never extends it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new())
    ///     .hold_limit(Duration::from_secs(60))
    ///     .build()?;
    /// # let _ = locker;
    /// # Ok::<(), lockflight::Error>(())
    /// ```
    pub fn hold_limit(mut self, limit: Duration) -> Self {
        self.settings.hold_limit = Some(limit);
        self
    }

    /// What [`Locker::with_lock`] does on lease loss (default [`LossPolicy::Abort`]).
    pub fn on_loss(mut self, policy: LossPolicy) -> Self {
        self.settings.on_loss = policy;
        self
    }

    /// Validates the settings and builds the locker.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the setting: a TTL under 100 ms or over
    /// [`MAX_LEASE_TTL`](Self::MAX_LEASE_TTL), a zero wait timeout, a renewal
    /// interval that is zero or too slow to renew in time (the interval plus the
    /// watchdog's scan delay must leave at least half of the lease's validity for
    /// the renewal itself), zero `max_waiters`, a handoff budget of zero, or a
    /// handoff `min_validity` not shorter than the lease's validity, a zero
    /// `hold_limit`, [`Contention::Fair`] over a backend without it (Redlock), or a
    /// non-zero [`cache_leases_for`](Self::cache_leases_for) where leases cannot be
    /// cached (handoff disabled, [`Contention::Fair`] or [`Contention::PerTask`]).
    pub fn build(self) -> Result<Locker> {
        let config = self.settings.validate(&*self.backend)?;
        let shared = LockerState::new(Engine::new(self.backend, config));
        Ok(Locker::from_state(shared))
    }
}
