//! Cheap, monotonic counters.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a [`Locker`](crate::Locker)'s counters (monotonic since it was built).
///
/// Backend requests (one round trip each) are `acquire_attempts + releases +
/// renew_attempts + leaves`.
///
/// With the `metrics` feature every counter is also exported through the
/// `metrics` facade as `lockflight_<field>_total` (e.g.
/// `lockflight_acquire_attempts_total`), and three histograms help size
/// `lease_ttl` and `wait_timeout` from the tail of real hold and wait times, for
/// every member of the lock family. Their one label, `kind`, says what was held:
/// `lock` (the exclusive lock), `read` or `write` (a read-write lock), `permit`
/// (a semaphore); no key label, which would make the cardinality unbounded:
///
/// | name | unit | recorded |
/// |---|---|---|
/// | `lockflight_wait_seconds` | seconds | when a call is granted the lock: time since it asked |
/// | `lockflight_hold_seconds` | seconds | when a holder releases (or drops) its guard: time since its grant |
/// | `lockflight_lease_renewals` | renewals | when a lease is finally released: how often it was renewed |
///
/// Subtract two snapshots to measure an interval:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use lockflight::{Locker, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let before = locker.stats();
/// locker.lock("k").await?.release().await?;
/// let delta = locker.stats() - before;
/// assert_eq!((delta.acquire_attempts, delta.acquired, delta.releases), (1, 1, 1));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Acquire requests sent to the backend (one round trip each).
    pub acquire_attempts: u64,
    /// Leases obtained from the backend.
    pub acquired: u64,
    /// Calls that waited in the local queue behind another task.
    pub local_waits: u64,
    /// Leases passed to a local waiter without a backend request.
    pub handoffs: u64,
    /// Release requests sent to the backend.
    pub releases: u64,
    /// Renewal requests sent to the backend.
    pub renew_attempts: u64,
    /// Successful renewals.
    pub renewals: u64,
    /// Requests to leave a key's backend queue (a waiter that gave up).
    pub leaves: u64,
    /// Leases lost while held.
    pub leases_lost: u64,
    /// Calls that ended in [`Error::Timeout`](crate::Error::Timeout).
    pub timeouts: u64,
}

impl std::ops::Sub for Stats {
    type Output = Stats;
    fn sub(self, o: Stats) -> Stats {
        Stats {
            acquire_attempts: self.acquire_attempts - o.acquire_attempts,
            acquired: self.acquired - o.acquired,
            local_waits: self.local_waits - o.local_waits,
            handoffs: self.handoffs - o.handoffs,
            releases: self.releases - o.releases,
            renew_attempts: self.renew_attempts - o.renew_attempts,
            renewals: self.renewals - o.renewals,
            leaves: self.leaves - o.leaves,
            leases_lost: self.leases_lost - o.leases_lost,
            timeouts: self.timeouts - o.timeouts,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct StatsInner {
    acquire_attempts: AtomicU64,
    acquired: AtomicU64,
    local_waits: AtomicU64,
    handoffs: AtomicU64,
    releases: AtomicU64,
    renew_attempts: AtomicU64,
    renewals: AtomicU64,
    leaves: AtomicU64,
    leases_lost: AtomicU64,
    timeouts: AtomicU64,
}

macro_rules! counter {
    ($($method:ident => $field:ident, $metric:literal;)*) => {
        impl StatsInner {
            $(
                pub(crate) fn $method(&self) {
                    self.$field.fetch_add(1, Ordering::Relaxed);
                    #[cfg(feature = "metrics")]
                    metrics::counter!($metric).increment(1);
                }
            )*

            pub(crate) fn snapshot(&self) -> Stats {
                Stats { $($field: self.$field.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counter! {
    acquire_attempt => acquire_attempts, "lockflight_acquire_attempts_total";
    acquired => acquired, "lockflight_acquired_total";
    local_wait => local_waits, "lockflight_local_waits_total";
    handoff => handoffs, "lockflight_handoffs_total";
    release => releases, "lockflight_releases_total";
    renew_attempt => renew_attempts, "lockflight_renew_attempts_total";
    renewed => renewals, "lockflight_renewals_total";
    left => leaves, "lockflight_leaves_total";
    lost => leases_lost, "lockflight_leases_lost_total";
    timeout => timeouts, "lockflight_timeouts_total";
}
