//! Cheap, monotonic counters, and the number of keys in use.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a [`Locker`](crate::Locker)'s counters (monotonic since it was
/// built) and of its keys in use. Backend requests (one round trip each) are
/// `acquire_attempts + releases + renew_attempts + leaves`.
///
/// With the `metrics` feature every counter is also exported through the `metrics`
/// facade as `lockflight_<field>_total` (e.g. `lockflight_acquire_attempts_total`), with
/// three histograms to size `lease_ttl` and `wait_timeout` from real hold and wait times.
/// Their one label, `kind`, says what was held: `lock`, `read` or `write` (a read-write
/// lock), `permit` (a semaphore); there is no key label.
///
/// | name | unit | recorded |
/// |---|---|---|
/// | `lockflight_wait_seconds` | seconds | when a call is granted the lock: time since it asked |
/// | `lockflight_hold_seconds` | seconds | when a holder releases (or drops) its guard: time since its grant |
/// | `lockflight_lease_renewals` | renewals | when a lease is finally released: how often it was renewed |
///
/// Subtract two snapshots to measure an interval (`later - earlier`; the subtraction
/// saturates, so snapshots in the wrong order give zeros, never a panic):
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
    /// Ticks of scheduled jobs this process ran
    /// ([`Tick::Ran`](crate::job::Tick::Ran)).
    pub jobs_run: u64,
    /// Ticks of scheduled jobs this process skipped because another replica or
    /// task held the job's lock ([`Tick::Skipped`](crate::job::Tick::Skipped)).
    pub jobs_skipped: u64,
    /// Mutex and write leases this process took from a grant message (another
    /// instance's release gave the lock to this process's waiting acquire on the
    /// server), with no request of their own; each is counted in `acquired` too.
    pub grants: u64,
    /// Keys with local state in this process when the snapshot was taken, of
    /// every kind (a holder, a leader, waiters, a cached lease, a semaphore
    /// handle's state). Not a counter: zero once every task is done with its keys,
    /// since per-key state never outlives its use. A difference of snapshots keeps
    /// the later value.
    pub keys_in_use: u64,
}

impl std::ops::Sub for Stats {
    type Output = Stats;

    /// The counts between two snapshots: `later - earlier`, each saturating at
    /// zero (snapshots subtracted in the wrong order give zeros, never a panic);
    /// [`keys_in_use`](Stats::keys_in_use) is the later snapshot's.
    fn sub(self, earlier: Stats) -> Stats {
        Stats {
            acquire_attempts: self
                .acquire_attempts
                .saturating_sub(earlier.acquire_attempts),
            acquired: self.acquired.saturating_sub(earlier.acquired),
            local_waits: self.local_waits.saturating_sub(earlier.local_waits),
            handoffs: self.handoffs.saturating_sub(earlier.handoffs),
            releases: self.releases.saturating_sub(earlier.releases),
            renew_attempts: self.renew_attempts.saturating_sub(earlier.renew_attempts),
            renewals: self.renewals.saturating_sub(earlier.renewals),
            leaves: self.leaves.saturating_sub(earlier.leaves),
            leases_lost: self.leases_lost.saturating_sub(earlier.leases_lost),
            timeouts: self.timeouts.saturating_sub(earlier.timeouts),
            jobs_run: self.jobs_run.saturating_sub(earlier.jobs_run),
            jobs_skipped: self.jobs_skipped.saturating_sub(earlier.jobs_skipped),
            grants: self.grants.saturating_sub(earlier.grants),
            keys_in_use: self.keys_in_use,
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
    jobs_run: AtomicU64,
    jobs_skipped: AtomicU64,
    grants: AtomicU64,
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
                Stats { $($field: self.$field.load(Ordering::Relaxed),)* keys_in_use: 0 }
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
    job_ran => jobs_run, "lockflight_jobs_run_total";
    job_skipped => jobs_skipped, "lockflight_jobs_skipped_total";
    grant_taken => grants, "lockflight_grants_total";
}

#[cfg(test)]
mod tests {
    use super::Stats;

    #[test]
    fn subtraction_is_total_and_keeps_the_later_keys_in_use() {
        let earlier = Stats {
            acquired: 3,
            timeouts: 1,
            keys_in_use: 5,
            ..Stats::default()
        };
        let later = Stats {
            acquired: 7,
            timeouts: 1,
            keys_in_use: 2,
            ..Stats::default()
        };
        let delta = later - earlier;
        assert_eq!(
            (delta.acquired, delta.timeouts, delta.keys_in_use),
            (4, 0, 2)
        );
        // The wrong order gives zeros, not a panic.
        let reversed = earlier - later;
        assert_eq!((reversed.acquired, reversed.keys_in_use), (0, 5));
        assert_eq!(
            Stats::default()
                - Stats {
                    releases: u64::MAX,
                    ..Stats::default()
                },
            Stats::default()
        );
    }
}
