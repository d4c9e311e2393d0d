//! The watchdog: one task per locker renews every held lease that needs it.
//!
//! # Batches
//!
//! The driver scans the set every `tick` (a quarter of the renewal interval) and
//! hands **all** the leases due in that scan to one spawned batch task, which
//! renews them with one [`LockBackend::renew_batch`] call. The backend decides how
//! to group them: the default makes the per-lease calls concurrently (the memory
//! and Redlock backends); the Redis backend renews up to 500 leases of any kinds per
//! script call, grouped by cluster primary on a Cluster (`backend/redis/renew.rs`;
//! its cost is measured in BENCHMARKS.md).
//!
//! # Why batching keeps every guarantee of a lease renewed alone
//!
//! * **Each lease gets its own answer.** `renew_batch` returns one result per
//!   lease, the one its own renewal would return (the Redis batch script runs the
//!   single renewals' own functions per lease), and each is applied to its lease
//!   alone (`settle`): renewed (validity `sent_at + ttl − drift`, clamped to the
//!   hold limit, due again `sent_at + every`), "not the owner" or `READONLY` (lost
//!   at once), another error (retried).
//! * **Drift counts from the send.** `sent_at` is taken before the batch call is
//!   made, so it is never later than the moment any of its scripts ran.
//! * **Loss at `valid_until`, not when a slow reply comes.** While a call is in
//!   flight, the batch task wakes at the earliest validity end among its leases and
//!   signals each lease whose validity ended (`await_batch`); a reply that comes
//!   back later cannot revive a lease (`is_lost` is checked before the validity
//!   moves). The hold limit is checked before every attempt.
//! * **Retries are per lease.** A lease whose renewal failed (a connection error
//!   fails every lease of its call) is retried after `every / 4` (5–250 ms) or at
//!   once when its validity ends, until it ends;
//!   only the leases that failed are in the retry call.
//! * **A released lease is never renewed.** `forget` stops the lease; a stopped
//!   lease is dropped before each attempt, its answer ignored, and `schedule`
//!   refuses to put it back, under the set's mutex. A renewal sent just before the
//!   release is harmless: the renewal and release
//!   scripts compare the token, so whichever runs second changes nothing or
//!   deletes.
//! * **A slow batch does not delay the next scan.** The batch runs on its own task;
//!   its leases are out of the set meanwhile (never renewed twice at once), and
//!   leases due later go into later batches.
//! * **Runtime shutdown.** A batch task dropped before it settled its leases puts
//!   them back in the set, due at once (`Requeue`), for the next driver.
//!
//! The cost: the leases of one call share its fate (a call that times out is
//! retried for all of them); in exchange one task and one timer serve a whole
//! scan.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::{HOLD_LIMIT_REACHED, Lease, drift};
use crate::backend::schedule::tick;
use crate::backend::{LockBackend, RenewItem, Renewal};
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

    /// Starts watching a lease whose acquire was sent at `sent_at`: renewing it,
    /// and registering it with the backend's takeovers
    /// ([`Signals::take_over`](crate::backend::Signals::take_over)),
    /// until [`forget`](Self::forget). Must be called within a Tokio runtime
    /// (acquisitions are).
    pub(crate) fn watch(self: &Arc<Self>, lease: &Arc<Lease>, sent_at: Instant) {
        lease.register(self.backend.signals());
        self.ensure_driver();
        self.schedule(lease, sent_at + self.every);
    }

    /// [`watch`](Self::watch), for a lease whose first renewal is due at `due`,
    /// sooner than the scan would find it (a grant's short window): a task of its
    /// own renews it then, on the same path as a scan's batch, which puts it back
    /// in the set on the usual interval.
    pub(crate) fn watch_soon(self: &Arc<Self>, lease: &Arc<Lease>, due: Instant) {
        lease.register(self.backend.signals());
        self.ensure_driver();
        let requeue = Requeue {
            renewals: Arc::clone(self),
            leases: vec![Arc::clone(lease)],
        };
        let first = async move {
            tokio::time::sleep_until(due).await;
            renew_batch(requeue).await;
        };
        if crate::runtime::spawn(first).is_none() {
            // No runtime: the scan renews it (the requeue went back in the set).
            tracing::debug!(key = %lease.key, "no runtime for a grant's first renewal");
        }
    }

    /// Starts the scanning task on the current runtime unless one is running.
    fn ensure_driver(self: &Arc<Self>) {
        let mut driver = self.driver.lock().unwrap_or_else(|e| e.into_inner());
        if driver.as_ref().is_some_and(|d| !d.is_finished()) {
            return;
        }
        if let Some(task) = crate::runtime::spawn(drive(Arc::downgrade(self), self.tick())) {
            *driver = Some(task.abort_handle());
        }
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

    /// The lease is finally released: stop renewing it, and end its registration
    /// for takeovers.
    pub(crate) fn forget(&self, lease: &Lease) {
        lease.stop();
        lease.unregister();
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

/// Scans the set every `tick` and hands the leases due in each scan to one batch
/// task, until the locker is dropped (or the runtime it runs on shuts down).
async fn drive(renewals: Weak<Renewals>, tick: Duration) {
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(this) = renewals.upgrade() else {
            return;
        };
        let due = this.due(Instant::now());
        if !due.is_empty() {
            tokio::spawn(renew_batch(Requeue {
                renewals: Arc::clone(&this),
                leases: due,
            }));
        }
    }
}

/// Leases taken out of the set for renewal and not settled yet. If the batch task
/// is dropped before it settles them (its runtime shut down), they go back into the
/// set, due at once, so the next driver renews them.
struct Requeue {
    renewals: Arc<Renewals>,
    leases: Vec<Arc<Lease>>,
}

impl Drop for Requeue {
    fn drop(&mut self) {
        let now = Instant::now();
        for lease in self.leases.drain(..) {
            self.renewals.schedule(&lease, now);
        }
    }
}

/// How one lease's renewal attempt ended.
enum Settled {
    /// Renewed and back in the set, lost, or released: nothing more to do.
    Done,
    /// Failed: try again after the retry delay, until its validity ends.
    Retry,
}

/// Renews the leases of one scan with one [`LockBackend::renew_batch`] call,
/// retrying the leases whose renewal failed (each, as alone, every `retry` until
/// its validity ends), then puts each back in the set — or signals its loss.
async fn renew_batch(mut requeue: Requeue) {
    let renewals = Arc::clone(&requeue.renewals);
    let retry = (renewals.every / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    loop {
        // Settle what needs no call: released, at the hold limit, past validity.
        requeue.leases.retain(|lease| {
            if lease.is_stopped() {
                return false;
            }
            if lease.hold_ended() {
                lease.mark_lost(HOLD_LIMIT_REACHED);
                return false;
            }
            // Past its validity: signalled here (hold limit or validity ended).
            !lease.is_lost()
        });
        if requeue.leases.is_empty() {
            return;
        }
        let pending = requeue.leases.clone();
        let sent_at = Instant::now();
        for _ in &pending {
            renewals.stats.renew_attempt();
        }
        let items: Vec<RenewItem<'_>> = pending
            .iter()
            .map(|lease| {
                RenewItem::new(
                    lease.kind,
                    &lease.key,
                    lease.token,
                    renewal_ttl(lease, sent_at),
                )
            })
            .collect();
        let Some(outcomes) = await_batch(renewals.backend.renew_batch(&items), &pending).await
        else {
            // Every lease lost or released meanwhile.
            requeue.leases.clear();
            return;
        };
        let mut failed = Vec::new();
        for (lease, outcome) in pending.into_iter().zip(outcomes) {
            if let Settled::Retry = settle(&renewals, &lease, sent_at, outcome) {
                failed.push(lease);
            }
        }
        requeue.leases = failed;
        let Some(first_end) = requeue.leases.iter().map(|l| l.valid_until()).min() else {
            return;
        };
        // As alone: the next attempt after `retry`, or at once at a validity's end
        // (which the top of the loop signals).
        tokio::time::sleep_until(first_end.min(Instant::now() + retry)).await;
    }
}

/// Waits for a batch call while signalling the loss of each of `leases` whose
/// validity ends before the reply (as the per-lease watchdog did: loss is signalled
/// at `valid_until`, not when a slow reply comes). `None` once every lease is lost
/// or released: the reply would change nothing.
async fn await_batch<F>(call: F, leases: &[Arc<Lease>]) -> Option<Vec<Result<Renewal>>>
where
    F: std::future::Future<Output = Vec<Result<Renewal>>>,
{
    tokio::pin!(call);
    loop {
        let next_end = leases
            .iter()
            .filter(|l| !l.signalled() && !l.is_stopped())
            .map(|l| l.valid_until())
            .min()?;
        tokio::select! {
            biased;
            outcomes = &mut call => return Some(outcomes),
            _ = tokio::time::sleep_until(next_end) => {
                for lease in leases {
                    // Signals the loss of each lease whose validity has ended.
                    lease.is_lost();
                }
            }
        }
    }
}

/// The TTL a renewal sent at `sent_at` asks for: the lease's, but never past its
/// hold limit (plus the drift allowance, so the server holds it at least as long
/// as its holder believes it valid): a lease at its hold limit ends at the server
/// then too, not a TTL later.
fn renewal_ttl(lease: &Lease, sent_at: Instant) -> Duration {
    match lease.hold_until() {
        Some(end) => {
            let left = end.saturating_duration_since(sent_at);
            lease.ttl.min(left + drift(left))
        }
        None => lease.ttl,
    }
}

/// Applies one lease's renewal outcome, from a call sent at `sent_at`.
fn settle(
    renewals: &Arc<Renewals>,
    lease: &Arc<Lease>,
    sent_at: Instant,
    outcome: Result<Renewal>,
) -> Settled {
    if lease.is_stopped() {
        // Released while the call was in flight: nothing to keep or signal.
        return Settled::Done;
    }
    let stats = &renewals.stats;
    match outcome {
        Ok(Renewal::Renewed { waiting }) => {
            stats.renewed();
            lease.renewed.fetch_add(1, Ordering::Relaxed);
            lease.waiting.store(waiting, Ordering::Relaxed);
            // A reply that came back after the old validity ended cannot revive
            // the lease: every observer may already have seen it lost.
            if !lease.is_lost() {
                lease.set_valid_until(sent_at + lease.ttl.saturating_sub(drift(lease.ttl)));
                renewals.schedule(lease, sent_at + renewals.every);
            }
            Settled::Done
        }
        Ok(Renewal::NotOwner) => {
            lease.mark_lost("the backend reports the lock is no longer ours");
            Settled::Done
        }
        Err(e @ Error::Refused { .. }) if is_read_only(&e) => {
            lease.mark_lost(format!(
                "the node refused the renewal as a read-only replica (demoted): {e}"
            ));
            Settled::Done
        }
        Err(e) => {
            tracing::debug!(key = %lease.key, error = %e, "renewal failed; retrying");
            Settled::Retry
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
