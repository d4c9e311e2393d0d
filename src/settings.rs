//! The settings every lock kind of a [`Locker`](crate::Locker) reads: the
//! validated [`Config`], and the public parts of it that users build, [`Handoff`]
//! and [`LossPolicy`] (re-exported at the crate root). The builder that checks
//! them lives with the locker ([`LockerBuilder`](crate::LockerBuilder)).

use std::time::Duration;

/// Local lease handoff settings; see [`LockerBuilder::handoff`](crate::LockerBuilder::handoff). **On by default**
/// ([`Handoff::enabled`] with the default budget).
///
/// With handoff on, a holder that releases while another local task waits for the
/// same key passes the still-valid lease to that task in memory: no backend request
/// at all. The budget bounds how long one process keeps a lease this way, so other
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
///   empty, which every acquire, extend and release reports) a lease serves at most
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
}
