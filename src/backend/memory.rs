//! The in-process backend: locks in this process's memory.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dashmap::DashMap;
use tokio::time::Instant;

use super::{Acquire, Extend, LeaseToken, LockBackend, Released, WakeRegistry};
use crate::error::Result;
use crate::key::LockKey;

mod rw;
mod semaphore;

/// Locks held in this process's memory, with TTLs, fencing epochs and release
/// notifications, and the [`LockBackend`] semantics the [`Locker`](crate::Locker)
/// relies on.
///
/// Use it for a single-instance service, for development, and wherever the locked
/// resource lives in one process. Clones share the same locks, so several
/// [`Locker`](crate::Locker)s built on clones exclude each other.
///
/// How it differs from [`RedisBackend`](crate::RedisBackend):
///
/// * **No queue.** Waiters are not ordered and hold no claim; `leave` does nothing.
/// * **Every watcher is woken** on a release (Redis wakes one waiting instance); the
///   others find the lock taken and wait again.
/// * **Epochs are floored by this process's wall clock**, not a server's: one
///   counter per backend, at least the wall-clock time in microseconds. They
///   strictly increase per key (and across keys) while the process runs, including
///   a same-token acquire, which mints a new epoch as Redis does; a clock set back
///   across a restart of the process can repeat them.
/// * Replies cannot be lost, so there is no release tombstone: releasing a token
///   twice reports `released: false` the second time.
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
#[derive(Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    locks: DashMap<LockKey, Held>,
    last_epoch: AtomicU64,
    wakeups: WakeRegistry,
    rw: rw::State,
    semaphores: semaphore::State,
}

#[derive(Clone, Copy)]
struct Held {
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
        let floor = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
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

    /// Other waiters on `key`: its watchers (a caller watches only while it waits).
    fn waiting(&self, key: &LockKey) -> u32 {
        u32::try_from(self.inner.wakeups.watchers(key.as_bytes())).unwrap_or(u32::MAX)
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        _queue: bool,
    ) -> Result<Acquire> {
        let now = Instant::now();
        let mut entry = self.inner.locks.entry(key.clone()).or_insert(Held {
            token,
            epoch: 0,
            expires: now,
        });
        let held = entry.value_mut();
        // Already ours (a retry, or a new leader reusing the token): re-armed below,
        // with a new epoch like any acquisition.
        if held.token != token && held.epoch != 0 && held.expires > now {
            return Ok(Acquire::Busy {
                retry_in: held.expires - now,
            });
        }
        *held = Held {
            token,
            epoch: self.mint(),
            expires: now + ttl,
        };
        let epoch = held.epoch;
        drop(entry);
        Ok(Acquire::Acquired {
            epoch,
            waiting: self.waiting(key),
        })
    }

    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        let now = Instant::now();
        let mut released = false;
        let removed = self.inner.locks.remove_if(key, |_, held| {
            released = held.token == token && held.expires > now;
            released || held.expires <= now
        });
        if removed.is_some() {
            self.inner.wakeups.wake(key.as_bytes());
        }
        Ok(Released {
            released,
            waiting: self.waiting(key),
        })
    }

    async fn extend(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Extend> {
        let now = Instant::now();
        match self.inner.locks.get_mut(key) {
            Some(mut held) if held.token == token && held.expires > now => {
                held.expires = now + ttl;
                drop(held);
                Ok(Extend::Extended {
                    waiting: self.waiting(key),
                })
            }
            _ => Ok(Extend::NotOwner),
        }
    }

    async fn leave(&self, _key: &LockKey) -> Result<()> {
        Ok(())
    }

    fn wakeups(&self) -> &WakeRegistry {
        &self.inner.wakeups
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
    async fn ttl_expiry_epochs_and_ownership() {
        let b = MemoryBackend::new();
        let k = LockKey::from("k");
        let (t1, t2) = (LeaseToken::random(), LeaseToken::random());
        let ttl = Duration::from_secs(1);
        let Acquire::Acquired { epoch: e1, .. } = b.acquire(&k, t1, ttl, true).await.unwrap()
        else {
            panic!("free lock not acquired")
        };
        // Already ours: re-armed, with a new and greater epoch.
        tokio::time::advance(Duration::from_millis(600)).await;
        let Acquire::Acquired { epoch: e1b, .. } = b.acquire(&k, t1, ttl, true).await.unwrap()
        else {
            panic!("own lock not re-acquired")
        };
        assert!(e1b > e1, "{e1b} after {e1}");
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(
            b.extend(&k, t1, ttl).await.unwrap(),
            Extend::Extended { waiting: 0 }
        );
        let e1 = e1b;
        assert!(matches!(
            b.acquire(&k, t2, ttl, true).await.unwrap(),
            Acquire::Busy { .. }
        ));
        assert_eq!(b.extend(&k, t2, ttl).await.unwrap(), Extend::NotOwner);
        assert!(!b.release(&k, t2).await.unwrap().released);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(b.extend(&k, t1, ttl).await.unwrap(), Extend::NotOwner);
        let Acquire::Acquired { epoch: e2, .. } = b.acquire(&k, t2, ttl, true).await.unwrap()
        else {
            panic!("expired lock not acquired")
        };
        assert!(e2 > e1);
        assert!(!b.release(&k, t1).await.unwrap().released);
        assert!(b.release(&k, t2).await.unwrap().released);
        assert!(b.is_empty());
    }
}
