//! The in-process backend: locks in this process's memory.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dashmap::DashMap;
use tokio::time::Instant;

use super::{
    Acquire, LeaseToken, LockBackend, LockKind, RecordFence, RecordState, Released, Renewal,
    Signals, WhenBusy,
};
use crate::error::Result;
use crate::key::LockKey;

mod rw;
mod semaphore;

/// Locks held in this process's memory, with TTLs, fencing epochs and release
/// notifications, and the backend semantics the [`Locker`](crate::Locker)
/// relies on: for a single-instance service, development, and resources that live in
/// one process. Clones share the same locks (each clone is one instance), so
/// [`Locker`](crate::Locker)s built on clones exclude each other.
///
/// How it differs from [`RedisBackend`](crate::RedisBackend):
///
/// * **No queue** by default: waiters are not ordered. In fair mode
///   ([`Contention::Fair`](crate::Contention::Fair)) waiting instances are
///   ordered by arrival as Redis orders them; an entry expires 3 s after its last ask.
/// * **Every watcher is woken** on a release; the others find the lock taken and wait.
/// * **Epochs are floored by this process's wall clock** (µs), one counter per
///   backend: they strictly increase per key while the process runs, a same-token
///   acquire included; a clock set back across a restart can repeat them.
/// * **No release record**: releasing a token twice reports `released: false` the
///   second time.
///
/// Expiry follows Tokio's clock ([`tokio::time::Instant`]), so tests can drive it
/// with `tokio::time::pause`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use lockflight::{Locker, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let guard = locker.lock("sku:555").await?;
/// assert!(locker.try_lock("sku:555").await?.is_none());
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct MemoryBackend {
    inner: Arc<Inner>,
    /// This clone's identity in the fair-mode queues.
    id: u64,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend {
            inner: Arc::default(),
            id: next_id(),
        }
    }
}

impl Clone for MemoryBackend {
    /// Shares the locks; the clone is another instance (its own place in the
    /// fair-mode queues).
    fn clone(&self) -> Self {
        MemoryBackend {
            inner: Arc::clone(&self.inner),
            id: next_id(),
        }
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// How long a fair-mode queue entry lives without being refreshed.
const FAIR_ENTRY_TTL: Duration = Duration::from_secs(3);
/// The longest a fair-mode waiter waits before asking again (a third of the above).
const FAIR_RETRY: Duration = Duration::from_secs(1);

/// A waiting instance in fair mode.
#[derive(Clone, Copy)]
struct Waiting {
    id: u64,
    arrived: Instant,
    expires: Instant,
}

#[derive(Default)]
struct Inner {
    locks: DashMap<LockKey, MemLease>,
    /// Fair mode's queues of waiting instances (lock order: a queue, then a lock).
    queues: DashMap<LockKey, Vec<Waiting>>,
    last_epoch: AtomicU64,
    /// The clock that floors the epochs.
    clock: EpochClock,
    signals: Signals,
    rw: rw::State,
    semaphores: semaphore::State,
    /// The elections' leader records, with their expiry.
    leaders: DashMap<LockKey, (Vec<u8>, Instant)>,
    /// The idempotency records (`fence_record`, `store_record`).
    records: DashMap<LockKey, Record>,
    /// Record writes so far, and the count at which the next sweep of expired
    /// records runs ([`MemoryBackend::sweep_records`]).
    record_writes: AtomicU64,
    next_record_sweep: AtomicU64,
}

/// The fewest record writes between two sweeps of the expired records.
const RECORD_SWEEP_MIN: u64 = 1024;

/// An idempotency record: its fence, the stored response if any, its expiry.
struct Record {
    fence: RecordFence,
    response: Option<Vec<u8>>,
    expires: Instant,
}

/// The clock that floors the epochs a backend mints (`max(last + 1, clock µs)`).
#[derive(Default)]
enum EpochClock {
    /// This process's wall clock, in µs since the Unix epoch.
    #[default]
    Wall,
    /// Tokio's clock, in µs since `zero`: the test kit's server clock, the same
    /// in every run of a test on a paused clock.
    #[cfg(feature = "testing")]
    Virtual { zero: Instant },
}

impl EpochClock {
    fn micros(&self) -> u64 {
        let since = match self {
            EpochClock::Wall => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            #[cfg(feature = "testing")]
            EpochClock::Virtual { zero } => Instant::now().saturating_duration_since(*zero),
        };
        u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
    }
}

#[derive(Clone, Copy)]
struct MemLease {
    token: LeaseToken,
    epoch: u64,
    expires: Instant,
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("locks", &self.inner.locks.len())
            .finish()
    }
}

impl MemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of lock entries currently stored (expired ones are dropped lazily).
    pub fn len(&self) -> usize {
        self.inner.locks.len()
    }

    /// Whether no lock entry is stored.
    pub fn is_empty(&self) -> bool {
        self.inner.locks.is_empty()
    }

    fn mint(&self) -> u64 {
        let floor = self.inner.clock.micros();
        let mut last = self.inner.last_epoch.load(Ordering::Relaxed);
        loop {
            let next = (last + 1).max(floor);
            match self.inner.last_epoch.compare_exchange_weak(
                last,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    /// Counts a record write and, once as many writes have come since the last
    /// sweep as records were left by it (at least [`RECORD_SWEEP_MIN`]), drops
    /// the expired records: a key written once and never read again does not
    /// stay for the process's life, at an amortized constant cost per write.
    /// Called before the write takes its record's entry (a sweep takes every
    /// shard of the map).
    fn sweep_records(&self, now: Instant) {
        let inner = &self.inner;
        let writes = inner.record_writes.fetch_add(1, Ordering::Relaxed) + 1;
        if writes >= inner.next_record_sweep.load(Ordering::Relaxed) {
            inner.records.retain(|_, r| r.expires > now);
            let left = u64::try_from(inner.records.len()).unwrap_or(u64::MAX);
            let next = writes.saturating_add(left.max(RECORD_SWEEP_MIN));
            inner.next_record_sweep.store(next, Ordering::Relaxed);
        }
    }

    /// Other waiters on the mutex `key`: its watchers (a caller watches only while
    /// it waits; waiters of the key's read-write lock or semaphore wait for other
    /// locks).
    fn waiting(&self, key: &LockKey) -> u32 {
        u32::try_from(self.inner.signals.watchers(LockKind::Mutex, key.as_bytes()))
            .unwrap_or(u32::MAX)
    }
}

/// What the simulated server of [`testing`](crate::testing) does to the locks
/// behind a client's back: a failover or an eviction deletes a key, a restart
/// without persistence deletes them all. Epochs are kept (the fencing counter is
/// never reset), as a Redis server's clock floor keeps its epochs increasing.
#[cfg(feature = "testing")]
impl MemoryBackend {
    /// An empty backend whose epochs are floored by Tokio's clock, counted in µs
    /// from now, instead of the wall clock: the simulated server's clock, so that
    /// a test on a paused clock mints the same epochs in every run.
    pub(crate) fn with_virtual_clock() -> Self {
        MemoryBackend {
            inner: Arc::new(Inner {
                clock: EpochClock::Virtual {
                    zero: Instant::now(),
                },
                ..Inner::default()
            }),
            id: next_id(),
        }
    }

    /// The token of the live mutex lease of `key`, if any.
    pub(crate) fn holder(&self, key: &LockKey) -> Option<LeaseToken> {
        let now = Instant::now();
        self.inner
            .locks
            .get(key)
            .filter(|held| held.epoch != 0 && held.expires > now)
            .map(|held| held.token)
    }

    /// Deletes every lock of the key string `key` (its mutex lease, its read-write
    /// lock's leases, its semaphore's permits); whether a live one was among them.
    pub(crate) fn evict(&self, key: &LockKey) -> bool {
        let mutex = self.holder(key).is_some();
        self.inner.locks.remove(key);
        self.inner.queues.remove(key);
        let rw = self.inner.rw.evict(key);
        let semaphore = self.inner.semaphores.evict(key);
        mutex || rw || semaphore
    }

    /// Deletes every lock, queue, leader record and idempotency record.
    pub(crate) fn flush(&self) {
        self.inner.records.clear();
        self.inner.locks.clear();
        self.inner.queues.clear();
        self.inner.rw.flush();
        self.inner.semaphores.flush();
        self.inner.leaders.clear();
    }
}

/// The part of a leader record that orders records: its first 40 bytes (the term).
fn term_of(record: &[u8]) -> &[u8] {
    &record[..record.len().min(40)]
}

#[async_trait]
impl LockBackend for MemoryBackend {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        _when_busy: WhenBusy,
    ) -> Result<Acquire> {
        let now = Instant::now();
        let mut entry = self.inner.locks.entry(key.clone()).or_insert(MemLease {
            token,
            epoch: 0,
            expires: now,
        });
        let held = entry.value_mut();
        // Already ours (a retry, or a new leader inheriting the token of an acquire
        // that may have landed): re-armed below,
        // with a new epoch like any acquisition.
        if held.token != token && held.epoch != 0 && held.expires > now {
            return Ok(Acquire::Busy {
                retry_in: held.expires - now,
            });
        }
        *held = MemLease {
            token,
            epoch: self.mint(),
            expires: now + ttl,
        };
        let epoch = held.epoch;
        drop(entry);
        Ok(Acquire::Acquired {
            epoch,
            waiting: self.waiting(key),
            earliest_other: None,
        })
    }

    async fn acquire_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
        age: Duration,
    ) -> Result<Acquire> {
        let now = Instant::now();
        let arrived = now.checked_sub(age).unwrap_or(now);
        let me = self.id;
        let mut waiters = self.inner.queues.entry(key.clone()).or_default();
        let q = waiters.value_mut();
        q.retain(|w| w.expires > now);
        let ahead = q.iter().any(|w| w.id != me && w.arrived < arrived);
        let others = q.iter().filter(|w| w.id != me).count();
        let mut entry = self.inner.locks.entry(key.clone()).or_insert(MemLease {
            token,
            epoch: 0,
            expires: now,
        });
        let held = entry.value_mut();
        let free = held.epoch == 0 || held.expires <= now;
        let ours = held.token == token && !free;
        let reply = if ours || (free && !ahead) {
            let epoch = self.mint();
            *held = MemLease {
                token,
                epoch,
                expires: now + ttl,
            };
            drop(entry);
            q.retain(|w| w.id != me);
            Acquire::Acquired {
                epoch,
                waiting: u32::try_from(others).unwrap_or(u32::MAX),
                earliest_other: None,
            }
        } else {
            let retry_in = if free {
                FAIR_RETRY
            } else {
                (held.expires - now).min(FAIR_RETRY)
            };
            let expired = free && held.epoch != 0;
            drop(entry);
            if free {
                // A placeholder, or a lease that ran out: the earliest waiter takes
                // it; an expiry wakes the waiters once.
                self.inner.locks.remove_if(key, |_, h| h.expires <= now);
                if expired {
                    self.inner.signals.wake(LockKind::Mutex, key.as_bytes());
                }
            }
            if when_busy == WhenBusy::Queue {
                let mine = Waiting {
                    id: me,
                    arrived,
                    expires: now + FAIR_ENTRY_TTL,
                };
                match q.iter_mut().find(|w| w.id == me) {
                    Some(w) => *w = mine,
                    None => q.push(mine),
                }
            }
            Acquire::Busy { retry_in }
        };
        let empty = q.is_empty();
        drop(waiters);
        if empty {
            self.inner.queues.remove_if(key, |_, q| q.is_empty());
        }
        Ok(reply)
    }

    fn supports_fair(&self) -> bool {
        true
    }

    /// Queues this instance at its next waiter's arrival, then releases: the
    /// waiters woken by the release then find it in its place.
    async fn release_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        next_waiter_age: Duration,
    ) -> Result<Released> {
        let now = Instant::now();
        let mine = Waiting {
            id: self.id,
            arrived: now.checked_sub(next_waiter_age).unwrap_or(now),
            expires: now + FAIR_ENTRY_TTL,
        };
        {
            let mut q = self.inner.queues.entry(key.clone()).or_default();
            match q.iter_mut().find(|w| w.id == self.id) {
                Some(w) => *w = mine,
                None => q.push(mine),
            }
        }
        self.release(key, token).await
    }

    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        let now = Instant::now();
        let mut released = false;
        let removed = self.inner.locks.remove_if(key, |_, held| {
            released = held.token == token && held.expires > now;
            released || held.expires <= now
        });
        if removed.is_some() {
            self.inner.signals.wake(LockKind::Mutex, key.as_bytes());
        }
        Ok(Released {
            released,
            waiting: self.waiting(key),
        })
    }

    async fn renew(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        let now = Instant::now();
        match self.inner.locks.get_mut(key) {
            Some(mut held) if held.token == token && held.expires > now => {
                held.expires = now + ttl;
                drop(held);
                Ok(Renewal::Renewed {
                    waiting: self.waiting(key),
                })
            }
            _ => Ok(Renewal::NotOwner),
        }
    }

    /// Announces a change of the record (another record, or one written again
    /// after it expired; not a refresh) to the observers of every clone.
    async fn write_leader(&self, key: &LockKey, record: &[u8], ttl: Duration) -> Result<bool> {
        let now = Instant::now();
        let mut entry = self
            .inner
            .leaders
            .entry(key.clone())
            .or_insert_with(|| (Vec::new(), now));
        let (stored, expires) = &mut *entry;
        let live = *expires > now;
        if live && term_of(stored) > term_of(record) {
            return Ok(false);
        }
        let changed = !live || stored.as_slice() != record;
        *stored = record.to_vec();
        *expires = now + ttl;
        drop(entry);
        if changed {
            self.inner.signals.leader_changed(key.as_bytes());
        }
        Ok(true)
    }

    async fn read_leader(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        let now = Instant::now();
        let found = self
            .inner
            .leaders
            .get(key)
            .filter(|e| e.1 > now)
            .map(|e| e.0.clone());
        if found.is_none() {
            self.inner.leaders.remove_if(key, |_, e| e.1 <= now);
        }
        Ok(found)
    }

    /// Announces the deletion to the observers of every clone.
    async fn clear_leader(&self, key: &LockKey, record: &[u8]) -> Result<bool> {
        let deleted = self
            .inner
            .leaders
            .remove_if(key, |_, e| e.0 == record)
            .is_some();
        if deleted {
            self.inner.signals.leader_changed(key.as_bytes());
        }
        Ok(deleted)
    }

    /// The record's entry is locked for the whole step (a fence and a store of
    /// one key never interleave); an expired record counts as none.
    async fn fence_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        retention: Duration,
    ) -> Result<RecordState> {
        let now = Instant::now();
        self.sweep_records(now);
        let mut entry = self.inner.records.entry(key.clone()).or_insert(Record {
            fence,
            response: None,
            expires: now,
        });
        let record = &mut *entry;
        if record.expires <= now {
            (record.fence, record.response) = (fence, None);
        }
        if let Some(response) = &record.response {
            return Ok(RecordState::Stored(response.clone()));
        }
        if record.fence > fence {
            return Ok(RecordState::Stale);
        }
        record.fence = fence;
        record.expires = now + retention;
        Ok(RecordState::Fenced)
    }

    async fn store_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        response: &[u8],
        retention: Duration,
    ) -> Result<bool> {
        let now = Instant::now();
        self.sweep_records(now);
        let mut entry = self.inner.records.entry(key.clone()).or_insert(Record {
            fence,
            response: None,
            expires: now,
        });
        let record = &mut *entry;
        if record.expires > now && record.fence > fence {
            return Ok(false);
        }
        *record = Record {
            fence,
            response: Some(response.to_vec()),
            expires: now + retention,
        };
        Ok(true)
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        let now = Instant::now();
        let found = self
            .inner
            .records
            .get(key)
            .filter(|r| r.expires > now)
            .and_then(|r| r.response.clone());
        if found.is_none() {
            self.inner.records.remove_if(key, |_, r| r.expires <= now);
        }
        Ok(found)
    }

    async fn leave(&self, key: &LockKey) -> Result<()> {
        if let Some(mut q) = self.inner.queues.get_mut(key) {
            q.retain(|w| w.id != self.id);
            let empty = q.is_empty();
            drop(q);
            if empty {
                self.inner.queues.remove_if(key, |_, q| q.is_empty());
            }
        }
        Ok(())
    }

    fn signals(&self) -> &Signals {
        &self.inner.signals
    }

    fn rw(&self) -> Option<&dyn crate::backend::rw::RwBackend> {
        Some(self)
    }

    fn semaphore(&self) -> Option<&dyn crate::backend::semaphore::SemaphoreBackend> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn records_are_fenced_and_expire() {
        let a = MemoryBackend::new();
        let b = a.clone();
        let k = LockKey::from("idem");
        let day = Duration::from_secs(86_400);
        assert_eq!(
            a.fence_record(&k, (5, 0), day).await.unwrap(),
            RecordState::Fenced
        );
        // A newer executor fences (the first one's lease was lost) and stores.
        assert_eq!(
            b.fence_record(&k, (7, 0), day).await.unwrap(),
            RecordState::Fenced
        );
        assert_eq!(
            a.fence_record(&k, (6, 9), day).await.unwrap(),
            RecordState::Stale
        );
        assert!(b.store_record(&k, (7, 0), b"newer", day).await.unwrap());
        // The stalled first executor's store is refused, on every clone.
        assert!(!a.store_record(&k, (5, 0), b"stale", day).await.unwrap());
        assert_eq!(
            a.read_record(&k).await.unwrap().as_deref(),
            Some(&b"newer"[..])
        );
        assert_eq!(
            a.fence_record(&k, (9, 0), day).await.unwrap(),
            RecordState::Stored(b"newer".to_vec())
        );
        tokio::time::advance(day).await;
        assert_eq!(a.read_record(&k).await.unwrap(), None, "expired");
        assert!(
            a.inner.records.is_empty(),
            "an expired record is dropped when read"
        );
        assert_eq!(
            a.fence_record(&k, (1, 0), day).await.unwrap(),
            RecordState::Fenced
        );
    }

    /// Records written once and never read again are swept once they expired,
    /// so the map does not grow for the process's life.
    #[tokio::test(start_paused = true)]
    async fn expired_records_are_swept_by_later_writes() {
        let b = MemoryBackend::new();
        let minute = Duration::from_secs(60);
        let n = RECORD_SWEEP_MIN * 2;
        for i in 0..n {
            let key = LockKey::from(format!("once-{i}"));
            assert!(b.store_record(&key, (1, 0), b"r", minute).await.unwrap());
        }
        assert_eq!(b.inner.records.len() as u64, n, "all live");
        tokio::time::advance(minute).await;
        for i in 0..n {
            let key = LockKey::from(format!("later-{i}"));
            b.fence_record(&key, (1, 0), minute).await.unwrap();
        }
        assert!(
            (b.inner.records.len() as u64) < n + RECORD_SWEEP_MIN,
            "{} records left; the first {n} expired",
            b.inner.records.len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_expiry_epochs_and_ownership() {
        let b = MemoryBackend::new();
        let k = LockKey::from("k");
        let (t1, t2) = (LeaseToken::random(), LeaseToken::random());
        let ttl = Duration::from_secs(1);
        let Acquire::Acquired { epoch: e1, .. } =
            b.acquire(&k, t1, ttl, WhenBusy::Queue).await.unwrap()
        else {
            panic!("free lock not acquired")
        };
        // Already ours: re-armed, with a new and greater epoch.
        tokio::time::advance(Duration::from_millis(600)).await;
        let Acquire::Acquired { epoch: e1b, .. } =
            b.acquire(&k, t1, ttl, WhenBusy::Queue).await.unwrap()
        else {
            panic!("own lock not re-acquired")
        };
        assert!(e1b > e1, "{e1b} after {e1}");
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(
            b.renew(&k, t1, ttl).await.unwrap(),
            Renewal::Renewed { waiting: 0 }
        );
        let e1 = e1b;
        assert!(matches!(
            b.acquire(&k, t2, ttl, WhenBusy::Queue).await.unwrap(),
            Acquire::Busy { .. }
        ));
        assert_eq!(b.renew(&k, t2, ttl).await.unwrap(), Renewal::NotOwner);
        assert!(!b.release(&k, t2).await.unwrap().released);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(b.renew(&k, t1, ttl).await.unwrap(), Renewal::NotOwner);
        let Acquire::Acquired { epoch: e2, .. } =
            b.acquire(&k, t2, ttl, WhenBusy::Queue).await.unwrap()
        else {
            panic!("expired lock not acquired")
        };
        assert!(e2 > e1);
        assert!(!b.release(&k, t1).await.unwrap().released);
        assert!(b.release(&k, t2).await.unwrap().released);
        assert!(b.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn fair_mode_orders_instances_by_arrival_and_forbids_barging() {
        let a = MemoryBackend::new();
        let (b, c, d) = (a.clone(), a.clone(), a.clone());
        let k = LockKey::from("k");
        let ms = Duration::from_millis;
        async fn fair(
            m: &MemoryBackend,
            t: LeaseToken,
            when_busy: WhenBusy,
            age: Duration,
        ) -> Acquire {
            let (k, ttl) = (LockKey::from("k"), Duration::from_secs(1));
            m.acquire_fair(&k, t, ttl, when_busy, age).await.unwrap()
        }
        let (ta, tb, tc, td) = (
            LeaseToken::random(),
            LeaseToken::random(),
            LeaseToken::random(),
            LeaseToken::random(),
        );
        assert!(matches!(
            fair(&a, ta, WhenBusy::Queue, ms(0)).await,
            Acquire::Acquired { .. }
        ));
        // c's waiter arrived before b's (older age), although c asks later.
        assert!(matches!(
            fair(&b, tb, WhenBusy::Queue, ms(5)).await,
            Acquire::Busy { .. }
        ));
        assert!(matches!(
            fair(&c, tc, WhenBusy::Queue, ms(50)).await,
            Acquire::Busy { .. }
        ));
        // a's lease expires without a release: d, a newcomer, may not take it.
        tokio::time::advance(ms(1001)).await;
        assert!(matches!(
            fair(&d, td, WhenBusy::Return, ms(0)).await,
            Acquire::Busy { .. }
        ));
        assert!(matches!(
            fair(&b, tb, WhenBusy::Queue, ms(5)).await,
            Acquire::Busy { .. }
        ));
        let Acquire::Acquired { waiting, .. } = fair(&c, tc, WhenBusy::Queue, ms(60)).await else {
            panic!("the earliest arrival did not get the free lock")
        };
        assert_eq!(waiting, 1, "b still waits");
        assert!(c.release(&k, tc).await.unwrap().released);
        assert!(matches!(
            fair(&d, td, WhenBusy::Return, ms(0)).await,
            Acquire::Busy { .. }
        ));
        assert!(matches!(
            fair(&b, tb, WhenBusy::Queue, ms(10)).await,
            Acquire::Acquired { .. }
        ));
        assert!(b.release(&k, tb).await.unwrap().released);
        // Nobody waits: anyone takes it; a leaver's entry is gone.
        assert!(matches!(
            fair(&c, tc, WhenBusy::Queue, ms(0)).await,
            Acquire::Acquired { .. }
        ));
        assert!(matches!(
            fair(&d, td, WhenBusy::Queue, ms(0)).await,
            Acquire::Busy { .. }
        ));
        d.leave(&k).await.unwrap();
        assert!(c.release(&k, tc).await.unwrap().released);
        assert!(a.is_empty());
        assert!(a.inner.queues.is_empty());
    }
}
