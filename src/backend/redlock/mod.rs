//! The Redlock backend: one lock over N ≥ 3 independent Redis primaries.
//!
//! # Protocol
//!
//! Each node is a [`RedisBackend`] of its own (its Lua scripts, its queue of waiting
//! instances, its claim windows and release tombstones, its one pub/sub channel), so
//! every per-node step is the single-node protocol, one round trip each. On top:
//!
//! * **acquire**: acquire-or-enqueue on every node in parallel, each bounded by the
//!   node timeout. With a majority of "acquired" replies and a remaining validity
//!   `ttl − elapsed − drift` of at least half the TTL, the fence write-back round
//!   runs (below). Otherwise the lock is released on every node that granted it or
//!   whose reply was lost or late (a node that answered "busy" did not write), and
//!   the caller is told [`Acquire::Busy`] (the nodes that answered are enough for a
//!   majority: contention or a split vote, retry after a randomized delay) or
//!   [`Error::QuorumNotReached`] (too few nodes answered for a majority to be
//!   possible). The elapsed time counts from when the requests were sent.
//! * **extend**: on every node; extended when a majority re-armed it, lost
//!   ([`Extend::NotOwner`]) when too many nodes say "not yours" for a majority to be
//!   possible, else [`Error::QuorumNotReached`] (the watchdog retries it until the
//!   lease's validity ends).
//! * **release**: on every node (the key's wake node last, see below); `released`
//!   when a majority confirms it, `false`
//!   when a majority cannot (too many "not yours"), else a transient
//!   [`Error::Backend`] so that the locker retries it.
//!
//! # Fencing: a conditional write-back round
//!
//! A per-node maximum of fence counters is **not** monotonic under quorums (nodes
//! A = 10, B = 1, C = 1: a grant on {A, B} gets max(11, 2) = 11; the next on {B, C}
//! gets max(3, 2) = 3). So a grant is made only after a second round: with the
//! epochs `e_i` the granting nodes minted (each `max(fence_i + 1, server TIME in
//! µs)`, the single-node rule), the token is `t = max e_i`, and `fence := max(fence,
//! t)` is written back on the granting nodes **only where this token still owns the
//! lock** (`lua/fence.lua`). The lock is granted only if a majority confirms the
//! write-back, and still with half its validity left.
//!
//! Why it is monotonic (model-checked in `model.rs`, with expiry, message loss and
//! restarts): two grants' write-back majorities share a node; there both tokens
//! owned the lock at their write-back, at disjoint times, so the later one's acquire
//! on that node read a fence of at least the earlier token and minted more. A grant
//! also requires validity left, so a token whose lock expired on that node cannot be
//! granted after the other. If every shared node lost its data (a restart without
//! persistence, or the fence key's own TTL ran out), the server-TIME floor takes
//! over: with the delayed-restart rule the later acquire happens at least one TTL
//! after the restart, so its epoch exceeds the earlier token **provided the nodes'
//! clocks agree to within much less than one TTL and never step back** (and fewer
//! than one grant per µs, so counters do not run ahead of the clocks). That is the
//! same clock assumption as the single-node backend's across data loss.
//!
//! # Wake-ups
//!
//! Each key has one **wake node**, chosen by the key's hash so that every instance
//! agrees. Only there does a waiting instance join the queue (the single-node
//! notify-one protocol: a FIFO of instances, a claim window for the woken one, one
//! message on its channel); on the other nodes it asks without queueing. A release
//! goes to the other nodes first and then to the wake node, whose release wakes the
//! head of its queue: by then a majority is free for it, and its claim keeps the
//! wake node (and so any majority) from the others for a moment. The woken
//! instance's locker simply retries the acquire; a wake-up that turns out spurious
//! only causes a retry. Without a wake-up (the wake node down, a lost message) the
//! waiters fall back to their retry timers (the nodes' remaining TTL, at most the
//! queue-entry refresh interval).
//!
//! Why not queue on every node: each node's queue orders the instances by its own
//! arrival times, so after one release the nodes wake *different* instances and
//! give each a claim on a minority; nobody reaches a majority until the claims
//! expire (measured: ~100 critical sections/s over 5 nodes at P = 4, T = 64). One
//! ordering node keeps the notify-one property and costs one request per release
//! more in latency (the wake node's release is sent after the others' replies).

//! # Restarts without persistence: the delayed-restart rule
//!
//! A node that restarts with an empty dataset has forgotten the locks it granted.
//! If it grants again at once, a second instance can assemble a majority from it
//! and the nodes the first holder did not reach: **two holders at once** (the test
//! `restart_without_delay_double_grants` shows it). A restarted node must therefore
//! stay out (not started, or firewalled, or paused) for at least the longest lease
//! TTL in use before it serves locks again; with AOF `appendfsync always` the rule
//! is not needed. This backend cannot enforce it: operate the nodes accordingly.
//!
//! # Costs
//!
//! N requests per acquire (plus N for the write-back), N per release and N per
//! renewal, all in parallel: one round trip of the slowest node in the majority
//! each. With handoff, one lease serves many critical sections, so the requests per
//! critical section stay a small fraction of N.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use futures::future::join_all;
use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::redis::{RedisBackend, RedisBackendBuilder};
use super::{Acquire, Extend, LeaseToken, LockBackend, Released, WakeRegistry, Wakeup};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

#[cfg(test)]
mod model;

static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/fence.lua")));

/// The most nodes a [`RedlockBackend`] takes (wake-ups are counted in a bit set).
pub const MAX_NODES: usize = 63;

/// Settings of a [`RedlockBackend`]; see [`RedlockBackend::builder`].
#[derive(Clone)]
#[must_use]
pub struct RedlockBackendBuilder {
    urls: Vec<String>,
    prefix: String,
    node_timeout: Duration,
    connection_timeout: Duration,
    retry_delay: Duration,
}

impl fmt::Debug for RedlockBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Node builders redact passwords in their own Debug.
        let nodes: Vec<_> = self
            .urls
            .iter()
            .map(|u| format!("{:?}", RedisBackend::builder(u.clone())))
            .collect();
        f.debug_struct("RedlockBackendBuilder")
            .field("nodes", &nodes)
            .field("prefix", &self.prefix)
            .field("node_timeout", &self.node_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("retry_delay", &self.retry_delay)
            .finish()
    }
}

impl RedlockBackendBuilder {
    /// Default bound on one node's reply.
    pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);
    /// Default bound on establishing a connection to a node.
    pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
    /// Default mean delay before retrying after a split vote.
    pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(20);

    /// Prefix of every Redis name on every node (default `lockflight`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bound on one node's reply (default 200 ms). A node that does not answer in
    /// time counts as not granting, and whatever it may have done is released. Keep
    /// it small against the lease TTL: the validity left after an acquire is
    /// `ttl − elapsed − drift`.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Bound on establishing a connection to a node (default 2 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Mean delay before retrying after a split vote (default 20 ms); each retry
    /// waits a random time between half and one and a half times it.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    fn validate(&self) -> Result<()> {
        let n = self.urls.len();
        if !(3..=MAX_NODES).contains(&n) {
            return Err(Error::config(format!(
                "redlock needs between 3 and {MAX_NODES} independent nodes, got {n}"
            )));
        }
        if self.node_timeout < Duration::from_millis(1) {
            return Err(Error::config(format!(
                "redlock node_timeout is {:?}, it must be at least 1ms",
                self.node_timeout
            )));
        }
        if self.retry_delay < Duration::from_millis(1) {
            return Err(Error::config(format!(
                "redlock retry_delay is {:?}, it must be at least 1ms",
                self.retry_delay
            )));
        }
        Ok(())
    }

    /// Connects to every node (each as a [`RedisBackend`], with its checks) and
    /// opens one more connection per node for the fence write-back.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidConfig`] for fewer than 3 (or more than [`MAX_NODES`])
    ///   nodes, a malformed URL or setting;
    /// * the first error of a node that cannot be connected, as
    ///   [`RedisBackendBuilder::connect`]: every node must be reachable at start
    ///   (nodes that go down later are tolerated while a majority is up).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempts; nothing is left behind.
    pub async fn connect(self) -> Result<RedlockBackend> {
        self.validate()?;
        let nodes = join_all(self.urls.iter().map(|url| self.connect_node(url))).await;
        let nodes = nodes.into_iter().collect::<Result<Vec<_>>>()?;
        let stop = CancellationToken::new();
        let quorum = nodes.len() / 2 + 1;
        Ok(RedlockBackend {
            inner: Arc::new(Inner {
                nodes,
                quorum,
                node_timeout: self.node_timeout,
                retry_delay: self.retry_delay,
                wakeups: WakeRegistry::new(),
                forwarders: Arc::default(),
                stop: stop.clone(),
                _stop: stop.drop_guard(),
            }),
        })
    }

    async fn connect_node(&self, url: &str) -> Result<Node> {
        let backend = RedisBackend::builder(url)
            .prefix(self.prefix.clone())
            .response_timeout(self.node_timeout)
            .connection_timeout(self.connection_timeout)
            .connect()
            .await?;
        let target = format!("{backend:?}");
        let client = redis::Client::open(url)
            .map_err(|e| Error::config(format!("redis url of node {target}: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.node_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| Error::Connect {
                target: target.clone(),
                source: Arc::new(e),
            })?;
        let mut load = conn.clone();
        FENCE
            .prepare_invoke()
            .load_async(&mut load)
            .await
            .map_err(|e| Error::Connect {
                target,
                source: Arc::new(e),
            })?;
        Ok(Node { backend, conn })
    }
}

/// A lock backend over N ≥ 3 independent Redis primaries (Redlock), with fencing
/// tokens that stay monotonic under quorums.
///
/// See the [module docs](self) for the protocol, the fencing write-back round and
/// its clock assumption, and the wake-ups. Create **one per process**; clones share
/// everything.
///
/// # The delayed-restart rule
///
/// A node restarted without persistence must not serve locks for one lease TTL
/// (keep it stopped, paused or firewalled that long). Otherwise it can grant a lock
/// that is still held, and two instances hold it at once.
///
/// ```no_run
/// # async fn demo() -> lockflight::Result<()> {
/// use lockflight::{Locker, backend::RedlockBackend};
///
/// let backend = RedlockBackend::connect([
///     "redis://10.0.0.1:6379",
///     "redis://10.0.0.2:6379",
///     "redis://10.0.0.3:6379",
/// ])
/// .await?;
/// let locker = Locker::builder(backend).build()?;
/// let guard = locker.lock("sku:555").await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Node {
    backend: RedisBackend,
    /// For the fence write-back script.
    conn: ConnectionManager,
}

type Forwarders = DashMap<LockKey, Arc<Forwarder>>;

struct Inner {
    nodes: Vec<Node>,
    quorum: usize,
    node_timeout: Duration,
    retry_delay: Duration,
    wakeups: WakeRegistry,
    /// Per key this instance waits for: the task forwarding its wake node's
    /// wake-ups.
    forwarders: Arc<Forwarders>,
    stop: CancellationToken,
    _stop: DropGuard,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field(
                "nodes",
                &self
                    .inner
                    .nodes
                    .iter()
                    .map(|n| &n.backend)
                    .collect::<Vec<_>>(),
            )
            .field("quorum", &self.inner.quorum)
            .finish()
    }
}

/// One node's outcome of a round.
enum Outcome<T> {
    Ok(T),
    Failed(Error),
    /// No reply within the node timeout.
    TimedOut,
}

impl RedlockBackend {
    /// Connects to `urls` with default settings; see [`RedlockBackend::builder`].
    ///
    /// # Errors
    ///
    /// As [`RedlockBackendBuilder::connect`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempts.
    pub async fn connect<I, S>(urls: I) -> Result<RedlockBackend>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder(urls).connect().await
    }

    /// Starts configuring a backend over the nodes at `urls` (at least 3, each an
    /// independent primary, not replicas of each other).
    pub fn builder<I, S>(urls: I) -> RedlockBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBackendBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            prefix: RedisBackendBuilder::DEFAULT_PREFIX.to_owned(),
            node_timeout: RedlockBackendBuilder::DEFAULT_NODE_TIMEOUT,
            connection_timeout: RedlockBackendBuilder::DEFAULT_CONNECTION_TIMEOUT,
            retry_delay: RedlockBackendBuilder::DEFAULT_RETRY_DELAY,
        }
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes must agree: a majority, `nodes / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The per-node backends, in the order of the URLs given.
    pub fn node_backends(&self) -> impl Iterator<Item = &RedisBackend> {
        self.inner.nodes.iter().map(|n| &n.backend)
    }
}

impl Inner {
    /// Runs `op` on every node in parallel, each bounded by the node timeout.
    async fn round<'a, T, F, Fut>(&'a self, key: &LockKey, phase: Phase, op: F) -> Vec<Outcome<T>>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let timeout = self.node_timeout;
        join_all(self.nodes.iter().map(|node| {
            let fut = op(node);
            async move {
                match tokio::time::timeout(timeout, fut).await {
                    Ok(Ok(v)) => Outcome::Ok(v),
                    Ok(Err(e)) => Outcome::Failed(e),
                    Err(_) => {
                        tracing::debug!(%key, %phase, node = ?node.backend, "redlock: no reply within {timeout:?}");
                        Outcome::TimedOut
                    }
                }
            }
        }))
        .await
    }

    /// The fence write-back on one node: `Ok(true)` if `token` owns the lock there
    /// and its fence is now at least `epoch`.
    async fn write_back(
        &self,
        node: &Node,
        key: &LockKey,
        token: LeaseToken,
        epoch: u64,
        fence_ttl_ms: u64,
    ) -> Result<bool> {
        let lock = node.backend.lock_name(key);
        let fence = [&lock[..], b":fence"].concat();
        let mut conn = node.conn.clone();
        let reply: i64 = FENCE
            .key(lock)
            .key(fence)
            .arg(token.to_hex())
            .arg(epoch.to_string())
            .arg(fence_ttl_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| Error::Backend {
                key: key.clone(),
                phase: Phase::Acquiring,
                source: Arc::new(e),
            })?;
        Ok(reply == 1)
    }

    /// Releases `token` on the nodes `which`, in parallel, ignoring the outcomes (a
    /// failed release expires with the TTL).
    async fn release_on(&self, key: &LockKey, token: LeaseToken, which: &[usize]) {
        let timeout = self.node_timeout;
        join_all(which.iter().map(|&i| {
            let node = &self.nodes[i];
            async move {
                match tokio::time::timeout(timeout, node.backend.release(key, token)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::debug!(%key, error = %e, "redlock: releasing a partial grant failed"),
                    Err(_) => tracing::debug!(%key, "redlock: releasing a partial grant timed out"),
                }
            }
        }))
        .await;
    }

    /// A random delay around the retry delay (half to one and a half times it).
    fn jitter(&self) -> Duration {
        let base = self.retry_delay.as_micros() as u64;
        let r = rand::random::<u64>() % base.max(1);
        Duration::from_micros(base / 2 + r)
    }

    /// The node whose queue orders the waiting instances of `key` and whose
    /// release wakes the next one: chosen by the key's hash, so every instance
    /// agrees.
    fn wake_node(&self, key: &LockKey) -> usize {
        (crate::routing::key_hash(key.as_bytes()) % self.nodes.len() as u64) as usize
    }

    /// Starts forwarding the wake-ups of `key` from its wake node unless that is
    /// already under way. `before` are the nodes' wake-up generations read before
    /// the acquire was sent: if the wake node's moved, it may have woken us before
    /// we watched it, and that counts as a wake-up.
    fn watch_nodes(&self, key: &LockKey, before: &[u64]) {
        if let Some(f) = self.forwarders.get(key)
            && !f.stop.is_cancelled()
        {
            return;
        }
        let forwarder = Arc::new(Forwarder {
            woken: AtomicU64::new(0),
            stop: self.stop.child_token(),
        });
        let w = self.wake_node(key);
        let registry = self.nodes[w].backend.wakeups();
        let watches: Vec<Wakeup> = vec![registry.watch(key)];
        let mut count = 0;
        if registry.generation(key.as_bytes()) != before[w] {
            count = forwarder.mark(0);
        }
        if let Some(old) = self.forwarders.insert(key.clone(), Arc::clone(&forwarder)) {
            old.stop.cancel();
        }
        if count >= WAKE_THRESHOLD {
            forwarder.woken.store(0, Ordering::Release);
            self.wakeups.wake(key.as_bytes());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(forward(
            key.clone(),
            forwarder,
            watches,
            WAKE_THRESHOLD,
            self.wakeups.clone(),
            Arc::clone(&self.forwarders),
        ));
    }

    /// One acquire round (and write-back round); also says whether a node failed
    /// fast with a transient error.
    async fn acquire_once(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
    ) -> (Result<Acquire>, bool) {
        let inner = self;
        let before: Vec<u64> = inner
            .nodes
            .iter()
            .map(|node| node.backend.wakeups().generation(key.as_bytes()))
            .collect();
        if let Some(f) = inner.forwarders.get(key) {
            f.woken.store(0, Ordering::Release);
        }
        let sent_at = Instant::now();
        let wake = &inner.nodes[inner.wake_node(key)];
        let outcomes = inner
            .round(key, Phase::Acquiring, |node| {
                // Only the wake node queues this instance (and may give it a claim).
                let queue = queue && std::ptr::eq(node, wake);
                node.backend.acquire(key, token, ttl, queue)
            })
            .await;
        let mut granted = Vec::new(); // (node, epoch, waiting)
        let mut busy = Vec::new(); // retry_in
        let mut unknown = Vec::new(); // node indices that may hold it
        let mut definite = Vec::new();
        let mut fast = false;
        for (i, o) in outcomes.into_iter().enumerate() {
            match o {
                Outcome::Ok(Acquire::Acquired { epoch, waiting }) => {
                    granted.push((i, epoch, waiting))
                }
                Outcome::Ok(Acquire::Busy { retry_in }) => busy.push(retry_in),
                Outcome::Failed(e) => {
                    if is_definite(&e) {
                        definite.push(e);
                    } else {
                        fast = true;
                    }
                    // A definite refusal wrote nothing; releasing it is harmless.
                    unknown.push(i);
                }
                Outcome::TimedOut => unknown.push(i),
            }
        }
        let validity = |now: Instant| ttl.saturating_sub(now - sent_at).saturating_sub(drift(ttl));
        if granted.len() >= inner.quorum && validity(Instant::now()) >= ttl / 2 {
            let epoch = granted.iter().map(|g| g.1).max().unwrap_or(0);
            let waiting = granted.iter().map(|g| g.2).max().unwrap_or(0);
            let fence_ttl = fence_ttl_ms(ttl);
            let written = join_all(granted.iter().map(|&(i, _, _)| {
                let node = &inner.nodes[i];
                async move {
                    tokio::time::timeout(
                        inner.node_timeout,
                        inner.write_back(node, key, token, epoch, fence_ttl),
                    )
                    .await
                }
            }))
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(Ok(true))))
            .count();
            if written >= inner.quorum && validity(Instant::now()) >= ttl / 2 {
                inner.unwatch_nodes(key);
                return (Ok(Acquire::Acquired { epoch, waiting }), fast);
            }
            tracing::debug!(%key, written, "redlock: the fence write-back reached no majority in time");
        }
        // Not granted: release wherever it may be held.
        let mut holders: Vec<usize> = granted.iter().map(|g| g.0).collect();
        holders.extend_from_slice(&unknown);
        holders.sort_unstable();
        inner.release_on(key, token, &holders).await;
        if granted.len() + busy.len() >= inner.quorum {
            let retry_in = if granted.is_empty() && busy.len() >= inner.quorum {
                // Held elsewhere: a majority may be free when the quorum-th
                // earliest node frees it.
                busy.sort_unstable();
                busy[inner.quorum - 1] + inner.jitter() / 4
            } else {
                inner.jitter()
            };
            if queue {
                inner.watch_nodes(key, &before);
            }
            return (Ok(Acquire::Busy { retry_in }), fast);
        }
        if definite.len() >= inner.quorum
            && let Some(e) = definite.into_iter().next()
        {
            return (Err(e), fast);
        }
        (
            Err(Error::QuorumNotReached {
                key: key.clone(),
                phase: Phase::Acquiring,
                granted: granted.len(),
                needed: inner.quorum,
            }),
            fast,
        )
    }

    /// Stops counting the wake-ups of `key` (acquired, or no longer wanted).
    fn unwatch_nodes(&self, key: &LockKey) {
        if let Some((_, f)) = self.forwarders.remove(key) {
            f.stop.cancel();
        }
    }
}

/// The wake-up count of one waited-for key.
struct Forwarder {
    /// Bit i: watched node i has woken this instance since its last attempt.
    woken: AtomicU64,
    stop: CancellationToken,
}

impl Forwarder {
    /// Marks node `i` as having woken us; returns how many nodes have.
    fn mark(&self, i: usize) -> usize {
        let bit = 1u64 << i;
        ((self.woken.fetch_or(bit, Ordering::AcqRel) | bit).count_ones()) as usize
    }
}

/// Wake-ups of the wake node that wake this backend's watchers.
const WAKE_THRESHOLD: usize = 1;

/// How often a forwarder checks whether anyone still waits for its key.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Counts the watched nodes' wake-ups of `key` (today: the key's wake node only);
/// wakes this backend's watchers of `key` when `threshold` nodes have woken it
/// since the last attempt. Ends when stopped, or when nobody here watches the key
/// any more.
async fn forward(
    key: LockKey,
    forwarder: Arc<Forwarder>,
    mut watches: Vec<Wakeup>,
    threshold: usize,
    registry: WakeRegistry,
    forwarders: Arc<Forwarders>,
) {
    let mut idle = tokio::time::interval_at(Instant::now() + IDLE_CHECK, IDLE_CHECK);
    loop {
        let any = futures::future::select_all(watches.iter_mut().map(|w| Box::pin(w.woken())));
        tokio::select! {
            _ = forwarder.stop.cancelled() => break,
            (_, i, _) = any => {
                if forwarder.mark(i) >= threshold {
                    forwarder.woken.store(0, Ordering::Release);
                    registry.wake(key.as_bytes());
                }
            }
            _ = idle.tick() => {
                if !registry.is_watched(key.as_bytes()) {
                    break;
                }
            }
        }
    }
    forwarder.stop.cancel();
    forwarders.remove_if(&key, |_, f| Arc::ptr_eq(f, &forwarder));
}

/// Fence keys live this long (as on a single node): `max(10 × ttl, 60 s)`.
fn fence_ttl_ms(ttl: Duration) -> u64 {
    ((ttl.as_millis() as u64).max(1).saturating_mul(10)).max(60_000)
}

/// The drift margin of a validity window (as the locker's leases).
fn drift(ttl: Duration) -> Duration {
    super::drift(ttl)
}

/// Whether `e` is a definite refusal that retrying at once will not change.
fn is_definite(e: &Error) -> bool {
    matches!(
        e,
        Error::ForeignValue { .. } | Error::NoPermission { .. } | Error::Refused { .. }
    )
}

#[async_trait]
impl LockBackend for RedlockBackend {
    /// Acquire-or-enqueue on every node; granted after a majority and the fence
    /// write-back round (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`Error::QuorumNotReached`] when too few nodes answered for a majority to be
    /// possible (after releasing what the others granted); a node's definite
    /// refusal ([`Error::ForeignValue`], [`Error::NoPermission`],
    /// [`Error::Refused`]) when a majority of nodes refused that way.
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
    ) -> Result<Acquire> {
        // A node that fails fast (its connection is being re-established after a
        // restart or a reset) is asked again, within one node timeout; a node that
        // does not answer in time is not.
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        loop {
            let (result, fast_failures) = self.inner.acquire_once(key, token, ttl, queue).await;
            match result {
                Err(Error::QuorumNotReached { .. })
                    if fast_failures && start.elapsed() + pause < self.inner.node_timeout =>
                {
                    tokio::time::sleep(pause).await;
                    pause *= 3;
                }
                other => return other,
            }
        }
    }

    /// Releases on every node (the holder's wake-up goes out on each).
    ///
    /// # Errors
    ///
    /// A transient [`Error::Backend`] when neither a majority of releases nor a
    /// majority of "not yours" was confirmed (nodes unreachable): retrying
    /// reconciles it, as the nodes' tombstones recognise a repeated release.
    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        let inner = &*self.inner;
        // The other nodes first, then the wake node, whose release wakes the next
        // waiting instance: by then a majority is free for it.
        let wake = &inner.nodes[inner.wake_node(key)];
        let mut outcomes = inner
            .round(key, Phase::Releasing, |node| {
                let skip = std::ptr::eq(node, wake);
                async move {
                    if skip {
                        Ok(Released {
                            released: false,
                            waiting: 0,
                        })
                    } else {
                        node.backend.release(key, token).await
                    }
                }
            })
            .await;
        let w = inner.wake_node(key);
        outcomes[w] = match tokio::time::timeout(
            inner.node_timeout,
            wake.backend.release(key, token),
        )
        .await
        {
            Ok(Ok(r)) => Outcome::Ok(r),
            Ok(Err(e)) => Outcome::Failed(e),
            Err(_) => Outcome::TimedOut,
        };
        let (mut released, mut not_owner, mut waiting) = (0, 0, 0);
        for o in &outcomes {
            if let Outcome::Ok(r) = o {
                waiting = waiting.max(r.waiting);
                if r.released {
                    released += 1;
                } else {
                    not_owner += 1;
                }
            }
        }
        if released >= inner.quorum {
            return Ok(Released {
                released: true,
                waiting,
            });
        }
        if not_owner > inner.nodes.len() - inner.quorum {
            return Ok(Released {
                released: false,
                waiting,
            });
        }
        Err(Error::backend(
            key,
            Phase::Releasing,
            format!(
                "redlock: the release was confirmed on {released} nodes and refused on {not_owner}; {} of {} are needed",
                inner.quorum,
                inner.nodes.len()
            ),
        ))
    }

    /// Extends on every node.
    ///
    /// # Errors
    ///
    /// [`Error::QuorumNotReached`] (phase renewing) when fewer than a majority
    /// extended and not enough nodes answered "not yours" to call it lost.
    async fn extend(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Extend> {
        let inner = &*self.inner;
        let outcomes = inner
            .round(key, Phase::Renewing, |node| {
                node.backend.extend(key, token, ttl)
            })
            .await;
        let (mut extended, mut not_owner, mut waiting) = (0, 0, 0);
        for o in &outcomes {
            match o {
                Outcome::Ok(Extend::Extended { waiting: w }) => {
                    extended += 1;
                    waiting = waiting.max(*w);
                }
                Outcome::Ok(Extend::NotOwner) => not_owner += 1,
                Outcome::Failed(_) | Outcome::TimedOut => {}
            }
        }
        if extended >= inner.quorum {
            return Ok(Extend::Extended { waiting });
        }
        if not_owner > inner.nodes.len() - inner.quorum {
            return Ok(Extend::NotOwner);
        }
        Err(Error::QuorumNotReached {
            key: key.clone(),
            phase: Phase::Renewing,
            granted: extended,
            needed: inner.quorum,
        })
    }

    /// Leaves the queue of `key` (on its wake node, the only one that queues).
    ///
    /// # Errors
    ///
    /// The wake node's error, or a transient [`Error::Backend`] when it does not
    /// answer in time (queue entries expire on their own).
    async fn leave(&self, key: &LockKey) -> Result<()> {
        let inner = &*self.inner;
        inner.unwatch_nodes(key);
        // Only the wake node queues waiting instances.
        let wake = &inner.nodes[inner.wake_node(key)];
        match tokio::time::timeout(inner.node_timeout, wake.backend.leave(key)).await {
            Ok(result) => result,
            Err(_) => Err(Error::backend(
                key,
                Phase::Acquiring,
                format!(
                    "redlock: no reply to the leave from {:?} within {:?}",
                    wake.backend, inner.node_timeout
                ),
            )),
        }
    }

    fn wakeups(&self) -> &WakeRegistry {
        &self.inner.wakeups
    }
}
