//! MemoryBackend's semaphores: [`SemaphoreBackend`](crate::backend::semaphore::SemaphoreBackend).
//!
//! The same semantics as Redis's, in this process: `N` live permits per key at most,
//! each expiring at its TTL (Tokio's clock), `N` fixed while any permit lives or
//! anyone waits, same-token requests re-arm. There is one instance, so the waiting
//! set is one flag with an expiry, and a release or leave that leaves permits free
//! wakes the key's watchers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::semaphore::{Permits, SemaphoreBackend};
use crate::backend::{LeaseToken, LockKind, Renewal, WhenBusy};
use crate::error::{Error, Result};
use crate::key::LockKey;

/// How long the waiting flag lives without a refresh, and the longest retry delay.
const WAITING_TTL: Duration = Duration::from_secs(3);

/// The in-process state of the semaphores.
#[derive(Debug, Default)]
pub(super) struct State {
    keys: Mutex<HashMap<LockKey, Sem>>,
}

#[derive(Debug)]
struct Sem {
    n: u32,
    /// token → expiry.
    permits: HashMap<LeaseToken, Instant>,
    /// Until when this instance counts as waiting.
    waiting_until: Option<Instant>,
}

impl Sem {
    fn purge(&mut self, now: Instant) {
        self.permits.retain(|_, expires| *expires > now);
        if self.waiting_until.is_some_and(|w| w <= now) {
            self.waiting_until = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.permits.is_empty() && self.waiting_until.is_none()
    }

    fn free(&self) -> usize {
        (self.n as usize).saturating_sub(self.permits.len())
    }
}

#[cfg(feature = "testing")]
impl State {
    /// Deletes the permits and waiting set of `key`; whether a live permit was
    /// among them.
    pub(super) fn evict(&self, key: &LockKey) -> bool {
        let now = Instant::now();
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.remove(key).is_some_and(|mut sem| {
            sem.purge(now);
            !sem.permits.is_empty()
        })
    }

    /// Deletes every semaphore.
    pub(super) fn flush(&self) {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl MemoryBackend {
    fn semaphores(&self) -> std::sync::MutexGuard<'_, HashMap<LockKey, Sem>> {
        self.inner
            .semaphores
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// After a release or leave: drops an empty key, wakes waiters when permits are
    /// free.
    fn settle_semaphore(&self, keys: &mut HashMap<LockKey, Sem>, key: &LockKey) -> bool {
        let Some(sem) = keys.get(key) else {
            return false;
        };
        let free = sem.free() > 0;
        if sem.is_empty() {
            keys.remove(key);
        }
        free
    }
}

#[async_trait]
impl SemaphoreBackend for MemoryBackend {
    async fn acquire_permits(
        &self,
        key: &LockKey,
        permits: u32,
        tokens: &[LeaseToken],
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Permits> {
        let now = Instant::now();
        let mut keys = self.semaphores();
        if let Some(sem) = keys.get_mut(key) {
            sem.purge(now);
            if sem.n != permits && !sem.is_empty() {
                return Err(Error::PermitMismatch {
                    key: key.clone(),
                    permits: sem.n,
                    requested: permits,
                });
            }
            sem.n = permits;
        }
        let sem = keys.entry(key.clone()).or_insert_with(|| Sem {
            n: permits,
            permits: HashMap::new(),
            waiting_until: None,
        });
        let mut granted = 0;
        for token in tokens {
            if let Some(expires) = sem.permits.get_mut(token) {
                *expires = now + ttl;
            } else if sem.free() > 0 {
                sem.permits.insert(*token, now + ttl);
            } else {
                break;
            }
            granted += 1;
        }
        let retry_in = sem
            .permits
            .values()
            .min()
            .map_or(Duration::ZERO, |e| e.saturating_duration_since(now))
            .clamp(Duration::from_millis(5), WAITING_TTL / 3);
        if when_busy == WhenBusy::Queue {
            sem.waiting_until = (granted < tokens.len()).then_some(now + WAITING_TTL);
        }
        if sem.is_empty() {
            keys.remove(key);
        }
        // One waiting entry per backend: other instances are not told apart.
        Ok(Permits {
            granted,
            retry_in,
            waiting: 0,
        })
    }

    async fn release_permit(&self, key: &LockKey, token: LeaseToken) -> Result<bool> {
        let now = Instant::now();
        let mut keys = self.semaphores();
        let Some(sem) = keys.get_mut(key) else {
            return Ok(false);
        };
        let released = sem.permits.remove(&token).is_some_and(|e| e > now);
        sem.purge(now);
        let wake = self.settle_semaphore(&mut keys, key);
        drop(keys);
        if wake {
            self.inner.signals.wake(LockKind::Semaphore, key.as_bytes());
        }
        Ok(released)
    }

    async fn leave_permits(&self, key: &LockKey) -> Result<()> {
        let now = Instant::now();
        let mut keys = self.semaphores();
        let Some(sem) = keys.get_mut(key) else {
            return Ok(());
        };
        sem.waiting_until = None;
        sem.purge(now);
        let wake = self.settle_semaphore(&mut keys, key);
        drop(keys);
        if wake {
            self.inner.signals.wake(LockKind::Semaphore, key.as_bytes());
        }
        Ok(())
    }

    async fn renew_permit(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Renewal> {
        let now = Instant::now();
        let mut keys = self.semaphores();
        match keys
            .get_mut(key)
            .and_then(|sem| sem.permits.get_mut(&token))
        {
            Some(expires) if *expires > now => {
                *expires = now + ttl;
                Ok(Renewal::Renewed { waiting: 0 })
            }
            _ => Ok(Renewal::NotOwner),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LockBackend;

    #[tokio::test(start_paused = true)]
    async fn permits_expire_rearm_and_fix_n() {
        let b = MemoryBackend::new();
        let k = LockKey::from("k");
        let ttl = Duration::from_secs(1);
        let t: Vec<LeaseToken> = (0..4).map(|_| LeaseToken::random()).collect();
        let sem = b.semaphore().unwrap();
        // Three asked, two granted: the first two tokens.
        let p = sem
            .acquire_permits(&k, 2, &t[..3], ttl, WhenBusy::Queue)
            .await
            .unwrap();
        assert_eq!(p.granted, 2);
        assert_eq!(p.retry_in, ttl.min(WAITING_TTL / 3));
        // N is fixed while permits live.
        match sem
            .acquire_permits(&k, 3, &t[3..], ttl, WhenBusy::Queue)
            .await
        {
            Err(Error::PermitMismatch {
                permits: 2,
                requested: 3,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        // The same tokens again: re-armed, counted.
        tokio::time::advance(Duration::from_millis(600)).await;
        let p = sem
            .acquire_permits(&k, 2, &t[..1], ttl, WhenBusy::Queue)
            .await
            .unwrap();
        assert_eq!(p.granted, 1);
        tokio::time::advance(Duration::from_millis(600)).await;
        // t[1] expired; t[0] was re-armed.
        assert_eq!(
            sem.renew_permit(&k, t[1], ttl).await.unwrap(),
            Renewal::NotOwner
        );
        assert_eq!(
            sem.renew_permit(&k, t[0], ttl).await.unwrap(),
            Renewal::Renewed { waiting: 0 }
        );
        let p = sem
            .acquire_permits(&k, 2, &t[2..4], ttl, WhenBusy::Return)
            .await
            .unwrap();
        assert_eq!(p.granted, 1, "one permit came back at its TTL");
        // A release wakes the watchers; a second release of the same token is no-op.
        let mut w = b.signals().watch(LockKind::Semaphore, &k);
        assert!(sem.release_permit(&k, t[0]).await.unwrap());
        w.woken().await;
        assert!(!sem.release_permit(&k, t[0]).await.unwrap());
        assert!(sem.release_permit(&k, t[2]).await.unwrap());
        sem.leave_permits(&k).await.unwrap();
        assert!(b.semaphores().is_empty(), "no state left");
        // Nothing alive: N may change.
        let p = sem
            .acquire_permits(&k, 5, &t, ttl, WhenBusy::Return)
            .await
            .unwrap();
        assert_eq!(p.granted, 4);
        for token in &t {
            assert!(sem.release_permit(&k, *token).await.unwrap());
        }
        assert!(b.semaphores().is_empty());
    }
}
