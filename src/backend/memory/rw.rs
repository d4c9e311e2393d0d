//! MemoryBackend's read-write locks: [`RwBackend`](crate::backend::rw::RwBackend),
//! with the semantics of the Redis protocol (see [`crate::backend::rw`]) in this
//! process: read leases and waiting writers expire on Tokio's clock, write epochs come
//! from the backend's epoch counter, wake-ups go through its registry (every watcher
//! of the key is woken).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::rw::RwBackend;
use crate::backend::{Acquire, LeaseToken, LockKind, Released, Renewal, WhenBusy};
use crate::error::Result;
use crate::key::LockKey;

/// How long a waiting writer's registration lives without a new attempt.
const WRITER_ENTRY_TTL: Duration = Duration::from_secs(3);
/// The longest `retry_in` of a busy answer (so a waiting writer re-registers in time).
const MAX_RETRY: Duration = Duration::from_secs(1);

/// The in-process state of the rw locks.
#[derive(Debug, Default)]
pub(super) struct State {
    keys: Mutex<HashMap<LockKey, Entry>>,
}

/// One key's read-write lock. Removed when nothing of it is live, except its write
/// fence, kept in `fence` (one `u64` per key ever written).
#[derive(Debug, Default)]
struct Entry {
    readers: HashMap<LeaseToken, Instant>,
    writer: Option<(LeaseToken, Instant)>,
    writers: HashMap<LeaseToken, Instant>,
    fence: u64,
}

impl Entry {
    fn purge(&mut self, now: Instant) {
        self.readers.retain(|_, until| *until > now);
        self.writers.retain(|_, until| *until > now);
        if self.writer.is_some_and(|(_, until)| until <= now) {
            self.writer = None;
        }
    }

    fn idle(&self) -> bool {
        self.readers.is_empty() && self.writer.is_none() && self.writers.is_empty()
    }

    fn waiting_writers(&self, except: Option<LeaseToken>) -> u32 {
        let n = self.writers.keys().filter(|t| Some(**t) != except).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

#[cfg(feature = "testing")]
impl State {
    /// Deletes the leases and waiting writers of `key`, keeping its write fence;
    /// whether a live lease was among them.
    pub(super) fn evict(&self, key: &LockKey) -> bool {
        let now = Instant::now();
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = keys.get_mut(key) else {
            return false;
        };
        entry.purge(now);
        let live = !entry.readers.is_empty() || entry.writer.is_some();
        entry.readers.clear();
        entry.writer = None;
        entry.writers.clear();
        if entry.fence == 0 {
            keys.remove(key);
        }
        live
    }

    /// Deletes every key's leases and waiting writers, keeping the write fences.
    pub(super) fn flush(&self) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.retain(|_, entry| entry.fence != 0);
        for entry in keys.values_mut() {
            entry.readers.clear();
            entry.writer = None;
            entry.writers.clear();
        }
    }
}

fn busy(until: Instant, now: Instant) -> Acquire {
    Acquire::Busy {
        retry_in: until.saturating_duration_since(now).min(MAX_RETRY),
    }
}

impl MemoryBackend {
    /// Runs `f` on `key`'s entry (expired parts purged); drops the entry when idle
    /// unless it records a write fence.
    fn with_rw<T>(&self, key: &LockKey, f: impl FnOnce(&mut Entry, Instant) -> T) -> T {
        let now = Instant::now();
        let mut keys = self.inner.rw.keys.lock().unwrap_or_else(|e| e.into_inner());
        let entry = keys.entry(key.clone()).or_default();
        entry.purge(now);
        let out = f(entry, now);
        if entry.idle() && entry.fence == 0 {
            keys.remove(key);
        }
        out
    }
}

#[async_trait]
impl RwBackend for MemoryBackend {
    async fn acquire_read(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        _when_busy: WhenBusy,
    ) -> Result<Acquire> {
        Ok(self.with_rw(key, |e, now| {
            if let Some((_, until)) = e.writer {
                return busy(until, now);
            }
            if !e.readers.contains_key(&token)
                && let Some(first) = e.writers.values().min()
            {
                return busy(*first, now);
            }
            e.readers.insert(token, now + ttl);
            Acquire::Acquired {
                epoch: e.fence,
                waiting: 0,
                earliest_other: None,
            }
        }))
    }

    async fn acquire_write(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        Ok(self.with_rw(key, |e, now| {
            let others = e.waiting_writers(Some(token));
            let blocked = match e.writer {
                Some((holder, until)) if holder != token => Some(until),
                Some(_) => None,
                None => e.readers.values().min().copied(),
            };
            if let Some(until) = blocked {
                if when_busy == WhenBusy::Queue {
                    e.writers.insert(token, now + WRITER_ENTRY_TTL);
                }
                return busy(until, now);
            }
            e.writers.remove(&token);
            e.writer = Some((token, now + ttl));
            e.fence = self.mint().max(e.fence + 1);
            Acquire::Acquired {
                epoch: e.fence,
                waiting: others,
                earliest_other: None,
            }
        }))
    }

    async fn release_read(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        let (released, wake, waiting) = self.with_rw(key, |e, _| {
            let released = e.readers.remove(&token).is_some();
            let wake = released && e.readers.is_empty() && e.writer.is_none();
            (released, wake, e.waiting_writers(None))
        });
        if wake {
            self.inner.signals.wake(LockKind::ReadWrite, key.as_bytes());
        }
        Ok(Released { released, waiting })
    }

    async fn release_write(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        let (released, wake, waiting) = self.with_rw(key, |e, _| {
            let released = e.writer.is_some_and(|(holder, _)| holder == token);
            if released {
                e.writer = None;
            }
            let withdrew = e.writers.remove(&token).is_some();
            (released, released || withdrew, e.waiting_writers(None))
        });
        if wake {
            self.inner.signals.wake(LockKind::ReadWrite, key.as_bytes());
        }
        Ok(Released { released, waiting })
    }

    async fn renew_read(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        Ok(self.with_rw(key, |e, now| match e.readers.get_mut(&token) {
            Some(until) => {
                *until = now + ttl;
                Renewal::Renewed {
                    waiting: e.waiting_writers(None),
                }
            }
            None => Renewal::NotOwner,
        }))
    }

    async fn renew_write(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Renewal> {
        Ok(self.with_rw(key, |e, now| match &mut e.writer {
            Some((holder, until)) if *holder == token => {
                *until = now + ttl;
                Renewal::Renewed {
                    waiting: e.waiting_writers(None),
                }
            }
            _ => Renewal::NotOwner,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquired(a: Acquire) -> u64 {
        match a {
            Acquire::Acquired { epoch, .. } => epoch,
            Acquire::Busy { .. } => panic!("busy, expected a grant"),
        }
    }

    fn is_busy(a: Acquire) -> bool {
        matches!(a, Acquire::Busy { .. })
    }

    #[tokio::test(start_paused = true)]
    async fn readers_share_writers_exclude_and_waiting_writers_block_new_readers() {
        let b = MemoryBackend::new();
        let k = LockKey::from("k");
        let ttl = Duration::from_secs(1);
        let (r1, r2, w1, w2) = (
            LeaseToken::random(),
            LeaseToken::random(),
            LeaseToken::random(),
            LeaseToken::random(),
        );
        assert_eq!(
            acquired(b.acquire_read(&k, r1, ttl, WhenBusy::Queue).await.unwrap()),
            0
        );
        acquired(b.acquire_read(&k, r2, ttl, WhenBusy::Queue).await.unwrap());
        // A writer waits: registered, and new readers are refused.
        assert!(is_busy(
            b.acquire_write(&k, w1, ttl, WhenBusy::Queue).await.unwrap()
        ));
        let r3 = LeaseToken::random();
        assert!(is_busy(
            b.acquire_read(&k, r3, ttl, WhenBusy::Queue).await.unwrap()
        ));
        // try_write does not register: a second writer's try changes nothing.
        assert!(is_busy(
            b.acquire_write(&k, w2, ttl, WhenBusy::Return)
                .await
                .unwrap()
        ));
        assert_eq!(
            b.renew_read(&k, r1, ttl).await.unwrap(),
            Renewal::Renewed { waiting: 1 }
        );
        assert!(b.release_read(&k, r1).await.unwrap().released);
        assert!(b.release_read(&k, r2).await.unwrap().released);
        assert!(!b.release_read(&k, r2).await.unwrap().released);
        let e1 = acquired(b.acquire_write(&k, w1, ttl, WhenBusy::Queue).await.unwrap());
        assert!(is_busy(
            b.acquire_read(&k, r3, ttl, WhenBusy::Queue).await.unwrap()
        ));
        assert!(is_busy(
            b.acquire_write(&k, w2, ttl, WhenBusy::Queue).await.unwrap()
        ));
        assert!(b.release_write(&k, w1).await.unwrap().released);
        // w2 still waits: readers are refused until it gets in or withdraws.
        assert!(is_busy(
            b.acquire_read(&k, r3, ttl, WhenBusy::Queue).await.unwrap()
        ));
        let e2 = acquired(b.acquire_write(&k, w2, ttl, WhenBusy::Queue).await.unwrap());
        assert!(e2 > e1, "{e2} after {e1}");
        assert_eq!(b.renew_write(&k, w1, ttl).await.unwrap(), Renewal::NotOwner);
        assert!(b.release_write(&k, w2).await.unwrap().released);
        assert_eq!(
            acquired(b.acquire_read(&k, r3, ttl, WhenBusy::Queue).await.unwrap()),
            e2
        );
        // Leases expire at their TTL.
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(b.renew_read(&k, r3, ttl).await.unwrap(), Renewal::NotOwner);
        let e3 = acquired(b.acquire_write(&k, w1, ttl, WhenBusy::Queue).await.unwrap());
        assert!(e3 > e2);
        // A writer that gives up withdraws its registration.
        assert!(is_busy(
            b.acquire_write(&k, w2, ttl, WhenBusy::Queue).await.unwrap()
        ));
        assert!(!b.release_write(&k, w2).await.unwrap().released);
        assert!(b.release_write(&k, w1).await.unwrap().released);
        acquired(b.acquire_read(&k, r1, ttl, WhenBusy::Queue).await.unwrap());
        assert!(b.release_read(&k, r1).await.unwrap().released);
        let held = b.inner.rw.keys.lock().unwrap().get(&k).map(|e| e.idle());
        assert_eq!(held, Some(true), "only the fence is left");
    }

    #[tokio::test(start_paused = true)]
    async fn a_crashed_waiting_writer_stops_blocking_readers_at_its_entry_ttl() {
        let b = MemoryBackend::new();
        let k = LockKey::from("k");
        let ttl = Duration::from_secs(10);
        let (r, w) = (LeaseToken::random(), LeaseToken::random());
        acquired(b.acquire_read(&k, r, ttl, WhenBusy::Queue).await.unwrap());
        assert!(is_busy(
            b.acquire_write(&k, w, ttl, WhenBusy::Queue).await.unwrap()
        ));
        let r2 = LeaseToken::random();
        let Acquire::Busy { retry_in } =
            b.acquire_read(&k, r2, ttl, WhenBusy::Queue).await.unwrap()
        else {
            panic!("a waiting writer must refuse new readers")
        };
        assert!(retry_in <= MAX_RETRY);
        tokio::time::advance(WRITER_ENTRY_TTL).await;
        acquired(b.acquire_read(&k, r2, ttl, WhenBusy::Queue).await.unwrap());
    }
}
