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
//!
//! # The fence
//!
//! A lease's fence (the key its fencing epochs are minted from) outlives the lease
//! by far: a renewal that re-arms it keeps it alive at least
//! [`RenewItem::FENCE_TTL_FACTOR`] (10) × its TTL from the moment it runs. So the
//! watchdog asks for the fence ([`RenewItem::fence_due`]) only at a lease's first
//! renewal (whether its grant armed the fence is not known here) and then once half
//! of that time has passed since the send of the renewal that last re-armed it
//! (`fence_half_life`); the renewals between leave the fence's TTL as it is.
//!
//! **The fence never expires under a live lease.** Say the renewal that last
//! re-armed the fence was sent at `f` with TTL `T`: it ran at the server at `f` or
//! later, so the fence lives until at least `f + 10 T`. Every later renewal that
//! skips the fence was sent at some `s < f + 5 T`, with a TTL `t ≤ T` (a renewal's
//! TTL only shrinks, towards the hold limit), so the lock it re-arms ends by
//! `r + t`, where `r` is when it ran. The holder counts the lease valid until
//! `s + t − drift < f + 6 T` at most, well before `f + 10 T`; at the server the
//! lock outlives the fence only if the renewal ran more than `4 T` after it was
//! sent, long after its holder stopped counting it valid (a renewal re-arming the
//! fence every time would keep the fence `10 T` past such a late run). A renewal
//! that fails leaves the fence due: the retry asks for it again.

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

/// A lease the watchdog renews, with when its fence is due again (`None`: at its
/// next renewal; see "The fence" in the module docs).
#[derive(Clone)]
struct Watched {
    lease: Arc<Lease>,
    fence_due: Option<Instant>,
}

impl Watched {
    /// Whether a renewal sent at `sent_at` re-arms the fence.
    fn fence_due_at(&self, sent_at: Instant) -> bool {
        self.fence_due.is_none_or(|due| sent_at >= due)
    }
}

/// The held leases of one locker, with the time each is due for renewal.
pub(crate) struct Renewals {
    held: Mutex<Vec<(Instant, Watched)>>,
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

    fn lock(&self) -> MutexGuard<'_, Vec<(Instant, Watched)>> {
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
        // Whether the grant armed the fence (a read lease's does not) is not known
        // here: the first renewal re-arms it.
        let watched = Watched {
            lease: Arc::clone(lease),
            fence_due: None,
        };
        self.schedule(&watched, sent_at + self.every);
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
            leases: vec![Watched {
                lease: Arc::clone(lease),
                fence_due: None,
            }],
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
    fn schedule(&self, watched: &Watched, due: Instant) {
        let mut held = self.lock();
        if watched.lease.is_stopped() {
            return;
        }
        watched
            .lease
            .renewal_index
            .store(held.len(), Ordering::Relaxed);
        held.push((due, watched.clone()));
    }

    /// Takes the entry at `index` out of the set (the caller holds the lock).
    fn take(held: &mut Vec<(Instant, Watched)>, index: usize) -> Watched {
        let (_, watched) = held.swap_remove(index);
        watched
            .lease
            .renewal_index
            .store(NOT_QUEUED, Ordering::Relaxed);
        if let Some((_, moved)) = held.get(index) {
            moved.lease.renewal_index.store(index, Ordering::Relaxed);
        }
        watched
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
    fn due(&self, now: Instant) -> Vec<Watched> {
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
    leases: Vec<Watched>,
}

impl Drop for Requeue {
    fn drop(&mut self) {
        let now = Instant::now();
        for watched in self.leases.drain(..) {
            self.renewals.schedule(&watched, now);
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
        requeue.leases.retain(|Watched { lease, .. }| {
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
        let leases: Vec<Arc<Lease>> = pending.iter().map(|w| Arc::clone(&w.lease)).collect();
        let items: Vec<RenewItem<'_>> = pending
            .iter()
            .zip(&leases)
            .map(|(watched, lease)| {
                RenewItem::new(
                    lease.kind,
                    &lease.key,
                    lease.token,
                    renewal_ttl(lease, sent_at),
                )
                .with_fence_due(watched.fence_due_at(sent_at))
            })
            .collect();
        let Some(outcomes) = await_batch(renewals.backend.renew_batch(&items), &leases).await
        else {
            // Every lease lost or released meanwhile.
            requeue.leases.clear();
            return;
        };
        let mut failed = Vec::new();
        for ((mut watched, item), outcome) in pending.into_iter().zip(&items).zip(outcomes) {
            if matches!(outcome, Ok(Renewal::Renewed { .. })) && item.fence_due {
                watched.fence_due = Some(sent_at + fence_half_life(item.ttl));
            }
            if let Settled::Retry = settle(&renewals, &watched, sent_at, outcome) {
                failed.push(watched);
            }
        }
        requeue.leases = failed;
        let Some(first_end) = requeue.leases.iter().map(|w| w.lease.valid_until()).min() else {
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

/// When a fence re-armed by a renewal of `ttl` is due again: when half of the
/// time it is kept alive for (at least [`RenewItem::FENCE_TTL_FACTOR`] × `ttl`)
/// has passed.
fn fence_half_life(ttl: Duration) -> Duration {
    ttl.saturating_mul(RenewItem::FENCE_TTL_FACTOR) / 2
}

/// Applies one lease's renewal outcome, from a call sent at `sent_at`.
fn settle(
    renewals: &Arc<Renewals>,
    watched: &Watched,
    sent_at: Instant,
    outcome: Result<Renewal>,
) -> Settled {
    let lease = &watched.lease;
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
                renewals.schedule(watched, sent_at + renewals.every);
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
            let watched = Watched {
                lease: Arc::clone(l),
                fence_due: None,
            };
            r.schedule(&watched, Instant::now() + Duration::from_secs(1));
        }
        r.forget(&leases[1]);
        r.forget(&leases[4]);
        r.forget(&leases[1]); // twice is harmless
        let left: Vec<u64> = r.lock().iter().map(|(_, w)| w.lease.epoch).collect();
        assert_eq!(left.len(), 3);
        for (i, (_, w)) in r.lock().iter().enumerate() {
            assert_eq!(w.lease.renewal_index.load(Ordering::Relaxed), i);
        }
        assert!(r.due(Instant::now()).is_empty());
        let due = r.due(Instant::now() + Duration::from_secs(1));
        let mut epochs: Vec<u64> = due.iter().map(|w| w.lease.epoch).collect();
        epochs.sort();
        assert_eq!(epochs, vec![0, 2, 3]);
        assert!(r.lock().is_empty());
        // A released lease is never put back.
        r.forget(&leases[0]);
        let released = Watched {
            lease: Arc::clone(&leases[0]),
            fence_due: None,
        };
        r.schedule(&released, Instant::now());
        assert!(r.lock().is_empty());
    }
}
