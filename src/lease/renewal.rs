//! The watchdog: one task per locker renews every held lease that needs it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::{HOLD_LIMIT_REACHED, Lease, LeaseKind, VALIDITY_ENDED, drift};
use crate::backend::{Extend, LockBackend};
use crate::error::{Error, Result};
use crate::stats::StatsInner;

const NOT_QUEUED: usize = usize::MAX;

/// The held leases of one locker, with the time each is due for renewal.
pub(crate) struct Renewals {
    held: Mutex<Vec<(Instant, Arc<Lease>)>>,
    backend: Arc<dyn LockBackend>,
    every: Duration,
    stats: Arc<StatsInner>,
    /// The locker's hold limit: no lease is valid longer than this after its grant.
    hold_limit: Option<Duration>,
    /// The scanning task, on the runtime of the latest `watch` that found none
    /// running: a locker outlives runtimes (a static, repeated `block_on`), so a
    /// driver whose runtime ended is replaced on the next acquisition.
    driver: Mutex<Option<AbortHandle>>,
}

impl Drop for Renewals {
    fn drop(&mut self) {
        if let Some(driver) = self.driver.get_mut().unwrap_or_else(|e| e.into_inner()) {
            driver.abort();
        }
    }
}

impl std::fmt::Debug for Renewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewals")
            .field("every", &self.every)
            .field("held", &self.lock().len())
            .finish()
    }
}

impl Renewals {
    pub(crate) fn new(
        backend: Arc<dyn LockBackend>,
        every: Duration,
        stats: Arc<StatsInner>,
    ) -> Renewals {
        Renewals {
            held: Mutex::new(Vec::new()),
            backend,
            every,
            stats,
            hold_limit: None,
            driver: Mutex::new(None),
        }
    }

    /// With the locker's hold limit: no lease is renewed past it.
    pub(crate) fn with_hold_limit(mut self, limit: Option<Duration>) -> Renewals {
        self.hold_limit = limit;
        self
    }

    /// When a lease granted at `granted_at` must end at the latest.
    pub(crate) fn hold_end(&self, granted_at: Instant) -> Option<Instant> {
        self.hold_limit.map(|limit| granted_at + limit)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(Instant, Arc<Lease>)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How often the set is scanned: a quarter of the renewal interval, so a renewal
    /// starts at most that late (see [`tick`]).
    fn tick(&self) -> Duration {
        tick(self.every)
    }

    /// Starts watching a lease whose acquire was sent at `sent_at`. Must be called
    /// within a Tokio runtime (acquisitions are).
    pub(crate) fn watch(self: &Arc<Self>, lease: &Arc<Lease>, sent_at: Instant) {
        self.ensure_driver();
        self.schedule(lease, sent_at + self.every);
    }

    /// Starts the scanning task on the current runtime unless one is running.
    fn ensure_driver(self: &Arc<Self>) {
        let mut driver = self.driver.lock().unwrap_or_else(|e| e.into_inner());
        if driver.as_ref().is_some_and(|d| !d.is_finished()) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let task = handle.spawn(drive(Arc::downgrade(self), self.tick()));
        *driver = Some(task.abort_handle());
    }

    /// Puts `lease` (back) in the set, due at `due`, unless it was released.
    fn schedule(&self, lease: &Arc<Lease>, due: Instant) {
        let mut held = self.lock();
        if lease.is_stopped() {
            return;
        }
        lease.renewal_index.store(held.len(), Ordering::Relaxed);
        held.push((due, Arc::clone(lease)));
    }

    /// Takes the entry at `index` out of the set (the caller holds the lock).
    fn take(held: &mut Vec<(Instant, Arc<Lease>)>, index: usize) -> Arc<Lease> {
        let (_, lease) = held.swap_remove(index);
        lease.renewal_index.store(NOT_QUEUED, Ordering::Relaxed);
        if let Some((_, moved)) = held.get(index) {
            moved.renewal_index.store(index, Ordering::Relaxed);
        }
        lease
    }

    /// The lease is finally released: stop renewing it.
    pub(crate) fn forget(&self, lease: &Lease) {
        lease.stop();
        let mut held = self.lock();
        let index = lease.renewal_index.load(Ordering::Relaxed);
        if index != NOT_QUEUED {
            Self::take(&mut held, index);
        }
    }

    /// Takes the leases that are due out of the set.
    fn due(&self, now: Instant) -> Vec<Arc<Lease>> {
        let mut held = self.lock();
        let mut due = Vec::new();
        let mut i = 0;
        while i < held.len() {
            if held[i].0 <= now {
                due.push(Self::take(&mut held, i));
            } else {
                i += 1;
            }
        }
        due
    }
}

/// The scan interval for a renewal interval of `every`: a renewal starts at most
/// this late. [`LockerBuilder::build`](crate::LockerBuilder::build) requires
/// `every + tick(every)` to leave half of the lease's validity for the renewal's
/// round trip and retries.
/// Renews `lease` through the backend call for its kind.
async fn extend(backend: &dyn LockBackend, lease: &Lease) -> Result<Extend> {
    let (key, token, ttl) = (&lease.key, lease.token, lease.ttl);
    match lease.kind {
        LeaseKind::Lock => backend.extend(key, token, ttl).await,
        LeaseKind::Read | LeaseKind::Write => match backend.rw() {
            Some(rw) if lease.kind == LeaseKind::Read => rw.extend_read(key, token, ttl).await,
            Some(rw) => rw.extend_write(key, token, ttl).await,
            None => Err(Error::Unsupported {
                key: key.clone(),
                what: "read-write locks",
            }),
        },
        LeaseKind::Permit => match backend.semaphore() {
            Some(sem) => sem.extend_permit(key, token, ttl).await,
            None => Err(Error::Unsupported {
                key: key.clone(),
                what: "semaphores",
            }),
        },
    }
}

pub(crate) fn tick(every: Duration) -> Duration {
    (every / 4).max(Duration::from_millis(1))
}

/// Scans the set every `tick` and hands each due lease to a renewal task, until
/// the locker is dropped (or the runtime it runs on shuts down).
async fn drive(renewals: Weak<Renewals>, tick: Duration) {
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(this) = renewals.upgrade() else {
            return;
        };
        for lease in this.due(Instant::now()) {
            let requeue = Requeue {
                renewals: Arc::clone(&this),
                lease: Some(lease),
            };
            tokio::spawn(renew(requeue));
        }
    }
}

/// A lease taken out of the set for renewal. If the renewal task is dropped before
/// it finishes (its runtime shut down), the lease goes back into the set, due at
/// once, so the next driver renews it.
struct Requeue {
    renewals: Arc<Renewals>,
    lease: Option<Arc<Lease>>,
}

impl Drop for Requeue {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.renewals.schedule(&lease, Instant::now());
        }
    }
}

/// Renews one due lease, retrying errors until its validity ends, then puts it
/// back in the set — or signals loss.
async fn renew(mut requeue: Requeue) {
    let renewals = Arc::clone(&requeue.renewals);
    let lease = requeue.lease.clone().expect("set by drive");
    renew_lease(&renewals, &lease).await;
    // Done: scheduled again, or lost, or released.
    requeue.lease = None;
}

async fn renew_lease(renewals: &Arc<Renewals>, lease: &Arc<Lease>) {
    let retry = (renewals.every / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    let stats = &renewals.stats;
    loop {
        if lease.hold_ended() {
            lease.mark_lost(HOLD_LIMIT_REACHED);
            return;
        }
        let valid_until = lease.valid_until();
        let sent_at = Instant::now();
        stats.renew_attempt();
        let outcome = tokio::select! {
            biased;
            _ = lease.stop.cancelled() => return,
            _ = tokio::time::sleep_until(valid_until) => {
                lease.mark_lost(if lease.hold_ended() { HOLD_LIMIT_REACHED } else { VALIDITY_ENDED });
                return;
            }
            r = extend(&*renewals.backend, lease) => r,
        };
        match outcome {
            Ok(Extend::Extended { waiting }) => {
                stats.renewed();
                lease.renewed.fetch_add(1, Ordering::Relaxed);
                lease.waiting.store(waiting, Ordering::Relaxed);
                // A reply that came back after the old validity ended cannot revive
                // the lease: every observer may already have seen it lost.
                if lease.is_lost() {
                    return;
                }
                lease.set_valid_until(sent_at + lease.ttl.saturating_sub(drift(lease.ttl)));
                renewals.schedule(lease, sent_at + renewals.every);
                return;
            }
            Ok(Extend::NotOwner) => {
                lease.mark_lost("the backend reports the lock is no longer ours");
                return;
            }
            Err(e @ Error::Refused { .. }) if is_read_only(&e) => {
                lease.mark_lost(format!(
                    "the node refused the renewal as a read-only replica (demoted): {e}"
                ));
                return;
            }
            Err(e) => {
                tracing::debug!(key = %lease.key, error = %e, "renewal failed; retrying");
                tokio::select! {
                    biased;
                    _ = lease.stop.cancelled() => return,
                    _ = tokio::time::sleep_until(valid_until) => {}
                    _ = tokio::time::sleep(retry) => {}
                }
            }
        }
    }
}

fn is_read_only(e: &Error) -> bool {
    matches!(e, Error::Refused { code, .. } if code == "READONLY")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LeaseToken;
    use crate::backend::memory::MemoryBackend;
    use crate::key::LockKey;

    fn lease(n: u64) -> Arc<Lease> {
        let ttl = Duration::from_secs(3);
        Arc::new(Lease::new(
            LockKey::from(format!("k{n}")),
            LeaseToken::random(),
            n,
            ttl,
            Instant::now(),
            0,
            Default::default(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn the_set_tracks_indices_through_swap_removes() {
        let r = Arc::new(Renewals::new(
            Arc::new(MemoryBackend::new()),
            Duration::from_secs(1),
            Arc::default(),
        ));
        let leases: Vec<_> = (0..5).map(lease).collect();
        for l in &leases {
            r.schedule(l, Instant::now() + Duration::from_secs(1));
        }
        r.forget(&leases[1]);
        r.forget(&leases[4]);
        r.forget(&leases[1]); // twice is harmless
        let left: Vec<u64> = r.lock().iter().map(|(_, l)| l.epoch).collect();
        assert_eq!(left.len(), 3);
        for (i, (_, l)) in r.lock().iter().enumerate() {
            assert_eq!(l.renewal_index.load(Ordering::Relaxed), i);
        }
        assert!(r.due(Instant::now()).is_empty());
        let due = r.due(Instant::now() + Duration::from_secs(1));
        let mut epochs: Vec<u64> = due.iter().map(|l| l.epoch).collect();
        epochs.sort();
        assert_eq!(epochs, vec![0, 2, 3]);
        assert!(r.lock().is_empty());
        // A released lease is never put back.
        r.forget(&leases[0]);
        r.schedule(&leases[0], Instant::now());
        assert!(r.lock().is_empty());
    }
}
