//! A wake-up that races with a Busy reply is not lost: the leader registers for
//! wake-ups only after it is told to wait, and must notice one that arrived while
//! its request was in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockflight::backend::{Acquire, Extend, LeaseToken, Released, WakeRegistry};
use lockflight::{LockBackend, LockKey, Locker};

/// Answers the first acquire with Busy and a far-away retry time, after waking the
/// key as a release by another instance would at that very moment; grants the next.
#[derive(Debug, Default)]
struct RacingRelease {
    wakeups: WakeRegistry,
    acquires: AtomicU32,
}

#[async_trait]
impl LockBackend for RacingRelease {
    async fn acquire(
        &self,
        key: &LockKey,
        _token: LeaseToken,
        _ttl: Duration,
        _queue: bool,
    ) -> lockflight::Result<Acquire> {
        if self.acquires.fetch_add(1, Ordering::SeqCst) == 0 {
            self.wakeups.wake(key.as_bytes());
            return Ok(Acquire::Busy {
                retry_in: Duration::from_secs(60),
            });
        }
        Ok(Acquire::Acquired {
            epoch: 1,
            waiting: 0,
        })
    }
    async fn release(&self, _key: &LockKey, _token: LeaseToken) -> lockflight::Result<Released> {
        Ok(Released {
            released: true,
            waiting: 0,
        })
    }
    async fn extend(
        &self,
        _key: &LockKey,
        _token: LeaseToken,
        _ttl: Duration,
    ) -> lockflight::Result<Extend> {
        Ok(Extend::Extended { waiting: 0 })
    }
    async fn leave(&self, _key: &LockKey) -> lockflight::Result<()> {
        Ok(())
    }
    fn wakeups(&self) -> &WakeRegistry {
        &self.wakeups
    }
}

#[tokio::test]
async fn a_wake_up_during_the_busy_reply_is_not_lost() {
    for coalescing in [true, false] {
        let backend = Arc::new(RacingRelease::default());
        let locker = Locker::builder(Arc::clone(&backend))
            .wait_timeout(Duration::from_secs(30))
            .coalescing(coalescing)
            .build()
            .unwrap();
        let started = Instant::now();
        let guard = locker.lock("k").await.expect("lock");
        // Woken by the missed wake-up's trace, not by the 60 s retry timer.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(backend.acquires.load(Ordering::SeqCst), 2);
        guard.release().await.unwrap();
        assert!(
            backend.wakeups().is_empty(),
            "the wake-up registration leaked"
        );
    }
}
