//! The simulated server: the handle tests hold, over what its instances share
//! (`shared.rs`): instances, faults, outages, a restart, the request counters.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::backend::SimBackend;
use super::fault::FaultBuilder;
use super::fence::SimFencedKey;
use super::requests::{Counters, Requests};
use super::shared::{Instance, Outage, Shared};
use crate::backend::Signals;
use crate::error::Result;
use crate::key::LockKey;

/// A simulated lock server on Tokio's clock, with fault knobs: a stand-in for
/// Redis in tests of code that holds locks.
///
/// Every [`backend`](Self::backend) is a new instance over the same locks, so
/// [`Locker`](crate::Locker)s built on two of them contend as two processes
/// would. The server itself is a handle: clones share the locks, the faults and
/// the counters. See [the module docs](super) for what it models.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use lockflight::Locker;
/// use lockflight::testing::SimServer;
///
/// let server = SimServer::new();
/// let a = Locker::builder(server.backend()).build()?;
/// let b = Locker::builder(server.backend()).build()?;
/// let guard = a.lock("sku:555").await?;
/// assert!(b.try_lock("sku:555").await?.is_none());
/// guard.release().await?;
/// assert_eq!(server.requests().acquire, 2);
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct SimServer {
    shared: Arc<Shared>,
}

impl fmt::Debug for SimServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimServer")
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}
impl SimServer {
    /// A server with no locks, no faults and no instances.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new instance of this server, to build a [`Locker`](crate::Locker) on: its
    /// own identity, its own message channel and its own
    /// [`requests`](SimBackend::requests), over the locks of every instance.
    pub fn backend(&self) -> SimBackend {
        let id = self.shared.last_instance.fetch_add(1, Ordering::Relaxed) + 1;
        let me = Arc::new(Instance {
            id,
            signals: Signals::new(),
            requests: Counters::default(),
        });
        let mut instances = self.shared.instances();
        instances.retain(|i| i.strong_count() > 0);
        instances.push(Arc::downgrade(&me));
        drop(instances);
        SimBackend::new(Arc::clone(&self.shared), me)
    }

    /// The fenced resource `resource` on this server: see [`SimFencedKey`]. Keys of
    /// one name on one server are one resource.
    ///
    /// # Errors
    ///
    /// As [`FencedKey::new`](crate::fence::FencedKey::new):
    /// [`Error::InvalidKey`](crate::error::Error::InvalidKey) when the name is empty, longer than
    /// [`LockKey::MAX_LEN`], or has no hash tag but contains `}`.
    pub fn fenced_key(&self, resource: impl Into<Vec<u8>>) -> Result<SimFencedKey> {
        SimFencedKey::on(Arc::clone(&self.shared), resource.into())
    }

    /// Starts turning on a fault; see [`FaultBuilder`].
    pub fn fault(&self) -> FaultBuilder<'_> {
        FaultBuilder::new(&self.shared.rules)
    }

    /// Turns off every fault (an outage included). Messages already delayed are
    /// still delivered late, and requests already hanging still wait for the end
    /// of their outage.
    pub fn clear_faults(&self) {
        self.shared.rules.clear();
        *self.shared.outage() = None;
    }

    /// Deletes every lock of the key string `key` (its mutex lease, its
    /// read-write lock, its semaphore's permits), as a failover to a replica that
    /// had not received them, or an eviction, would: nobody is told. The holders
    /// learn it at their next renewal; waiters ask again when their last answer
    /// told them to. Fencing keeps its rule: the next lease's token is greater
    /// than every earlier one. Returns whether a live lease was deleted.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`](crate::error::Error::InvalidKey) for a key that no lock may have.
    pub fn lose_lease(&self, key: impl Into<LockKey>) -> Result<bool> {
        let key = key.into();
        key.validate()?;
        Ok(self.shared.memory.evict(&key))
    }

    /// Restarts the server without persistence: every lease, queue, release
    /// record and leader record is gone, and so is every
    /// [fenced key](Self::fenced_key)'s value, fence and write record (after the
    /// restart any token is accepted until one is written, as by a `FencedKey`
    /// on a Redis without persistence). As on Redis (the server's life), every
    /// lease of every instance is lost at once, with a reason that says so, and
    /// nothing is granted to anyone until the longest lease TTL asked for so far
    /// has passed since the restart; every instance reconnects (its waiters ask
    /// again at once, and are answered busy until then). Fencing tokens keep
    /// increasing across the restart (see the module docs for how this compares
    /// with Redis).
    pub fn restart(&self) {
        self.shared.memory.flush();
        self.shared.resources.clear();
        self.shared.records().clear();
        let longest = Duration::from_millis(self.shared.longest_ttl_ms.load(Ordering::Relaxed));
        *self
            .shared
            .quarantine
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + longest);
        for instance in self.shared.live() {
            instance.signals.restarted(|_| true);
            instance.signals.wake_all();
        }
    }

    /// Makes the server unreachable for `duration` of Tokio's clock: every request
    /// sent until then fails at once with [`Error::Backend`](crate::error::Error::Backend) and changes nothing.
    pub fn unreachable_for(&self, duration: Duration) {
        self.outage(duration, false);
    }

    /// Makes the server hang for `duration` of Tokio's clock: every request sent
    /// until then waits for the end of the outage, then is served (a network
    /// partition that heals). lockflight's own deadlines (a renewal's, a wait
    /// timeout) still run out while it waits.
    pub fn hang_for(&self, duration: Duration) {
        self.outage(duration, true);
    }

    /// The requests of every instance so far.
    pub fn requests(&self) -> Requests {
        self.shared.requests.snapshot()
    }

    fn outage(&self, duration: Duration, hang: bool) {
        *self.shared.outage() = Some(Outage {
            until: Instant::now() + duration,
            hang,
        });
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::backend::{Acquire, LockBackend, LockKind, WhenBusy};
    use crate::testing::Message;

    /// A revocation goes to the holder's instance only; a wake-up goes to every
    /// waiting instance, and a wake-up fault counts the copies to waiting
    /// instances only (an instance that does not wait is not a delivery to drop).
    /// Replies count the other waiting instances, as Redis counts its queue.
    #[tokio::test(start_paused = true)]
    async fn messages_reach_the_right_instances_and_faults_count_deliveries() {
        let server = SimServer::new();
        let (a, b, c, idle) = (
            server.backend(),
            server.backend(),
            server.backend(),
            server.backend(),
        );
        let (k, ttl) = (LockKey::from("k"), Duration::from_secs(3));
        let ta = a.new_token();
        let granted = a.acquire(&k, ta, ttl, WhenBusy::Queue).await.unwrap();
        assert!(matches!(granted, Acquire::Acquired { waiting: 0, .. }));

        let mut at_holder = a.signals().watch_revocation(&k);
        let mut elsewhere = c.signals().watch_revocation(&k);
        let busy = b.acquire(&k, b.new_token(), ttl, WhenBusy::Queue).await;
        assert!(matches!(busy, Ok(Acquire::Busy { .. })), "{busy:?}");
        assert!(
            at_holder.revoked().now_or_never().is_some(),
            "the holder is told"
        );
        assert!(
            elsewhere.revoked().now_or_never().is_none(),
            "only the holder"
        );

        server
            .fault()
            .next(1)
            .drop_message(Message::Wakeup)
            .unwrap();
        let mut b_waits = b.signals().watch(LockKind::Mutex, &k);
        let mut c_waits = c.signals().watch(LockKind::Mutex, &k);
        let before = idle.signals().generation(LockKind::Mutex, b"k");
        let released = a.release(&k, ta).await.unwrap();
        assert!(released.released);
        assert_eq!(released.waiting, 2, "b and c wait");
        assert!(b_waits.woken().now_or_never().is_none(), "b's copy dropped");
        assert!(c_waits.woken().now_or_never().is_some(), "c's delivered");
        assert_ne!(
            idle.signals().generation(LockKind::Mutex, b"k"),
            before,
            "an instance that does not wait still sees the generation move"
        );
        assert_eq!(server.requests().acquire, 2);
        assert_eq!(a.requests().release, 1);
    }
}
