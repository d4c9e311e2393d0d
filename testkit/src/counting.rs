//! A backend wrapper that counts the requests lockflight sends (one trait call =
//! one round trip of the inner backend) and the acquires in flight at once. Every
//! call goes to the inner backend unchanged (fair mode, batched renewal, the
//! read-write locks and semaphores included), so a locker behaves over the
//! wrapper as over the inner backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lockflight::backend::rw::RwBackend;
use lockflight::backend::semaphore::SemaphoreBackend;
use lockflight::backend::{
    Acquire, LeaseToken, RecordFence, RecordState, Released, RenewItem, Renewal, Signals, WhenBusy,
};
use lockflight::{LockKey, backend::LockBackend};

/// Requests sent through a [`Counting`] backend.
#[derive(Debug, Default)]
pub struct Counts {
    /// `acquire` and `acquire_fair` requests sent.
    pub acquire: AtomicU64,
    /// `release` and `release_fair` requests sent.
    pub release: AtomicU64,
    /// Leases renewed: one per `renew` request, one per lease of a
    /// `renew_batch` request.
    pub renew: AtomicU64,
    /// `renew_batch` requests sent (the renewal watchdog's batches).
    pub renew_batch: AtomicU64,
    /// `leave` requests sent.
    pub leave: AtomicU64,
    /// Idempotency record requests sent: `fence_record`, `store_record`,
    /// `read_record` (not in [`snapshot`](Self::snapshot) or
    /// [`total`](Self::total), which count the lock's requests).
    pub record: AtomicU64,
    /// Acquires sent and not answered yet.
    pub in_flight: AtomicUsize,
    /// The most acquires in flight at once.
    pub max_in_flight: AtomicUsize,
}

impl Counts {
    /// `[acquire, release, renew, leave]`.
    pub fn snapshot(&self) -> [u64; 4] {
        [
            self.acquire.load(Ordering::Relaxed),
            self.release.load(Ordering::Relaxed),
            self.renew.load(Ordering::Relaxed),
            self.leave.load(Ordering::Relaxed),
        ]
    }

    /// All requests sent.
    pub fn total(&self) -> u64 {
        self.snapshot().iter().sum()
    }
}

/// Counts every backend request lockflight sends (a script call is one).
#[derive(Debug)]
pub struct Counting<B> {
    inner: B,
    counts: Arc<Counts>,
}

impl<B> Counting<B> {
    /// Wraps `inner`; returns the wrapper and its counts (to read while it runs).
    pub fn new(inner: B) -> (Self, Arc<Counts>) {
        let counts = Arc::new(Counts::default());
        let c = Arc::clone(&counts);
        (Counting { inner, counts }, c)
    }
}

#[async_trait]
impl<B: LockBackend> LockBackend for Counting<B> {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> lockflight::Result<Acquire> {
        self.counts.acquire.fetch_add(1, Ordering::Relaxed);
        let now = self.counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.counts.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let out = self.inner.acquire(key, token, ttl, when_busy).await;
        self.counts.in_flight.fetch_sub(1, Ordering::SeqCst);
        out
    }
    async fn acquire_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
        age: Duration,
    ) -> lockflight::Result<Acquire> {
        self.counts.acquire.fetch_add(1, Ordering::Relaxed);
        let now = self.counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.counts.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let out = self
            .inner
            .acquire_fair(key, token, ttl, when_busy, age)
            .await;
        self.counts.in_flight.fetch_sub(1, Ordering::SeqCst);
        out
    }
    fn supports_fair(&self) -> bool {
        self.inner.supports_fair()
    }
    fn pace_waits(&self, key: &LockKey, pace: Option<Duration>) {
        self.inner.pace_waits(key, pace);
    }
    async fn release(&self, key: &LockKey, token: LeaseToken) -> lockflight::Result<Released> {
        self.counts.release.fetch_add(1, Ordering::Relaxed);
        self.inner.release(key, token).await
    }
    async fn release_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        next_waiter_age: Duration,
    ) -> lockflight::Result<Released> {
        self.counts.release.fetch_add(1, Ordering::Relaxed);
        self.inner.release_fair(key, token, next_waiter_age).await
    }
    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<lockflight::Result<Renewal>> {
        self.counts.renew_batch.fetch_add(1, Ordering::Relaxed);
        self.counts
            .renew
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        self.inner.renew_batch(items).await
    }
    fn rw(&self) -> Option<&dyn RwBackend> {
        self.inner.rw()
    }
    fn semaphore(&self) -> Option<&dyn SemaphoreBackend> {
        self.inner.semaphore()
    }
    async fn renew(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> lockflight::Result<Renewal> {
        self.counts.renew.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(key, token, ttl).await
    }
    async fn leave(&self, key: &LockKey) -> lockflight::Result<()> {
        self.counts.leave.fetch_add(1, Ordering::Relaxed);
        self.inner.leave(key).await
    }
    async fn fence_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        retention: Duration,
    ) -> lockflight::Result<RecordState> {
        self.counts.record.fetch_add(1, Ordering::Relaxed);
        self.inner.fence_record(key, fence, retention).await
    }
    async fn store_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        response: &[u8],
        retention: Duration,
    ) -> lockflight::Result<bool> {
        self.counts.record.fetch_add(1, Ordering::Relaxed);
        self.inner
            .store_record(key, fence, response, retention)
            .await
    }
    async fn read_record(&self, key: &LockKey) -> lockflight::Result<Option<Vec<u8>>> {
        self.counts.record.fetch_add(1, Ordering::Relaxed);
        self.inner.read_record(key).await
    }
    fn signals(&self) -> &Signals {
        self.inner.signals()
    }
    fn fencing(&self) -> bool {
        self.inner.fencing()
    }
    async fn write_leader(
        &self,
        key: &LockKey,
        record: &[u8],
        ttl: Duration,
    ) -> lockflight::Result<bool> {
        self.inner.write_leader(key, record, ttl).await
    }
    async fn read_leader(&self, key: &LockKey) -> lockflight::Result<Option<Vec<u8>>> {
        self.inner.read_leader(key).await
    }
    async fn clear_leader(&self, key: &LockKey, record: &[u8]) -> lockflight::Result<bool> {
        self.inner.clear_leader(key, record).await
    }
    async fn observe_leader(&self, key: &LockKey, ttl: Duration) -> lockflight::Result<()> {
        self.inner.observe_leader(key, ttl).await
    }
    fn new_token(&self) -> LeaseToken {
        self.inner.new_token()
    }
}
