//! The watchdog: one task per locker renews every held lease that needs it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Lease, drift};
use crate::backend::{Extend, LockBackend};
use crate::stats::StatsInner;

const NOT_QUEUED: usize = usize::MAX;

/// The held leases of one locker, with the time each is due for renewal.
pub(crate) struct Renewals {
    held: Mutex<Vec<(Instant, Arc<Lease>)>>,
    backend: Arc<dyn LockBackend>,
    every: Duration,
    stats: Arc<StatsInner>,
    driver: OnceLock<DropGuard>,
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
            driver: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(Instant, Arc<Lease>)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How often the set is scanned: a quarter of the renewal interval, so a renewal
    /// starts at most that late — far ahead of the lease's validity end.
    fn tick(&self) -> Duration {
        (self.every / 4).max(Duration::from_millis(1))
    }

    /// Starts watching a lease whose acquire was sent at `sent_at`. Must be called
    /// within a Tokio runtime (acquisitions are).
    pub(crate) fn watch(self: &Arc<Self>, lease: &Arc<Lease>, sent_at: Instant) {
        self.driver.get_or_init(|| {
            let stop = CancellationToken::new();
            tokio::spawn(drive(Arc::downgrade(self), self.tick(), stop.clone()));
            stop.drop_guard()
        });
        self.schedule(lease, sent_at + self.every);
    }

    /// Puts `lease` (back) in the set, due at `due`, unless it was released.
    fn schedule(&self, lease: &Arc<Lease>, due: Instant) {
        let mut held = self.lock();
        if lease.is_stopped() {
            return;
        }
        lease.slot.store(held.len(), Ordering::Relaxed);
        held.push((due, Arc::clone(lease)));
    }

    /// Takes the entry at `index` out of the set (the caller holds the lock).
    fn take(held: &mut Vec<(Instant, Arc<Lease>)>, index: usize) -> Arc<Lease> {
        let (_, lease) = held.swap_remove(index);
        lease.slot.store(NOT_QUEUED, Ordering::Relaxed);
        if let Some((_, moved)) = held.get(index) {
            moved.slot.store(index, Ordering::Relaxed);
        }
        lease
    }

    /// The lease is finally released: stop renewing it.
    pub(crate) fn forget(&self, lease: &Lease) {
        lease.stop();
        let mut held = self.lock();
        let index = lease.slot.load(Ordering::Relaxed);
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

/// Scans the set every `tick` and hands each due lease to a renewal task, until
/// the locker is dropped.
async fn drive(renewals: Weak<Renewals>, tick: Duration, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let Some(this) = renewals.upgrade() else {
            return;
        };
        for lease in this.due(Instant::now()) {
            tokio::spawn(renew(Arc::clone(&this), lease));
        }
    }
}

/// Renews one due lease, retrying errors until its validity ends, then puts it
/// back in the set — or signals loss.
async fn renew(renewals: Arc<Renewals>, lease: Arc<Lease>) {
    let retry = (renewals.every / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    let stats = &renewals.stats;
    loop {
        let valid_until = lease.valid_until();
        let sent_at = Instant::now();
        stats.renew_attempt();
        let outcome = tokio::select! {
            biased;
            _ = lease.stop.cancelled() => return,
            _ = tokio::time::sleep_until(valid_until) => {
                if lease.mark_lost("its validity ran out before a renewal succeeded") {
                    stats.lost();
                }
                return;
            }
            r = renewals.backend.extend(&lease.key, lease.token, lease.ttl) => r,
        };
        match outcome {
            Ok(Extend::Extended { waiting }) => {
                stats.renewed();
                lease.waiting.store(waiting, Ordering::Relaxed);
                lease.set_valid_until(sent_at + lease.ttl.saturating_sub(drift(lease.ttl)));
                renewals.schedule(&lease, sent_at + renewals.every);
                return;
            }
            Ok(Extend::NotOwner) => {
                if !lease.is_stopped()
                    && lease.mark_lost("the backend reports the lock is no longer ours")
                {
                    stats.lost();
                }
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
            assert_eq!(l.slot.load(Ordering::Relaxed), i);
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
