//! The simulated server: the locks every instance shares, the faults turned on,
//! the outages, the release records and the request counters.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::backend::SimBackend;
use super::fault::{FaultBuilder, Message, MessageFault, Op, RequestFault, Rules};
use super::fence::{Resources, SimFencedKey};
use crate::backend::{LeaseToken, LockKind, MemoryBackend, WakeRegistry};
use crate::error::{Error, Result};
use crate::key::LockKey;

/// How long the server remembers a release, for a repeated release of the same
/// lease to report it (as the Redis scripts' release records do).
const RECORD_TTL: Duration = Duration::from_secs(11);

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

/// How many requests of each kind reached the server (or an instance), whatever
/// happened to them: a failed or unanswered request counts.
///
/// Each request is one round trip to Redis, except renewals: the watchdog
/// renews a locker's due leases together, which Redis does in one script call
/// per batch and the kit counts per lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Requests {
    /// Acquires ([`Op::Acquire`]).
    pub acquire: u64,
    /// Renewals, one per lease ([`Op::Renew`]).
    pub renew: u64,
    /// Releases ([`Op::Release`]).
    pub release: u64,
    /// Waiters leaving a queue ([`Op::Leave`]).
    pub leave: u64,
    /// Leader record writes, reads and deletes ([`Op::Leader`]).
    pub leader: u64,
    /// Requests of fenced keys ([`Op::Fenced`]): counted by the server only, as
    /// they come from no instance.
    pub fenced: u64,
}

impl Requests {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.acquire + self.renew + self.release + self.leave + self.leader + self.fenced
    }
}

/// Request counters, one per [`Op`].
#[derive(Debug, Default)]
pub(super) struct Counters([AtomicU64; Op::ALL.len()]);

impl Counters {
    pub(super) fn count(&self, op: Op) {
        self.0[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> Requests {
        let [acquire, renew, release, leave, leader, fenced] =
            Op::ALL.map(|op| self.0[op.index()].load(Ordering::Relaxed));
        Requests {
            acquire,
            renew,
            release,
            leave,
            leader,
            fenced,
        }
    }
}

/// One instance's end of the server: its identity, its message channel (the
/// registry its lockers wait on) and its counters.
#[derive(Debug)]
pub(super) struct Instance {
    pub(super) id: u64,
    pub(super) wakeups: WakeRegistry,
    pub(super) requests: Counters,
}

/// An outage: until when, and whether requests hang (rather than fail) until then.
#[derive(Clone, Copy, Debug)]
struct Outage {
    until: Instant,
    hang: bool,
}

/// What every handle of one server shares.
#[derive(Debug)]
pub(super) struct Shared {
    /// The locks: every instance's backend is a clone of it. Its epochs are
    /// floored by the server's clock: Tokio's, from the server's creation.
    pub(super) memory: MemoryBackend,
    /// The fenced keys' values, fences and write records.
    pub(super) resources: Resources,
    pub(super) rules: Rules,
    instances: Mutex<Vec<Weak<Instance>>>,
    outage: Mutex<Option<Outage>>,
    /// Released lease tokens, until when their record lives.
    records: Mutex<HashMap<LeaseToken, Instant>>,
    pub(super) requests: Counters,
    last_instance: AtomicU64,
    /// After a restart, until when nothing is granted (as a Redis restarted
    /// without its data quarantines its grants: `backend/redis/life.rs`).
    quarantine: Mutex<Option<Instant>>,
    /// The longest lease TTL asked for, in ms: the quarantine after a restart.
    longest_ttl_ms: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            memory: MemoryBackend::with_virtual_clock(),
            resources: Resources::default(),
            rules: Rules::default(),
            instances: Mutex::default(),
            outage: Mutex::default(),
            records: Mutex::default(),
            requests: Counters::default(),
            last_instance: AtomicU64::default(),
            quarantine: Mutex::default(),
            longest_ttl_ms: AtomicU64::default(),
        }
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
            wakeups: WakeRegistry::new(),
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
    /// [`Error::InvalidKey`] when the name is empty, longer than
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
    /// [`Error::InvalidKey`] for a key that no lock may have.
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
            instance.wakeups.restarted(|_| true);
            instance.wakeups.wake_all();
        }
    }

    /// Makes the server unreachable for `duration` of Tokio's clock: every request
    /// sent until then fails at once with [`Error::Backend`] and changes nothing.
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

impl Shared {
    fn instances(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Instance>>> {
        self.instances.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Option<Outage>> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseToken, Instant>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instances still in use.
    pub(super) fn live(&self) -> Vec<Arc<Instance>> {
        self.instances().iter().filter_map(Weak::upgrade).collect()
    }

    /// Serves an `op` request for `key` (an instance has counted it as its own
    /// already): counted, then failed, delayed or applied (`apply`) as the
    /// server's outage and faults say.
    pub(super) async fn serve<T>(
        &self,
        op: Op,
        key: &LockKey,
        apply: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.requests.count(op);
        match self.admit(op, key).await? {
            None => apply.await,
            Some(RequestFault::Fail) => Err(unreachable(op, key, "the request was lost")),
            Some(RequestFault::LoseReply) => {
                let _applied = apply.await;
                Err(unreachable(op, key, "the reply was lost"))
            }
        }
    }

    /// What happens to an `op` request for `key`: an outage makes it fail or wait;
    /// otherwise a fault may strike it.
    async fn admit(&self, op: Op, key: &LockKey) -> Result<Option<RequestFault>> {
        let outage = *self.outage();
        if let Some(Outage { until, hang }) = outage.filter(|o| o.until > Instant::now()) {
            if !hang {
                return Err(unreachable(op, key, "the server is unreachable"));
            }
            tokio::time::sleep_until(until).await;
        }
        Ok(self.rules.request(op, key))
    }

    /// A lease of `ttl` is asked for: a restart holds grants that long.
    pub(super) fn note_lease(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.longest_ttl_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long grants still wait after a restart (`None`: they do not).
    pub(super) fn held(&self) -> Option<Duration> {
        let until = *self.quarantine.lock().unwrap_or_else(|e| e.into_inner());
        until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|wait| !wait.is_zero())
    }

    /// Remembers the release of `token`.
    pub(super) fn record_release(&self, token: LeaseToken) {
        let now = Instant::now();
        let mut records = self.records();
        records.retain(|_, until| *until > now);
        records.insert(token, now + RECORD_TTL);
    }

    /// Whether a release of `token` is remembered.
    pub(super) fn was_released(&self, token: LeaseToken) -> bool {
        self.records()
            .get(&token)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Delivers a wake-up of the `kind` lock of `key` to every instance. An
    /// instance that waits for it may have it dropped or delayed by a fault; one
    /// that does not only sees its wake-up generation move.
    pub(super) fn wake(&self, kind: LockKind, key: &LockKey) {
        for instance in self.live() {
            let fault = if instance.wakeups.is_watched(kind, key.as_bytes()) {
                self.rules.message(Message::Wakeup, key)
            } else {
                None
            };
            deliver(fault, &instance, key, move |i, k| {
                i.wakeups.wake(kind, k.as_bytes());
            });
        }
    }

    /// Tells every instance that the leader record of `key` changed, as the
    /// record scripts' message does on Redis (to every instance: a message to an
    /// instance that does not observe the key is ignored there).
    pub(super) fn leader_changed(&self, key: &LockKey) {
        for instance in self.live() {
            instance.wakeups.leader_changed(key.as_bytes());
        }
    }

    /// Delivers a revocation of `key`'s mutex lease to the instance `id` (the
    /// holder's), unless a fault drops or delays it.
    pub(super) fn revoke(&self, id: u64, key: &LockKey) {
        if let Some(instance) = self.live().into_iter().find(|i| i.id == id) {
            let fault = self.rules.message(Message::Revocation, key);
            deliver(fault, &instance, key, |i, k| {
                i.wakeups.revoke(k.as_bytes());
            });
        }
    }
}

/// Delivers a message to `instance` now, later or never, as `fault` says.
fn deliver(
    fault: Option<MessageFault>,
    instance: &Arc<Instance>,
    key: &LockKey,
    send: impl FnOnce(&Instance, &LockKey) + Send + 'static,
) {
    match fault {
        None => send(instance, key),
        Some(MessageFault::Drop) => {}
        Some(MessageFault::Delay(by)) => {
            let (instance, key) = (Arc::downgrade(instance), key.clone());
            crate::runtime::spawn(async move {
                tokio::time::sleep(by).await;
                if let Some(instance) = instance.upgrade() {
                    send(&instance, &key);
                }
            });
        }
    }
}

/// The error of a request that got no answer.
fn unreachable(op: Op, key: &LockKey, what: &'static str) -> Error {
    Error::backend(
        key,
        op.phase(),
        std::io::Error::new(std::io::ErrorKind::ConnectionReset, what),
    )
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::backend::{Acquire, LockBackend, WhenBusy};

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

        let mut at_holder = a.wakeups().watch_revocation(&k);
        let mut elsewhere = c.wakeups().watch_revocation(&k);
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
        let mut b_waits = b.wakeups().watch(LockKind::Mutex, &k);
        let mut c_waits = c.wakeups().watch(LockKind::Mutex, &k);
        let before = idle.wakeups().generation(LockKind::Mutex, b"k");
        let released = a.release(&k, ta).await.unwrap();
        assert!(released.released);
        assert_eq!(released.waiting, 2, "b and c wait");
        assert!(b_waits.woken().now_or_never().is_none(), "b's copy dropped");
        assert!(c_waits.woken().now_or_never().is_some(), "c's delivered");
        assert_ne!(
            idle.wakeups().generation(LockKind::Mutex, b"k"),
            before,
            "an instance that does not wait still sees the generation move"
        );
        assert_eq!(server.requests().acquire, 2);
        assert_eq!(a.requests().release, 1);
    }
}
