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
use crate::settings::{self, Handoff, LossPolicy, Settings};

/// Settings of a [`Locker`]; see [`Locker::builder`].
#[must_use]
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

    /// Local lease handoff (default [`Handoff::enabled`] with the default budget:
    /// 64 handoffs or 250 ms per lease; while other instances wait, half of that
    /// and at most two handoffs per local task that was waiting when the lease was
    /// taken (at least eight); see [`Handoff`] for why this is safe and fair).
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

    /// Per-process coalescing (default **on**).
    ///
    /// On, one task per key and process talks to the backend and the others wait
    /// in a local FIFO (and get the lease by handoff). Off, every task of the
    /// process asks the backend on its own, as a separate client would: there is
    /// no local queue and no handoff; a wake-up for the instance wakes one of its
    /// tasks waiting for the key, and a task that stops waiting passes the wake-up
    /// on, so the process does not stampede the backend at each release (about two
    /// acquire requests per critical section when its tasks take turns, against
    /// about 0.1 with coalescing and handoff on a hot key).
    ///
    /// Every guarantee is the same either way (exclusion, fencing, loss, truthful
    /// releases, cancel safety; the conformance tests run both); what changes is
    /// the cost and the order: off, the backend decides which of the process's
    /// tasks goes next. Keep it on unless a process has at most one task per key at
    /// a time, or its tasks must compete at the backend independently (for example
    /// to measure what coalescing saves, as the benchmarks do). Fair mode needs it
    /// on.
    ///
    /// ```
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).coalescing(false).build()?;
    /// # let _ = locker;
    /// # Ok::<(), lockflight::Error>(())
    /// ```
    pub fn coalescing(mut self, on: bool) -> Self {
        self.settings.coalescing = on;
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
    ///   [`try_lock`](Locker::try_lock) and [`LockOptions::try_only`](crate::LockOptions::try_only) answer busy
    ///   when an earlier task of another instance waits.
    /// * **Handoff only in order.** A lease is handed to a local waiter (within the
    ///   [`Handoff`] budget) only if that waiter arrived before every waiting task
    ///   of every other instance: the acquire's reply says how long ago the
    ///   earliest of them arrived (Redis; with nobody else waiting, any task that
    ///   arrived before the acquire was sent qualifies, since later remote tasks
    ///   come after it). A backend that does not report it (memory) hands off
    ///   only while no other instance waits. Otherwise the lease is released
    ///   through the backend, which wakes the earliest instance (maybe this one
    ///   again). Within an instance tasks are served FIFO.
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
    /// **Cost.** A critical section goes through the backend (an acquire and a
    /// release, plus the re-asks of waiting instances) whenever a task of another
    /// instance arrived before the next local one: with one task per instance,
    /// about 3 backend round trips per critical section in both modes; with 4
    /// instances × 64 tasks on one hot key, each instance serves the tasks that
    /// arrived before the other instances' earliest by handoff, about 0.08 round
    /// trips per critical section (the default mode: 0.09). Inside the scripts fair mode adds a few O(log n) sorted
    /// set commands when the queue is not empty; an uncontended lock costs exactly
    /// what it costs in the default mode.
    ///
    /// The backend must support it ([`LockBackend::supports_fair`]): Redis and
    /// memory do; [`Locker::builder`] over Redlock (whose independent nodes have no
    /// common queue to order by) fails to build with [`Error::InvalidConfig`](crate::Error::InvalidConfig).
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
        self.settings.fair = on;
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
    /// `hold_limit`, or fair mode over a backend without it (Redlock) or without
    /// coalescing.
    pub fn build(self) -> Result<Locker> {
        let config = self.settings.validate(&*self.backend)?;
        let shared = LockerState::new(Engine::new(self.backend, config));
        Ok(Locker::from_state(shared))
    }
}
