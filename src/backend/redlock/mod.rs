//! The Redlock backend: one lock over N ≥ 3 independent Redis primaries.
//!
//! # Protocol
//!
//! Each node is a [`RedisBackend`] of its own (its Lua scripts, its queue of waiting
//! instances, its claim windows and release records, its one pub/sub channel), so
//! every per-node step is the single-node protocol, one round trip each. On top:
//!
//! * **acquire**: acquire-or-enqueue on every node in parallel, each bounded by the
//!   node timeout. With a majority of "acquired" replies and a remaining validity
//!   `ttl − elapsed − drift` of at least half the TTL, the fence write-back round
//!   runs (below). Otherwise the lock is released on every node that granted it or
//!   whose reply was lost or late (a node that answered "busy" did not write), and
//!   the caller is told the key is busy (the nodes that answered are enough for a
//!   majority: contention or a split vote, retry after a randomized delay) or
//!   [`Error::QuorumNotReached`] (too few nodes answered for a majority to be
//!   possible). The elapsed time counts from when the requests were sent.
//! * **renew**: on every node; renewed when a majority re-armed it, lost
//!   (not the owner) when too many nodes say "not yours" for a majority to be
//!   possible, else [`Error::QuorumNotReached`] (the watchdog retries it until the
//!   lease's validity ends).
//! * **release**: on every node (the key's wake node last, see below); `released`
//!   when a majority confirms it, `false`
//!   when a majority cannot (too many "not yours"), else a transient
//!   [`Error::Backend`] so that the locker retries it.
//!
//! # Rounds: a token of their own
//!
//! One acquire of the locker may take several rounds (a busy answer, a split vote,
//! too few nodes answering), all for one lease token. Each round asks the nodes
//! with a **round token** (`rounds.rs`): the previous round's as long as no
//! release of it was sent (that round was granted, or its future dropped before it
//! ended: asking again re-grants what it may hold), and a fresh one after a round
//! that ended without a grant, whose token is retired before the release of what
//! it took is sent, and released with its record like any lease. The lease's
//! renew and release go to the round token that was granted. So every round
//! token obeys the single-node rule (never granted again once a release of it was
//! sent), and a failed round's release that lands late, after a later round was
//! granted on that node, deletes nothing: the lock there is held under another
//! token (ARCHITECTURE.md, "The order of requests", says what one token for every
//! round allowed; `model.rs` explores both). The price: until a failed
//! round's release lands, its grant keeps that node busy for the later rounds too,
//! and a grant whose release is lost stays until its TTL, as one of a crashed
//! instance does.
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
//! Tokens then strictly increase per key (model-checked in `model.rs`, with expiry,
//! message loss and restarts), also across a node's data loss, **provided the nodes'
//! clocks agree to within much less than one TTL and never step back**: the same
//! clock assumption as the single-node backend's across data loss.
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
//! queue-entry refresh interval). Every wake-up here is the mutex's: Redlock has neither
//! read-write locks nor semaphores, and only the nodes' mutex wake-ups are
//! forwarded.
//!
//! # Restarts without persistence: the delayed-restart rule
//!
//! A node that restarts with an empty dataset has forgotten the locks it granted.
//! If it grants again at once, a second instance can assemble a majority from it
//! and the nodes the first holder did not reach: **two holders at once**. A
//! restarted node must therefore stay out for at least the longest lease TTL in
//! use before it serves locks again. Each node is a [`RedisBackend`], whose grants
//! pass the server's life gate, so the backend keeps that rule itself: the first
//! instance that knew the node before its restart and reaches it again writes a
//! quarantine, and the node grants nothing to anyone until one lease TTL after the
//! restart (the test `a_node_restarted_empty_quarantines_its_grants_for_a_ttl`). An
//! instance that started after the restart and asks that node first is not held:
//! to close that too, keep a restarted node out (stopped, paused or firewalled)
//! for one TTL, or run it with AOF `appendfsync always`.
//!
//! # Costs
//!
//! N requests per acquire (plus N for the write-back), N per release and N per
//! renewal, all in parallel: one round trip of the slowest node in the majority
//! each. With handoff, one lease serves many critical sections, so the requests per
//! critical section stay a small fraction of N.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::Signals;
use super::redis::{RedisBackend, RedisBackendBuilder};
use crate::error::{Error, Result};

mod builder;
mod lock_backend;
#[cfg(test)]
mod model;
mod quorum;
mod rounds;
mod wake;

pub use builder::RedlockBackendBuilder;
use rounds::RoundTokens;
use wake::Forwarders;

static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/fence.lua")));

/// The most nodes a [`RedlockBackend`] takes (wake-ups are counted in a bit set).
pub const MAX_NODES: usize = 63;

/// A lock backend over N ≥ 3 independent Redis primaries (Redlock), with fencing
/// tokens that stay monotonic under quorums.
///
/// See the [module docs](self) for the protocol, the fencing write-back round and
/// its clock assumption, and the wake-ups. Create **one per process**; clones share
/// everything.
///
/// # The delayed-restart rule
///
/// A node restarted without persistence must not serve locks for one lease TTL,
/// or it can grant a lock that is still held, and two instances hold it at once.
/// The node's own grants wait that long once an instance that knew it before the
/// restart reaches it (see the module docs); an instance started after the
/// restart is not held back, so keep a restarted node out that long where that
/// matters.
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

struct Inner {
    nodes: Vec<Node>,
    quorum: usize,
    node_timeout: Duration,
    retry_delay: Duration,
    signals: Signals,
    /// The round token each lease is known by at the nodes.
    rounds: RoundTokens,
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
