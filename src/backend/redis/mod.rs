//! The Redis backend: one Redis server, a Redis Cluster, or a primary behind Sentinel.
//!
//! # Protocol
//!
//! Every name of a key shares one hash tag: the lock `<prefix>:{<key>}`, its fence
//! `<prefix>:{<key>}:fence`, its waiter queue `<prefix>:{<key>}:wq` (a sorted set by
//! enqueue time) with its expiry index `<prefix>:{<key>}:wqx` (the same members by
//! expiry time), its claim `<prefix>:{<key>}:claim`, and one release record per
//! released lease, `<prefix>:{<key>}:rel:<token>`; an election's leader record
//! `<prefix>:{<key>}:leader` and its observers `<prefix>:{<key>}:observers` (a
//! sorted set: an observing instance's channel by expiry). In `<key>` the bytes
//! `%`, `{` and `}` are percent-escaped, so binary keys cannot break the hash tag
//! or collide with each other. The scripts are single-slot by design, so the same
//! scripts run on one server, on a Redis
//! Cluster (feature `cluster`, see `RedisBackend::cluster`) and on a primary found
//! through sentinels (feature `sentinel`, see `RedisBackend::sentinel`).
//!
//! Each backend has a random instance id and **one** notification channel
//! `<prefix>:inst:<id>`, subscribed once on one pub/sub connection (the key of the
//! same name holds its card: name, host, process id, for `lockflight inspect`). A release
//! publishes the key, tagged with the kind of lock (see `notify`), on the channel of
//! the instance at the head of the key's queue and gives it a short claim window;
//! exactly one waiting instance is woken. If the
//! server refuses that `PUBLISH` (an ACL without the channel), the release still
//! happened: the claim is taken back, the failure is logged, and the waiters fall
//! back to their timers. A change of a leader record is published (tagged too) on
//! the channel of every instance registered as its observer; a refused one is
//! skipped, and that observer reads the record at its next periodic re-read.
//!
//! All operations are Lua scripts (`lua/*.lua`) run with `EVALSHA`, loaded by
//! [`connect`](RedisBackendBuilder::connect) and again on `NOSCRIPT`: one round trip
//! each. Each script does all its reads that can fail (a value of another type at
//! one of the key's names) before its first write, because Redis does not roll a
//! script back: a foreign value is reported as [`Error::ForeignValue`](crate::Error::ForeignValue) with nothing
//! changed.
//!
//! A successful release of any kind deletes the lease, then writes a short-lived
//! record of it under the lease's own token, so that a release repeated because its
//! reply was lost is reported as done, not as a loss, even if other instances took
//! and released the key meanwhile. The delete comes first: under `maxmemory` with
//! `noeviction` Redis refuses a script whose first write may grow memory, but not a
//! later write, so a release frees the lock even on a full server. The record lives
//! as long as the release schedule can repeat the release (see
//! [`RedisBackendBuilder::response_timeout`]).
//!
//! On Sentinel and on a cluster, a release that a failover may have lost (the old
//! primary took it, the promoted replica never got it) is repeated on the new
//! primary in the background, so the key is free again within about the failover
//! time instead of one lease TTL; a release deletes nothing but its own token's
//! lease, so repeating it is safe (`replay.rs` has the details and bounds).
//!
//! # Errors
//!
//! Server refusals that retrying at once will not change (`OOM`, `READONLY`, a script
//! error, `MISCONF`, `NOAUTH`, …) are [`Error::Refused`](crate::Error::Refused), ACL refusals
//! [`Error::NoPermission`](crate::Error::NoPermission), `WRONGTYPE` [`Error::ForeignValue`](crate::Error::ForeignValue); I/O errors, timeouts,
//! dropped connections and a server that is loading, busy or failing over
//! (`LOADING`, `BUSY`, `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`, and a `MOVED` or
//! `ASK` redirect the cluster client could not resolve within its retries) are
//! transient [`Error::Backend`](crate::Error::Backend).

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::Script;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{
    Acquire, LeaseToken, LockBackend, RecordFence, RecordState, Released, RenewItem, Renewal,
    Signals, WhenBusy,
};
use crate::error::{Phase, Result};
use crate::key::LockKey;

mod acked;
mod card;
mod client;
pub(crate) use client::nodelay_client;
#[cfg(feature = "cluster")]
mod cluster;
mod conn;
mod life;
pub(crate) mod names;
use names::Names;
mod notify;
#[cfg(feature = "cluster")]
mod owners;
mod renew;
mod replay;
mod rw;
mod semaphore;
#[cfg(feature = "sentinel")]
mod sentinel;
mod slots;

use acked::LeaseScript;
use client::Timeouts;
use conn::{Conn, Topology};
use notify::leader_message;

const PRELUDE: &str = include_str!("lua/queue.lua");
/// The semaphore scripts' helpers (after the prelude).
const SEM_COMMON: &str = include_str!("lua/sem_common.lua");
/// The renewal of one lease of each kind, as functions (after both of the above).
const RENEW_COMMON: &str = include_str!("lua/renew.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

/// A renewal script: the prelude, the semaphore helpers and `lua/renew.lua`, whose
/// functions the single renewals and the batch renewal share.
fn renewal_script(body: &str) -> Script {
    Script::new(&renewal_source(body))
}

/// The source of a renewal script (see [`renewal_script`]).
fn renewal_source(body: &str) -> String {
    format!("{PRELUDE}\n{SEM_COMMON}\n{RENEW_COMMON}\n{body}")
}

static ACQUIRE: LeaseScript = LeaseScript::grant(
    || life::gated(&[include_str!("lua/acquire.lua")]),
    acked::first_is_one,
);
static RELEASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/release.lua")));
static RENEW_LOCK: LeaseScript = LeaseScript::renewal(
    || renewal_script(include_str!("lua/renew_lock.lua")),
    acked::first_is_one,
);
static LEAVE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/leave.lua")));
/// The elections' leader records and their observers (they need no prelude: no
/// queue).
static LEADER_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/leader_write.lua")));
static LEADER_READ: LazyLock<Script> =
    LazyLock::new(|| Script::new("return redis.call('GET', KEYS[1])"));
static LEADER_CLEAR: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/leader_clear.lua")));
static LEADER_OBSERVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/leader_observe.lua")));
/// The idempotency records: fence, store and read (no prelude: a record is no
/// lease, and its fence orders its writers).
static RECORD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/record.lua")));

mod builder;
mod errors;
pub(crate) use errors::map_err;
mod inner;
mod replies;
#[cfg(test)]
mod tests;

pub use builder::RedisBackendBuilder;
use builder::{PROBE_KEY, millis};
use errors::*;
use replies::*;

/// A lock backend on one Redis server.
///
/// Cheap to clone; clones share the connection, the instance id and the
/// notification channel. Create **one per process** (per service instance): the
/// instance id is what the Redis queue orders and wakes.
///
/// ```no_run
/// # async fn demo() -> lockflight::Result<()> {
/// use lockflight::{Locker, RedisBackend};
///
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// let locker = Locker::builder(backend).build()?;
/// let guard = locker.lock("sku:555").await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # ACL
///
/// The minimal rights, for the default prefix `lockflight` (tested against Redis
/// 7.0; replace both patterns' `lockflight` with your prefix):
///
/// ```text
/// ACL SETUSER app on >password ~lockflight:* &lockflight:inst:* +evalsha +script|load +publish +subscribe +time +get +set +del +exists +pexpire +pttl +zcard +zscore +zrange +zrangebyscore +zremrangebyscore +zcount +zadd +zrem
/// ```
///
/// The commands after `+subscribe` are the ones the scripts run: Redis checks them
/// inside scripts too. [`connect`](RedisBackendBuilder::connect) checks `EVALSHA`,
/// `SCRIPT LOAD`, `PUBLISH`, `SUBSCRIBE` and both patterns; a user that lacks one of
/// the scripts' commands fails with [`Error::NoPermission`](crate::Error::NoPermission) at its first lock
/// operation instead. (The `CLIENT SETINFO` that the `redis` crate sends on each new
/// connection may be refused: its result is ignored.) With
/// [`replica_ack`](RedisBackendBuilder::replica_ack) the user also needs `+wait`;
/// without it, the first lease granted fails with
/// [`Error::NoPermission`](crate::Error::NoPermission).
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    target: String,
    prefix: String,
    instance_id: String,
    /// `instance_id` as a number: the high half of this instance's lease tokens.
    instance: u64,
    channel_prefix: String,
    /// This instance's channel, and the key of its card (`card.rs`).
    channel: String,
    /// The card's text.
    card: String,
    signals: Signals,
    claim_ttl_ms: u64,
    entry_ttl_ms: u64,
    entry_refresh: Duration,
    /// The connections of acknowledged writes, with `replica_ack`.
    /// Whether a mutex release grants the key to the next waiting instance (see
    /// `Inner::grants`).
    grants: bool,
    acks: Option<acked::Pool>,
    /// How long a release record lives: see `backend::schedule::release_record_ttl`.
    release_record_ttl_ms: u64,
    connection_timeout: Duration,
    subscriber: notify::Status,
    /// Recent releases, repeated on a new primary after a failover.
    replays: Arc<replay::Replays>,
    /// The server's life: a restart ends every lease at once (`life`).
    life: life::Life,
    /// The keys whose waiters ask again at a pace of their own (an election
    /// candidate's), with how many callers set it: see `LockBackend::pace_waits`.
    paces: Mutex<std::collections::HashMap<LockKey, (Duration, usize)>>,
    /// The notification task, restarted by `ensure_notifier` when it has ended.
    notifier: Mutex<Option<JoinHandle<()>>>,
    stop: CancellationToken,
    _stop: DropGuard,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("target", &self.inner.target)
            .field("prefix", &self.inner.prefix)
            .field("instance_id", &self.inner.instance_id)
            .finish()
    }
}

impl RedisBackend {
    /// Connects with default settings; see [`RedisBackend::builder`] for the others.
    ///
    /// The URL takes the `redis` crate's forms: `redis://[user:password@]host:port[/db]`,
    /// `rediss://…` with the `tls-rustls` feature, `redis+unix:///path`.
    ///
    /// # Errors
    ///
    /// As [`RedisBackendBuilder::connect`]: [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a malformed
    /// URL, [`Error::Connect`](crate::Error::Connect) when the server cannot be reached or authentication
    /// fails, [`Error::NoPermission`](crate::Error::NoPermission) when the ACL lacks a right.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempt.
    pub async fn connect(url: &str) -> Result<RedisBackend> {
        Self::builder(url).connect().await
    }

    /// Starts configuring a backend for `url`.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Topology::Single(url.into()))
    }

    /// Starts configuring a backend on one server through a `redis::Client` the
    /// application already built: its address, credentials, TLS settings,
    /// database and protocol are used as they are (with `TCP_NODELAY` on).
    /// lockflight opens its own connections from it (commands, its pub/sub
    /// subscription, acknowledged writes), so the application's connections are
    /// never blocked behind lock traffic, nor lock traffic behind them.
    ///
    /// **A `ConnectionManager` is not accepted**, on purpose: lockflight needs a
    /// pub/sub subscription and connections of its own (its commands; with
    /// [`replica_ack`](RedisBackendBuilder::replica_ack), connections whose
    /// `WAIT` counts only their own writes), and a `ConnectionManager` can open
    /// none of them (it is one multiplexed connection and exposes no client).
    /// Sharing it would also queue the application's commands behind lock traffic.
    /// Pass the `redis::Client` you built the manager from instead:
    /// `RedisBackend::from_client(client.clone())` next to
    /// `ConnectionManager::new(client)`. For a Redis Cluster, see
    /// `RedisBackend::from_cluster_client` (feature `cluster`).
    ///
    /// Build the client with the redis-rs that lockflight re-exports,
    /// [`lockflight::redis`](crate::redis): it is the version this function takes,
    /// whatever `redis` your own dependencies name.
    ///
    /// ```no_run
    /// # async fn run() -> lockflight::Result<()> {
    /// use lockflight::{Locker, RedisBackend};
    ///
    /// let client = lockflight::redis::Client::open("redis://127.0.0.1:6379/0")
    ///     .expect("a valid url");
    /// let backend = RedisBackend::from_client(client.clone()).prefix("billing").connect().await?;
    /// let locker = Locker::builder(backend).build()?;
    /// # let _ = locker;
    /// # Ok(()) }
    /// ```
    pub fn from_client(client: redis::Client) -> RedisBackendBuilder {
        let addr = client.get_connection_info().addr().to_string();
        RedisBackendBuilder::new(Topology::Client(Box::new(client), addr))
    }

    /// Starts configuring a backend on a Redis Cluster reached through `nodes`
    /// (URLs of any of its nodes; the others are discovered). Scripts are routed by
    /// their key's slot, `MOVED`/`ASK` redirects are followed and the topology is
    /// refreshed by the `redis` crate's cluster client; wake-ups use one classic
    /// pub/sub subscription on one node (see the module docs of the cluster mode in
    /// the crate's design notes). While leases may live, the backend reads the slot
    /// map (`CLUSTER SLOTS`) every 250 ms, so that a release acknowledged by a
    /// primary that then failed before its replica had it is repeated on the
    /// promoted replica.
    ///
    /// ```no_run
    /// # async fn demo() -> lockflight::Result<()> {
    /// use lockflight::{Locker, RedisBackend};
    ///
    /// let backend = RedisBackend::cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
    ///     .connect()
    ///     .await?;
    /// let locker = Locker::builder(backend).build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster<I, S>(nodes: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Topology::Cluster(
            nodes.into_iter().map(Into::into).collect(),
        ))
    }

    /// Starts configuring a backend on a Redis Cluster through a
    /// `redis::cluster::ClusterClient` the application already built: its retries, TLS
    /// settings, credentials, protocol and read routing are used for lockflight's
    /// commands (on a connection of lockflight's own, made from the client, with the
    /// builder's [`response_timeout`](RedisBackendBuilder::response_timeout) and
    /// [`connection_timeout`](RedisBackendBuilder::connection_timeout)).
    ///
    /// Pass the `nodes` you built the client from too, as URLs or
    /// `redis::ConnectionInfo`s with the same credentials and TLS settings: the
    /// instance's pub/sub subscriptions connect to the primaries `CLUSTER NODES` lists
    /// with the first node's, as [`cluster`](Self::cluster) does. A node that is not a
    /// valid connection info makes [`connect`](RedisBackendBuilder::connect) fail with
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig); so does
    /// [`replica_ack`](RedisBackendBuilder::replica_ack), as on every cluster backend.
    /// Set `TCP_NODELAY` on your client
    /// (`.tcp_settings(TcpSettings::default().set_nodelay(true))`) to keep lock round
    /// trips short.
    ///
    /// ```no_run
    /// # async fn demo() -> lockflight::Result<()> {
    /// use lockflight::{Locker, RedisBackend};
    ///
    /// let nodes = ["redis://app:pw@10.0.0.1:6379", "redis://app:pw@10.0.0.2:6379"];
    /// let client = lockflight::redis::cluster::ClusterClient::builder(nodes)
    ///     .retries(5)
    ///     .build()
    ///     .expect("valid nodes");
    /// let backend = RedisBackend::from_cluster_client(client, nodes)
    ///     .prefix("billing")
    ///     .connect()
    ///     .await?;
    /// let locker = Locker::builder(backend).build()?;
    /// # let _ = locker;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn from_cluster_client<I, T>(
        client: redis::cluster::ClusterClient,
        nodes: I,
    ) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        let infos: std::result::Result<Vec<redis::ConnectionInfo>, String> = nodes
            .into_iter()
            .map(|n| {
                n.into_connection_info()
                    .map_err(|e| format!("RedisBackend::from_cluster_client: a node is not a valid connection info: {e}"))
            })
            .collect();
        let addrs = infos
            .as_ref()
            .map(|infos| infos.iter().map(|i| i.addr().to_string()).collect())
            .unwrap_or_default();
        RedisBackendBuilder::new(Topology::ClusterClient(Box::new(client), infos, addrs))
    }
}

impl RedisBackend {
    /// Starts configuring a backend on the primary that the sentinels at
    /// `sentinels` (URLs; any of them may be down) name for `master`. The primary
    /// is looked up at connect, and again on `+switch-master`, on connection errors
    /// and on `READONLY`; a renewal answered `READONLY` by a demoted primary is a
    /// loss at once. See [`replica_ack`](RedisBackendBuilder::replica_ack) to
    /// narrow the window in which a failover loses a granted lock. A release that
    /// reached the old primary after the promotion (lost with the failover) is
    /// repeated on the new primary once the backend follows it, so the key is not
    /// held until the lease's TTL ends.
    ///
    /// A sentinel URL may carry the sentinels' own password
    /// (`redis://:password@host:26379`, for sentinels with `requirepass`): it is
    /// used for the lookups and the `+switch-master` subscriptions. The primary's
    /// username, password and database are given separately, with
    /// [`primary_connection_info`](RedisBackendBuilder::primary_connection_info):
    /// the sentinels name only its address.
    ///
    /// ```no_run
    /// # async fn demo() -> lockflight::Result<()> {
    /// use std::time::Duration;
    /// use lockflight::{Locker, RedisBackend};
    ///
    /// let backend = RedisBackend::sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .replica_ack(1, Duration::from_millis(100))
    /// .connect()
    /// .await?;
    /// let locker = Locker::builder(backend).build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel<I, S>(sentinels: I, master: impl Into<String>) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Topology::Sentinel(sentinel::SentinelSettings {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master: master.into(),
            primary: None,
        }))
    }
}

impl RedisBackend {
    /// Runs `lua/record.lua` on the idempotency record of `key` with `args`.
    async fn record(&self, key: &LockKey, phase: Phase, args: &[&[u8]]) -> Result<redis::Value> {
        let n = Names::new(&self.inner.prefix, key);
        self.inner
            .invoke(&RECORD, &[&n.record()], args)
            .await
            .map_err(|e| map_err(key, phase, e))
    }
}

impl RedisBackend {
    /// This instance's random id (its queue entries and its channel carry it).
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// The server the command connection talks to now, `host:port`: the server of
    /// a single-server backend, the current primary of a sentinel backend (it
    /// changes when the backend follows a failover), or `cluster` for a cluster
    /// backend (its commands go to the node of each key's slot).
    pub fn server(&self) -> String {
        self.inner.conn.server()
    }

    /// The Redis name of the lock of `key` (the Redlock quorum reads it on each node).
    pub(crate) fn lock_name(&self, key: &LockKey) -> Vec<u8> {
        Names::new(&self.inner.prefix, key).lock
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        self.inner.acquire(key, token, ttl, when_busy, None).await
    }

    /// A waiter of `key` then asks again within `pace` (not within a third of
    /// `queue_entry_ttl`), and its queue entry lives `queue_entry_ttl` + 2 ×
    /// `pace`, so that it keeps its place between two asks (the mutex; a
    /// candidate waits for a mutex lease).
    fn pace_waits(&self, key: &LockKey, pace: Option<Duration>) {
        let mut paces = self
            .inner
            .paces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match pace {
            Some(pace) => {
                let entry = paces.entry(key.clone()).or_insert((pace, 0));
                entry.0 = entry.0.max(pace);
                entry.1 += 1;
            }
            None => {
                if let Some(entry) = paces.get_mut(key) {
                    entry.1 = entry.1.saturating_sub(1);
                    if entry.1 == 0 {
                        paces.remove(key);
                    }
                }
            }
        }
    }

    /// The same script as [`acquire`](Self::acquire) with four more arguments: the
    /// age (µs), and the claim TTL, channel prefix and wake-up message with which it wakes
    /// the earliest waiter of a free lock that nobody was told to take.
    async fn acquire_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
        age: Duration,
    ) -> Result<Acquire> {
        self.inner
            .acquire(key, token, ttl, when_busy, Some(age))
            .await
    }

    fn supports_fair(&self) -> bool {
        true
    }

    /// This instance's id in the high half, so that a lock key names its holder.
    fn new_token(&self) -> LeaseToken {
        LeaseToken::for_instance(self.inner.instance)
    }

    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        self.inner.release(key, token, None).await
    }

    /// The release script with two more arguments: the waiter's age (µs) and the
    /// queue entry TTL; it requeues this instance before choosing whom to wake.
    async fn release_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        next_waiter_age: Duration,
    ) -> Result<Released> {
        self.inner.release(key, token, Some(next_waiter_age)).await
    }

    async fn renew(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        let inner = &*self.inner;
        let n = Names::new(&inner.prefix, key);
        let ttl_ms = millis(ttl);
        let fence_ttl_ms = (ttl_ms.saturating_mul(10)).max(60_000);
        let reply = inner
            .invoke_lease(
                &RENEW_LOCK,
                &[&n.lock, &n.fence, &n.queue, &n.queue_expiry],
                &[
                    token.to_hex().as_bytes(),
                    ttl_ms.to_string().as_bytes(),
                    fence_ttl_ms.to_string().as_bytes(),
                    inner.instance_id.as_bytes(),
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Renewing, e))?;
        decode_renewal(key, &reply)
    }

    /// Up to 500 leases of any kinds per script call (`lua/renew_batch.lua`), per
    /// cluster slot on a Cluster; see the watchdog's docs.
    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<Renewal>> {
        self.renew_all(items).await
    }

    async fn leave(&self, key: &LockKey) -> Result<()> {
        self.inner.leave(key, false).await.map(drop)
    }

    /// Publishes a leader message to the record's live observers when the record
    /// changes (`lua/leader_write.lua`).
    async fn write_leader(&self, key: &LockKey, record: &[u8], ttl: Duration) -> Result<bool> {
        let n = Names::new(&self.inner.prefix, key);
        let reply = self
            .inner
            .invoke(
                &LEADER_WRITE,
                &[&n.leader(), &n.observers()],
                &[
                    record,
                    millis(ttl).to_string().as_bytes(),
                    &leader_message(key),
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Renewing, e))?;
        Ok(matches!(reply, redis::Value::Int(1)))
    }

    async fn read_leader(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        let n = Names::new(&self.inner.prefix, key);
        let reply = self
            .inner
            .invoke(&LEADER_READ, &[&n.leader()], &[])
            .await
            .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        match reply {
            redis::Value::BulkString(bytes) => Ok(Some(bytes)),
            redis::Value::Nil => Ok(None),
            other => Err(unexpected(key, Phase::Acquiring, &other)),
        }
    }

    /// Publishes a leader message to the record's live observers when it deletes
    /// the record (`lua/leader_clear.lua`).
    async fn clear_leader(&self, key: &LockKey, record: &[u8]) -> Result<bool> {
        let n = Names::new(&self.inner.prefix, key);
        let reply = self
            .inner
            .invoke(
                &LEADER_CLEAR,
                &[&n.leader(), &n.observers()],
                &[record, &leader_message(key)],
            )
            .await
            .map_err(|e| map_err(key, Phase::Releasing, e))?;
        Ok(matches!(reply, redis::Value::Int(1)))
    }

    /// Registers this instance's channel in the record's observers
    /// (`lua/leader_observe.lua`), with an expiry in the server's clock, and
    /// starts the notification task if it is not running (on a new runtime).
    async fn observe_leader(&self, key: &LockKey, ttl: Duration) -> Result<()> {
        self.inner.ensure_notifier();
        let n = Names::new(&self.inner.prefix, key);
        self.inner
            .invoke(
                &LEADER_OBSERVE,
                &[&n.observers()],
                &[
                    self.inner.channel.as_bytes(),
                    millis(ttl).to_string().as_bytes(),
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        Ok(())
    }

    /// `lua/record.lua`'s fence: one script call.
    async fn fence_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        retention: Duration,
    ) -> Result<RecordState> {
        let (epoch, seq, ms) = (
            fence.0.to_string(),
            fence.1.to_string(),
            millis(retention).max(1).to_string(),
        );
        let reply = self
            .record(
                key,
                Phase::Acquiring,
                &[b"fence", epoch.as_bytes(), seq.as_bytes(), ms.as_bytes()],
            )
            .await?;
        match reply {
            redis::Value::Array(items) => match items.as_slice() {
                [redis::Value::Int(1)] => Ok(RecordState::Fenced),
                [redis::Value::Int(0)] => Ok(RecordState::Stale),
                [redis::Value::Int(2), redis::Value::BulkString(response)] => {
                    Ok(RecordState::Stored(response.clone()))
                }
                _ => Err(unexpected(
                    key,
                    Phase::Acquiring,
                    &redis::Value::Array(items),
                )),
            },
            other => Err(unexpected(key, Phase::Acquiring, &other)),
        }
    }

    /// `lua/record.lua`'s store: one script call.
    async fn store_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        response: &[u8],
        retention: Duration,
    ) -> Result<bool> {
        let (epoch, seq, ms) = (
            fence.0.to_string(),
            fence.1.to_string(),
            millis(retention).max(1).to_string(),
        );
        let args: [&[u8]; 5] = [
            b"store",
            epoch.as_bytes(),
            seq.as_bytes(),
            ms.as_bytes(),
            response,
        ];
        match self.record(key, Phase::Writing, &args).await? {
            redis::Value::Int(stored) => Ok(stored == 1),
            other => Err(unexpected(key, Phase::Writing, &other)),
        }
    }

    /// `lua/record.lua`'s read: one script call.
    async fn read_record(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        match self.record(key, Phase::Acquiring, &[b"read"]).await? {
            redis::Value::BulkString(bytes) => Ok(Some(bytes)),
            redis::Value::Nil => Ok(None),
            other => Err(unexpected(key, Phase::Acquiring, &other)),
        }
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
