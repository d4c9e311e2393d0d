//! What every lock kind of a [`Locker`](crate::Locker) runs on: the backend, the
//! validated settings, the counters, the renewal watchdog and the count of the
//! lease work running in the background.
//!
//! The exclusive lock ([`locker`](crate::locker)), the read-write locks
//! ([`rwlock`](crate::rwlock)) and the semaphores ([`semaphore`](crate::semaphore))
//! each keep their own per-key state next to one shared [`Engine`], so none of
//! them depends on another, nor on the `Locker` handle above them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::lease::Lease;
use crate::lease::renewal::Renewals;
use crate::settings::Config;
use crate::stats::StatsInner;

/// The backend and the machinery every lock kind of one locker shares.
pub(crate) struct Engine {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) config: Config,
    pub(crate) stats: Arc<StatsInner>,
    pub(crate) renewals: Arc<Renewals>,
    /// The lease work of every kind running in background tasks.
    pub(crate) background: Arc<BackgroundWork>,
}

impl Engine {
    /// An engine over `backend` with the validated `config`: fresh counters and a
    /// renewal watchdog (started with the first lease it watches).
    pub(crate) fn new(backend: Arc<dyn LockBackend>, config: Config) -> Engine {
        let stats = Arc::<StatsInner>::default();
        let renewals = Arc::new(
            Renewals::new(Arc::clone(&backend), config.renew_every, Arc::clone(&stats))
                .with_hold_limit(config.hold_limit),
        );
        Engine {
            backend,
            config,
            stats,
            renewals,
            background: Arc::default(),
        }
    }
}

/// While other instances wait for a key, a lease serves at most this many handoffs
/// per local task that was waiting when it was taken...
const TURNS_PER_LOCAL_WAITER: u32 = 2;
/// ...but at least this many (within the halved budget), so a process with one or
/// two busy tasks still pays about one backend round trip pair per eight sections.
const MIN_TURNS_WHILE_OTHERS_WAIT: u32 = 8;

impl Engine {
    /// Whether `lease` may go to a local waiter instead of back to the backend: the
    /// handoff budget ([`Handoff`](crate::Handoff)), the same for a mutex lease and
    /// a semaphore permit.
    pub(crate) fn may_hand_off(&self, lease: &Lease) -> bool {
        self.may_hand_off_at(lease, Instant::now())
    }

    /// [`may_hand_off`](Self::may_hand_off), judged at `now`: a reading of the
    /// clock taken in the same synchronous step (no `.await` since), so that the
    /// lease's validity is never judged on an older one.
    pub(crate) fn may_hand_off_at(&self, lease: &Lease, now: Instant) -> bool {
        let h = &self.config.handoff;
        if !h.enabled {
            return false;
        }
        if lease
            .left_at(now)
            .is_none_or(|left| left < self.min_validity(lease))
        {
            return false;
        }
        let waiting = lease.waiting.load(Ordering::Relaxed);
        if self.config.fair && waiting > 0 && lease.arrival_bound().is_none() {
            // Fair, others wait, and the backend did not say when they arrived.
            return false;
        }
        let (max_n, max_hold) = self.budget(lease);
        lease.handoffs.load(Ordering::Relaxed) < max_n
            && now.saturating_duration_since(lease.acquired_at) < max_hold
    }

    /// The validity a lease must have left to be handed on: the locker's
    /// `min_validity`, or, for a lease taken from a grant whose first renewal has
    /// not come back yet, half the grant's window if that is less (its validity
    /// counts the window, not a TTL, until that renewal; see "The grant" in
    /// ARCHITECTURE.md).
    fn min_validity(&self, lease: &Lease) -> Duration {
        match lease.grant_window() {
            Some(window) if lease.renewed.load(Ordering::Relaxed) == 0 => {
                self.config.min_validity.min(window / 2)
            }
            _ => self.config.min_validity,
        }
    }

    /// The most handoffs and the longest hold of `lease`'s budget, as things stand.
    fn budget(&self, lease: &Lease) -> (u32, Duration) {
        let h = &self.config.handoff;
        if lease.waiting.load(Ordering::Relaxed) > 0 {
            // Other instances wait: two turns per local task that was waiting when
            // the lease was taken (at least eight), within half the budget.
            let found = lease.found_waiting.load(Ordering::Relaxed);
            let turns = found
                .saturating_mul(TURNS_PER_LOCAL_WAITER)
                .max(MIN_TURNS_WHILE_OTHERS_WAIT);
            (h.max_consecutive.div_ceil(2).min(turns), h.max_hold / 2)
        } else {
            (h.max_consecutive, h.max_hold)
        }
    }

    /// When an idle `lease` stops being one that [`may_hand_off`](Self::may_hand_off)
    /// by time alone: at the end of its budget's hold, or `min_validity` before the
    /// hold limit ends its validity. A cached lease is released then at the latest.
    pub(crate) fn hand_off_ends(&self, lease: &Lease) -> Instant {
        let (_, max_hold) = self.budget(lease);
        let budget = deadline_after(lease.acquired_at, max_hold);
        match lease.hold_until() {
            Some(end) => budget.min(
                end.checked_sub(self.config.min_validity)
                    .unwrap_or(lease.acquired_at),
            ),
            None => budget,
        }
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.backend)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// `start + wait`, or a far future when that overflows (a wait of `Duration::MAX`
/// waits as long as it takes, like [`tokio::time::sleep`]).
pub(crate) fn deadline_after(start: Instant, wait: Duration) -> Instant {
    start
        .checked_add(wait)
        .unwrap_or_else(|| start + Duration::from_secs(86_400 * 365 * 30))
}

/// The lease work of one locker's lock kinds running in background tasks: the
/// releases of dropped guards and permits, of cached leases, and the cleanups of
/// abandoned acquires. [`Locker::shutdown`](crate::Locker::shutdown) and the last
/// `Locker`'s drop wait for it.
#[derive(Debug, Default)]
pub(crate) struct BackgroundWork {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One piece of background work under way; dropped when its task ends or is
/// dropped.
pub(crate) struct UnderWay(Arc<BackgroundWork>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl BackgroundWork {
    /// Counts a piece of background work until the result is dropped.
    pub(crate) fn under_way(self: &Arc<Self>) -> UnderWay {
        self.count.fetch_add(1, Ordering::AcqRel);
        UnderWay(Arc::clone(self))
    }

    /// Whether no background work is under way now.
    pub(crate) fn is_idle(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    /// Resolves once no background work is under way.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Registered before the check: work that ends in between wakes it.
            notified.as_mut().enable();
            if self.is_idle() {
                return;
            }
            notified.await;
        }
    }
}

impl Engine {
    /// Runs lease work (a backend release, an abandoned acquire's cleanup) in a
    /// task on the current runtime, counted in [`background`](Self::background)
    /// from now until the task ends or is dropped. Every kind's background
    /// releases and cleanups go through here, so that the last `Locker` and
    /// `shutdown` wait for them (a cached lease's linger task counts itself once
    /// its linger ends). Without a runtime `work` is dropped unrun
    /// ([`runtime::spawn`](crate::runtime::spawn)): what it owns settles in its
    /// `Drop` (the lease then expires at its TTL).
    pub(crate) fn spawn_background<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // Counted from now (a `shutdown` right after this waits for it); dropped
        // unrun, the count goes with it.
        let under_way = self.background.under_way();
        crate::runtime::spawn(async move {
            let _under_way = under_way;
            work.await;
        });
    }
}
