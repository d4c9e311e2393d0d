//! The Redis backend: one Redis server, a Redis Cluster, or a primary behind Sentinel.
//!
//! # Protocol
//!
//! Every name of a key shares one hash tag: the lock `<prefix>:{<key>}`, its fence
//! `<prefix>:{<key>}:fence`, its waiter queue `<prefix>:{<key>}:wq` (a sorted set by
//! enqueue time) with its expiry index `<prefix>:{<key>}:wqx` (the same members by
//! expiry time), its claim `<prefix>:{<key>}:claim` and its release tombstone
//! `<prefix>:{<key>}:rel`. In `<key>` the bytes `%`, `{` and `}` are percent-escaped,
//! so binary keys cannot break the hash tag or collide with each other. The scripts
//! are single-slot by design, so the same scripts run on one server, on a Redis
//! Cluster (feature `cluster`, see `RedisBackend::cluster`) and on a primary found
//! through sentinels (feature `sentinel`, see `RedisBackend::sentinel`).
//!
//! The queue had been a hash at `<prefix>:{<key>}:q` before; the sorted sets have
//! new names so that instances of both versions never meet a value of the wrong
//! type during a rolling upgrade: they still exclude each other through the same
//! lock, fence, claim and tombstone, but do not see each other's queue entries
//! (waiters of the other version fall back to their retry timers).
//!
//! Each backend has a random instance id and **one** notification channel
//! `<prefix>:inst:<id>`, subscribed once on one pub/sub connection. A release
//! publishes the key on the channel of the instance at the head of the key's queue
//! and gives it a short claim window; exactly one waiting instance is woken. If the
//! server refuses that `PUBLISH` (an ACL without the channel), the release still
//! happened: the claim is taken back, the failure is logged, and the waiters fall
//! back to their timers.
//!
//! All operations are Lua scripts (`lua/*.lua`) run with `EVALSHA`, loaded by
//! [`connect`](RedisBackendBuilder::connect) and again on `NOSCRIPT`: one round trip
//! each. Each script does all its reads that can fail (a value of another type at
//! one of the key's names) before its first write, because Redis does not roll a
//! script back: a foreign value is reported as [`Error::ForeignValue`] with nothing
//! changed.
//!
//! A successful release leaves a short-lived tombstone holding its token, so that a
//! release repeated because its reply was lost is reported as done, not as a loss.
//!
//! # Errors
//!
//! Server refusals that retrying at once will not change (`OOM`, `READONLY`, a script
//! error, `MISCONF`, `NOAUTH`, …) are [`Error::Refused`], ACL refusals
//! [`Error::NoPermission`], `WRONGTYPE` [`Error::ForeignValue`]; I/O errors, timeouts,
//! dropped connections and a server that is loading, busy or failing over
//! (`LOADING`, `BUSY`, `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`, and a `MOVED` or
//! `ASK` redirect the cluster client could not resolve within its retries) are
//! transient [`Error::Backend`].

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, Script, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Acquire, Extend, LeaseToken, LockBackend, Released, WakeRegistry};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

#[cfg(feature = "cluster")]
mod cluster;
mod conn;
mod notify;
mod rw;
mod semaphore;
#[cfg(feature = "sentinel")]
mod sentinel;

use conn::{Conn, Timeouts, Topology};

const PRELUDE: &str = include_str!("lua/queue.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/release.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/extend.lua")));
static LEAVE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/leave.lua")));

/// The key `connect` runs the extend script on (with a random token: it writes
/// nothing) to check the key permissions: `<prefix>:{lockflight-probe}`.
const PROBE_KEY: &str = "lockflight-probe";

/// Settings of a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Clone)]
#[must_use]
pub struct RedisBackendBuilder {
    topology: Topology,
    replica_ack: Option<(u32, Duration)>,
    prefix: String,
    response_timeout: Duration,
    connection_timeout: Duration,
    claim_ttl: Duration,
    queue_entry_ttl: Duration,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field(
                "urls",
                &self
                    .topology
                    .urls()
                    .into_iter()
                    .map(redact)
                    .collect::<Vec<_>>(),
            )
            .field("prefix", &self.prefix)
            .field("replica_ack", &self.replica_ack)
            .field("response_timeout", &self.response_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("claim_ttl", &self.claim_ttl)
            .field("queue_entry_ttl", &self.queue_entry_ttl)
            .finish()
    }
}

/// Hides the password of a `redis://user:password@host` URL.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl RedisBackendBuilder {
    /// Default key prefix.
    pub const DEFAULT_PREFIX: &'static str = "lockflight";
    /// Default bound on one reply (queueing included).
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
    /// Default bound on establishing a connection.
    pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
    /// Default claim window given to the woken instance.
    pub const DEFAULT_CLAIM_TTL: Duration = Duration::from_millis(500);
    /// Default lifetime of a queue entry; waiting instances refresh it at a third of it.
    pub const DEFAULT_QUEUE_ENTRY_TTL: Duration = Duration::from_secs(3);

    /// Prefix of every Redis name (default `lockflight`). It must not be empty nor
    /// contain `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bound on one reply, time spent queued on the connection included (default
    /// 2 s). A lock operation whose reply is late is reconciled by repeating it; so
    /// that a repeated release is recognised, a release leaves a tombstone for
    /// `max(2 × response_timeout, 1 s)`.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Bound on establishing a connection (default 2 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long the instance woken by a release has the lock reserved for it
    /// (default 500 ms). If that instance died, others wait at most this long.
    pub fn claim_ttl(mut self, ttl: Duration) -> Self {
        self.claim_ttl = ttl;
        self
    }

    /// How long a waiting instance's queue entry lives without a refresh (default
    /// 3 s); waiters refresh it every third of that, and a crashed instance drops
    /// out of the queue after it.
    pub fn queue_entry_ttl(mut self, ttl: Duration) -> Self {
        self.queue_entry_ttl = ttl;
        self
    }

    /// Replica acknowledgement: after an acquire or a renewal writes the lock, wait
    /// (`WAIT replicas timeout`, on the same connection, in the same pipeline) until
    /// at least `replicas` replicas have the write. An acquire that fewer replicas
    /// acknowledged is not granted: it fails with [`Error::Refused`] with code
    /// `NOREPLICAS`, and the locker releases the lock it wrote. A renewal that fewer
    /// replicas acknowledged counts as failed: it is retried until the lease's
    /// validity ends, then the lease is lost.
    ///
    /// What it guarantees: a granted lease (and each renewal that counted) was on
    /// at least `replicas` replicas when it was granted. What it does not: Redis
    /// replication stays asynchronous, and a failover may still promote a replica
    /// that missed the write (Sentinel does not promote the most up-to-date replica
    /// by the writes *you* care about, and the replica may lose the write on restart
    /// without persistence); it narrows the failover window, it does not close it.
    /// It costs one more reply per acquire and renewal, as long as the slowest of
    /// the `replicas` fastest replicas takes.
    ///
    /// For one server and for sentinel mode; a cluster backend refuses it (its
    /// `WAIT` would not follow the key's slot).
    pub fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_ack = Some((replicas, timeout));
        self
    }

    fn validate(&self) -> Result<()> {
        if let Some((replicas, timeout)) = self.replica_ack {
            if replicas == 0 || timeout < Duration::from_millis(1) {
                return Err(Error::config(format!(
                    "redis replica_ack({replicas}, {timeout:?}): needs at least 1 replica and 1 ms"
                )));
            }
            #[cfg(feature = "cluster")]
            if matches!(self.topology, Topology::Cluster(_)) {
                return Err(Error::config(
                    "redis replica_ack is not supported on a cluster backend",
                ));
            }
        }
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            return Err(Error::config(format!(
                "redis prefix {:?} must be non-empty and contain no '{{' or '}}'",
                self.prefix
            )));
        }
        for (name, d, min) in [
            (
                "response_timeout",
                self.response_timeout,
                Duration::from_millis(1),
            ),
            (
                "connection_timeout",
                self.connection_timeout,
                Duration::from_millis(1),
            ),
            ("claim_ttl", self.claim_ttl, Duration::from_millis(1)),
            (
                "queue_entry_ttl",
                self.queue_entry_ttl,
                Duration::from_millis(30),
            ),
        ] {
            if d < min {
                return Err(Error::config(format!(
                    "redis {name} is {d:?}, it must be at least {min:?}"
                )));
            }
        }
        Ok(())
    }

    /// Connects, then checks that the server lets this backend do its work: loads
    /// the scripts (`SCRIPT LOAD`), runs the extend script once on the probe key
    /// `<prefix>:{lockflight-probe}` (with a random token, so it writes nothing),
    /// waits for the notification subscription (`SUBSCRIBE`) and publishes one empty
    /// message on this instance's channel (`PUBLISH`). A backend that connects is
    /// one whose password and ACL rules work; see [`RedisBackend`] for the minimal
    /// ACL rules.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidConfig`] for a malformed URL or setting;
    /// * [`Error::Connect`] if the server cannot be reached or the subscription is
    ///   not up within the connection timeout, or if authentication failed (a wrong
    ///   or missing password: the message says so, without the password);
    /// * [`Error::NoPermission`] if the ACL refuses a command, the key pattern or the
    ///   channel pattern; the message names the check and quotes the server;
    /// * [`Error::Refused`] or [`Error::Backend`] if the server refuses the checks
    ///   for another reason.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempt; nothing is left behind.
    pub async fn connect(self) -> Result<RedisBackend> {
        self.validate()?;
        #[cfg(feature = "tls-rustls")]
        {
            // `rediss://` needs a process-wide crypto provider; keep one installed by
            // the application, else install ring's.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let timeouts = Timeouts {
            response: self.response_timeout,
            connection: self.connection_timeout,
        };
        let (conn, target) = open(&self.topology, timeouts).await?;
        let instance_id = format!("{:016x}", rand::random::<u64>());
        let channel_prefix = format!("{}:inst:", self.prefix);
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            conn,
            target,
            channel: format!("{channel_prefix}{instance_id}"),
            prefix: self.prefix,
            instance_id,
            channel_prefix,
            wakeups: WakeRegistry::new(),
            claim_ttl_ms: millis(self.claim_ttl),
            entry_ttl_ms: millis(self.queue_entry_ttl),
            entry_refresh: self.queue_entry_ttl / 3,
            replica_ack: self.replica_ack,
            tombstone_ttl_ms: millis((self.response_timeout * 2).max(Duration::from_secs(1))),
            connection_timeout: self.connection_timeout,
            subscriber: notify::Status::default(),
            notifier: Mutex::new(None),
            stop: stop.clone(),
            _stop: stop.drop_guard(),
        });
        inner.ensure_notifier();
        inner.verify().await?;
        Ok(RedisBackend { inner })
    }
}

/// Opens the command connection of `topology`; returns it with a description of
/// the target for error messages.
async fn open(topology: &Topology, timeouts: Timeouts) -> Result<(Conn, String)> {
    match topology {
        Topology::Single(url) => {
            let client = redis::Client::open(url.as_str())
                .map_err(|e| Error::config(format!("redis url {}: {e}", redact(url))))?;
            let target = client.get_connection_info().addr().to_string();
            let conn =
                ConnectionManager::new_with_config(client.clone(), conn::manager_config(timeouts))
                    .await
                    .map_err(|e| connect_error(&target, "connecting", e))?;
            Ok((
                Conn::Single(Box::new(conn::Single { conn, client })),
                target,
            ))
        }
        #[cfg(feature = "cluster")]
        Topology::Cluster(nodes) => {
            let target = format!(
                "cluster [{}]",
                nodes
                    .iter()
                    .map(|n| redact(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if nodes.is_empty() {
                return Err(Error::config("a redis cluster needs at least one node url"));
            }
            for n in nodes {
                redis::Client::open(n.as_str())
                    .map_err(|e| Error::config(format!("redis url {}: {e}", redact(n))))?;
            }
            let conn = cluster::ClusterConn::connect(nodes, timeouts)
                .await
                .map_err(|e| connect_error(&target, "connecting to the cluster", e))?;
            Ok((Conn::Cluster(conn), target))
        }
        #[cfg(feature = "sentinel")]
        Topology::Sentinel(settings) => {
            let target = format!(
                "sentinel master {:?} via [{}]",
                settings.master,
                settings
                    .sentinels
                    .iter()
                    .map(|n| redact(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let conn = sentinel::SentinelConn::connect(settings.clone(), timeouts)
                .await
                .map_err(|e| match e {
                    sentinel::ConnectError::Config(m) => Error::config(m),
                    sentinel::ConnectError::Redis(e) => {
                        connect_error(&target, "resolving the primary", e)
                    }
                })?;
            Ok((Conn::Sentinel(conn), target))
        }
    }
}

/// Whole milliseconds, at least 1.
fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

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
/// the scripts' commands fails with [`Error::NoPermission`] at its first lock
/// operation instead. (The `CLIENT SETINFO` that the `redis` crate sends on each new
/// connection may be refused: its result is ignored.)
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    target: String,
    prefix: String,
    instance_id: String,
    channel_prefix: String,
    channel: String,
    wakeups: WakeRegistry,
    claim_ttl_ms: u64,
    entry_ttl_ms: u64,
    entry_refresh: Duration,
    replica_ack: Option<(u32, Duration)>,
    tombstone_ttl_ms: u64,
    connection_timeout: Duration,
    subscriber: notify::Status,
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

/// The Redis names of one key.
struct Names {
    lock: Vec<u8>,
    fence: Vec<u8>,
    queue: Vec<u8>,
    claim: Vec<u8>,
    tombstone: Vec<u8>,
    queue_expiry: Vec<u8>,
}

impl Names {
    fn new(prefix: &str, key: &LockKey) -> Names {
        let mut lock = Vec::with_capacity(prefix.len() + key.len() + 4);
        lock.extend_from_slice(prefix.as_bytes());
        lock.extend_from_slice(b":{");
        for &b in key.as_bytes() {
            match b {
                b'%' => lock.extend_from_slice(b"%25"),
                b'{' => lock.extend_from_slice(b"%7B"),
                b'}' => lock.extend_from_slice(b"%7D"),
                _ => lock.push(b),
            }
        }
        lock.push(b'}');
        let with = |suffix: &[u8]| [&lock[..], suffix].concat();
        Names {
            fence: with(b":fence"),
            queue: with(b":wq"),
            claim: with(b":claim"),
            tombstone: with(b":rel"),
            queue_expiry: with(b":wqx"),
            lock,
        }
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
    /// As [`RedisBackendBuilder::connect`]: [`Error::InvalidConfig`] for a malformed
    /// URL, [`Error::Connect`] when the server cannot be reached or authentication
    /// fails, [`Error::NoPermission`] when the ACL lacks a right.
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

    /// Starts configuring a backend on a Redis Cluster reached through `nodes`
    /// (URLs of any of its nodes; the others are discovered). Scripts are routed by
    /// their key's slot, `MOVED`/`ASK` redirects are followed and the topology is
    /// refreshed by the `redis` crate's cluster client; wake-ups use one classic
    /// pub/sub subscription on one node (see the module docs of the cluster mode in
    /// the crate's design notes).
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
}

impl RedisBackend {
    /// Starts configuring a backend on the primary that the sentinels at
    /// `sentinels` (URLs; any of them may be down) name for `master`. The primary
    /// is looked up at connect, and again on `+switch-master`, on connection errors
    /// and on `READONLY`; a renewal answered `READONLY` by a demoted primary is a
    /// loss at once. See [`replica_ack`](RedisBackendBuilder::replica_ack) to
    /// narrow the window in which a failover loses a granted lock.
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
        }))
    }
}

impl RedisBackendBuilder {
    fn new(topology: Topology) -> RedisBackendBuilder {
        RedisBackendBuilder {
            topology,
            replica_ack: None,
            prefix: RedisBackendBuilder::DEFAULT_PREFIX.to_owned(),
            response_timeout: RedisBackendBuilder::DEFAULT_RESPONSE_TIMEOUT,
            connection_timeout: RedisBackendBuilder::DEFAULT_CONNECTION_TIMEOUT,
            claim_ttl: RedisBackendBuilder::DEFAULT_CLAIM_TTL,
            queue_entry_ttl: RedisBackendBuilder::DEFAULT_QUEUE_ENTRY_TTL,
        }
    }
}

impl RedisBackend {
    /// This instance's random id (its queue entries and its channel carry it).
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// The pub/sub channel this instance is woken on.
    pub fn channel(&self) -> String {
        self.inner.channel.clone()
    }

    /// The server the command connection talks to now, `host:port`: the server of
    /// a single-server backend, the current primary of a sentinel backend (it
    /// changes when the backend follows a failover), or `cluster` for a cluster
    /// backend (its commands go to the node of each key's slot).
    pub fn server(&self) -> String {
        self.inner.conn.server()
    }

    /// The Redis name of the lock of `key`.
    pub fn lock_name(&self, key: &LockKey) -> Vec<u8> {
        Names::new(&self.inner.prefix, key).lock
    }

    /// Whether the notification subscription is currently established.
    pub fn is_subscribed(&self) -> bool {
        self.inner.subscriber.is_up()
    }

    /// How many times the notification subscription has been (re-)established.
    pub fn subscriptions(&self) -> u64 {
        self.inner.subscriber.count()
    }

    /// Leaves the queue of `key` only if this instance holds the key's claim (it was
    /// woken for a key it no longer wants), passing the claim to the next waiting
    /// instance. Returns `false`, changing nothing, when the claim is not this
    /// instance's. The notification task does this by itself for wake-ups nobody
    /// here waits for.
    ///
    /// # Errors
    ///
    /// As [`LockBackend::leave`].
    pub async fn leave_if_claimed(&self, key: &LockKey) -> Result<bool> {
        self.inner.leave(key, true).await
    }
}

impl Inner {
    /// Runs `lua/release.lua`; `requeue` is the age of this instance's next local
    /// waiter in fair mode.
    async fn release(
        &self,
        key: &LockKey,
        token: LeaseToken,
        requeue: Option<Duration>,
    ) -> Result<Released> {
        let n = Names::new(&self.prefix, key);
        let keys: [&[u8]; 5] = [&n.lock, &n.queue, &n.claim, &n.tombstone, &n.queue_expiry];
        let (token, claim_ttl_ms, tombstone_ttl_ms) = (
            token.to_hex(),
            self.claim_ttl_ms.to_string(),
            self.tombstone_ttl_ms.to_string(),
        );
        let args: [&[u8]; 6] = [
            token.as_bytes(),
            self.instance_id.as_bytes(),
            claim_ttl_ms.as_bytes(),
            self.channel_prefix.as_bytes(),
            key.as_bytes(),
            tombstone_ttl_ms.as_bytes(),
        ];
        let reply = match requeue {
            None => self.invoke(&RELEASE, &keys, &args).await,
            Some(age) => {
                let age_us = u64::try_from(age.as_micros())
                    .unwrap_or(u64::MAX)
                    .to_string();
                let entry_ttl_ms = self.entry_ttl_ms.to_string();
                let [a1, a2, a3, a4, a5, a6] = args;
                let args: [&[u8]; 8] = [
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    age_us.as_bytes(),
                    entry_ttl_ms.as_bytes(),
                ];
                self.invoke(&RELEASE, &keys, &args).await
            }
        }
        .map_err(|e| map_err(key, Phase::Releasing, e))?;
        let (released, refused) = decode_release(key, &reply)?;
        if let Some(error) = refused {
            warn_refused_publish(key, "release", &error);
        }
        Ok(released)
    }

    /// Runs `lua/acquire.lua`; `fair` is the caller's age in fair mode.
    async fn acquire(
        self: &Arc<Self>,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
        fair: Option<Duration>,
    ) -> Result<Acquire> {
        if queue {
            // A caller about to wait needs the wake-ups.
            self.ensure_notifier();
        }
        let n = Names::new(&self.prefix, key);
        let ttl_ms = millis(ttl);
        let fence_ttl_ms = (ttl_ms.saturating_mul(10)).max(60_000);
        let keys: [&[u8]; 6] = [
            &n.lock,
            &n.fence,
            &n.queue,
            &n.claim,
            &n.tombstone,
            &n.queue_expiry,
        ];
        let (token, ttl_ms, entry_ttl_ms, fence_ttl_ms) = (
            token.to_hex(),
            ttl_ms.to_string(),
            self.entry_ttl_ms.to_string(),
            fence_ttl_ms.to_string(),
        );
        let args: [&[u8]; 6] = [
            token.as_bytes(),
            ttl_ms.as_bytes(),
            self.instance_id.as_bytes(),
            entry_ttl_ms.as_bytes(),
            fence_ttl_ms.as_bytes(),
            if queue { b"1" } else { b"0" },
        ];
        let reply = match fair {
            None => self.invoke(&ACQUIRE, &keys, &args).await,
            Some(age) => {
                let age_us = u64::try_from(age.as_micros())
                    .unwrap_or(u64::MAX)
                    .to_string();
                let claim_ttl_ms = self.claim_ttl_ms.to_string();
                let [a1, a2, a3, a4, a5, a6] = args;
                let args: [&[u8]; 10] = [
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    age_us.as_bytes(),
                    claim_ttl_ms.as_bytes(),
                    self.channel_prefix.as_bytes(),
                    key.as_bytes(),
                ];
                self.invoke(&ACQUIRE, &keys, &args).await
            }
        }
        .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        decode_acquire(key, &reply, self.entry_refresh)
    }

    async fn invoke(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, RedisError> {
        let Some((replicas, timeout)) = self.replica_ack else {
            return self.conn.invoke(script, keys, args).await;
        };
        if !std::ptr::eq(script, &*ACQUIRE) && !std::ptr::eq(script, &*EXTEND) {
            return self.conn.invoke(script, keys, args).await;
        }
        let (reply, acks) = self
            .conn
            .invoke_acked(script, keys, args, replicas, timeout)
            .await?;
        // `{ 1, … }`: the acquire or the renewal wrote the lock.
        let wrote =
            matches!(&reply, Value::Array(items) if matches!(items.first(), Some(Value::Int(1))));
        if wrote && acks < i64::from(replicas) {
            return Err(redis::make_extension_error(
                "NOREPLICAS".to_owned(),
                Some(format!(
                    "{acks} of the {replicas} replicas required acknowledged the write within {timeout:?}"
                )),
            ));
        }
        Ok(reply)
    }

    /// Starts the notification task on the current runtime unless it is running:
    /// at connect, and again when the runtime that ran it has shut down (its tasks
    /// are gone, and with them the wake-ups). Meanwhile waiters rely on their timers.
    fn ensure_notifier(self: &Arc<Self>) {
        let mut task = self.notifier.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if task.is_some() {
            tracing::debug!(channel = %self.channel, "the notification task ended with its runtime; restarting it");
        }
        self.subscriber.restarting();
        *task = Some(runtime.spawn(notify::run(
            self.conn.clone(),
            self.channel.clone(),
            self.connection_timeout,
            Arc::downgrade(self),
            self.stop.clone(),
        )));
    }

    /// The checks of `connect`: the scripts load, the extend script runs on the
    /// probe key, the subscription comes up, and this instance may publish on its
    /// channel.
    async fn verify(&self) -> Result<()> {
        for script in [&*ACQUIRE, &*RELEASE, &*EXTEND, &*LEAVE] {
            self.conn
                .load(script)
                .await
                .map_err(|e| self.check_error("SCRIPT LOAD", e))?;
        }
        let probe = LockKey::from(PROBE_KEY);
        let n = Names::new(&self.prefix, &probe);
        let reply = self
            .invoke(
                &EXTEND,
                &[&n.lock, &n.fence, &n.queue, &n.queue_expiry],
                &[
                    LeaseToken::random().to_hex().as_bytes(),
                    b"1",
                    b"1",
                    self.instance_id.as_bytes(),
                ],
            )
            .await
            .map_err(|e| {
                let name = String::from_utf8_lossy(&n.lock);
                self.check_error(&format!("running the extend script (EVALSHA) on {name}"), e)
            })?;
        decode_extend(&probe, &reply)?;
        self.first_subscription().await?;
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&self.channel).arg("");
        self.conn
            .query(&publish)
            .await
            .map_err(|e| self.check_error(&format!("PUBLISH on {}", self.channel), e))?;
        Ok(())
    }

    /// Waits, at most the connection timeout, until the notification task has
    /// subscribed once. An ACL or authentication refusal ends the wait at once.
    async fn first_subscription(&self) -> Result<()> {
        let mut attempts = self.subscriber.attempts();
        let deadline = tokio::time::Instant::now() + self.connection_timeout;
        let mut last = None;
        loop {
            match &*attempts.borrow_and_update() {
                notify::Attempt::Subscribed => return Ok(()),
                notify::Attempt::Failed(e) => {
                    if is_auth_failure(e) || classify(e) == Class::NoPermission {
                        return Err(
                            self.check_error(&format!("SUBSCRIBE to {}", self.channel), e.clone())
                        );
                    }
                    last = Some(e.clone());
                }
                notify::Attempt::Pending => {}
            }
            if !matches!(
                tokio::time::timeout_at(deadline, attempts.changed()).await,
                Ok(Ok(()))
            ) {
                let check = format!(
                    "SUBSCRIBE to {} did not succeed within {:?}",
                    self.channel, self.connection_timeout
                );
                return Err(Error::Connect {
                    target: self.target.clone(),
                    source: match last {
                        Some(e) => Arc::new(CheckFailed { check, source: e }),
                        None => Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(check)),
                    },
                });
            }
        }
    }

    /// The error of a failed `connect` check.
    fn check_error(&self, check: &str, e: RedisError) -> Error {
        if is_auth_failure(&e) {
            return connect_error(&self.target, check, e);
        }
        let failed = Arc::new(CheckFailed {
            check: format!("connect check: {check}"),
            source: e,
        });
        match classify(&failed.source) {
            Class::NoPermission => Error::NoPermission {
                key: LockKey::from(PROBE_KEY),
                phase: Phase::Acquiring,
                source: failed,
            },
            Class::Refused(code) => Error::Refused {
                key: LockKey::from(PROBE_KEY),
                phase: Phase::Acquiring,
                code,
                source: failed,
            },
            Class::Foreign | Class::Transient => Error::Connect {
                target: self.target.clone(),
                source: failed,
            },
        }
    }

    /// Leaves the queue of `key`; with `only_if_claimed`, only if this instance
    /// holds the key's claim (see `lua/leave.lua`). Returns whether it left.
    async fn leave(&self, key: &LockKey, only_if_claimed: bool) -> Result<bool> {
        let n = Names::new(&self.prefix, key);
        let reply = self
            .invoke(
                &LEAVE,
                &[&n.lock, &n.queue, &n.claim, &n.queue_expiry],
                &[
                    self.instance_id.as_bytes(),
                    self.claim_ttl_ms.to_string().as_bytes(),
                    self.channel_prefix.as_bytes(),
                    key.as_bytes(),
                    if only_if_claimed { b"1" } else { b"0" },
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        let (left, refused) = decode_leave(key, &reply)?;
        if let Some(error) = refused {
            warn_refused_publish(key, "leave", &error);
        }
        Ok(left)
    }
}

/// A failed `connect` check: what was checked, and the server's answer.
#[derive(Debug)]
struct CheckFailed {
    check: String,
    source: RedisError,
}

impl fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.source)
    }
}

impl std::error::Error for CheckFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A wrong or missing password: the handshake's `AUTH` failed, or a command was
/// answered `NOAUTH` / `WRONGPASS`.
fn is_auth_failure(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

/// `Error::Connect` for a failure while `doing` something at connect time; an
/// authentication failure says so (the password is never part of the message).
fn connect_error(target: &str, doing: &str, e: RedisError) -> Error {
    let check = if is_auth_failure(&e) {
        format!("authentication failed ({doing})")
    } else {
        doing.to_owned()
    };
    Error::Connect {
        target: target.to_owned(),
        source: Arc::new(CheckFailed { check, source: e }),
    }
}

/// How a Redis error is reported; see [`map_err`].
#[derive(Debug, PartialEq, Eq)]
enum Class {
    /// The ACL refused a command, a key or a channel.
    NoPermission,
    /// `WRONGTYPE`: a value lockflight did not write.
    Foreign,
    /// A refusal that retrying at once will not change, with the server's code.
    Refused(String),
    /// I/O, a timeout, a dropped connection, a server loading, busy or failing over.
    Transient,
}

fn classify(e: &RedisError) -> Class {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return Class::Transient;
    }
    if e.kind() == ErrorKind::AuthenticationFailed {
        // A reconnection whose AUTH was refused (the password changed).
        return Class::Refused("WRONGPASS".into());
    }
    match e.code() {
        Some("NOPERM") => Class::NoPermission,
        // Redis 7.0 answers an ACL refusal inside a script with ERR.
        Some("ERR")
            if e.detail()
                .is_some_and(|d| d.starts_with("The user executing the script can't")) =>
        {
            Class::NoPermission
        }
        Some("WRONGTYPE") => Class::Foreign,
        // A cluster in flux: a redirect still unresolved after the cluster client's
        // retries (a failover or a migration in progress) is retried by the caller.
        Some("LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "MOVED" | "ASK") => {
            Class::Transient
        }
        Some(code) => Class::Refused(code.to_owned()),
        // Client-side: a protocol error (the connection is replaced), a lost reply.
        None => Class::Transient,
    }
}

/// The error of a failed lock operation: `NOPERM` → [`Error::NoPermission`];
/// `WRONGTYPE` → [`Error::ForeignValue`]; `OOM`, `READONLY`, `NOSCRIPT` (after the
/// reload), `ERR` (a script error), `MISCONF`, `NOAUTH`, `WRONGPASS` and other server
/// refusals → [`Error::Refused`]; I/O, timeouts, dropped connections, `LOADING`,
/// `BUSY`, `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`, `MOVED`, `ASK` →
/// [`Error::Backend`] (transient).
fn map_err(key: &LockKey, phase: Phase, e: RedisError) -> Error {
    let key = key.clone();
    match classify(&e) {
        Class::NoPermission => Error::NoPermission {
            key,
            phase,
            source: Arc::new(e),
        },
        Class::Foreign => Error::ForeignValue {
            key,
            phase,
            // Without the script's location that Redis appends.
            detail: e
                .detail()
                .and_then(|d| d.split(" script: ").next())
                .unwrap_or("a value of another type")
                .to_owned(),
        },
        Class::Refused(code) => Error::Refused {
            key,
            phase,
            code,
            source: Arc::new(e),
        },
        Class::Transient => Error::Backend {
            key,
            phase,
            source: Arc::new(e),
        },
    }
}

fn warn_refused_publish(key: &LockKey, operation: &str, error: &str) {
    tracing::warn!(
        %key,
        error,
        "{operation}: the server refused the wake-up PUBLISH; the next instance was not woken and falls back to its timer"
    );
}

fn unexpected(key: &LockKey, phase: Phase, reply: &Value) -> Error {
    Error::backend(key, phase, format!("unexpected script reply {reply:?}"))
}

/// A count of waiting instances (negative or oversized values are clamped).
fn waiting(v: &Value) -> u32 {
    match v {
        Value::Int(n) => u32::try_from((*n).max(0)).unwrap_or(u32::MAX),
        _ => 0,
    }
}

/// A fencing epoch: a positive integer, else the reply is malformed.
fn decode_epoch(key: &LockKey, v: &Value) -> Result<u64> {
    match v {
        Value::Int(n) if *n > 0 => Ok(*n as u64),
        _ => Err(Error::backend(
            key,
            Phase::Acquiring,
            format!("malformed epoch {v:?} in the acquire reply"),
        )),
    }
}

/// The optional last element of a release or leave reply: a refused `PUBLISH`.
fn refused_publish(rest: &[Value]) -> Option<Option<String>> {
    match rest {
        [] => Some(None),
        [Value::BulkString(b)] => Some(Some(String::from_utf8_lossy(b).into_owned())),
        [Value::SimpleString(s)] => Some(Some(s.clone())),
        _ => None,
    }
}

/// The reply of `lua/acquire.lua`; `max_wait` bounds the retry time of `Busy`.
fn decode_acquire(key: &LockKey, reply: &Value, max_wait: Duration) -> Result<Acquire> {
    let foreign = |detail: &str| Error::ForeignValue {
        key: key.clone(),
        phase: Phase::Acquiring,
        detail: detail.into(),
    };
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1), epoch, others] => Ok(Acquire::Acquired {
                epoch: decode_epoch(key, epoch)?,
                waiting: waiting(others),
            }),
            [Value::Int(0), Value::Int(wait_ms), _] => Ok(Acquire::Busy {
                retry_in: Duration::from_millis(u64::try_from(*wait_ms).unwrap_or(0)).min(max_wait),
            }),
            [Value::Int(-1)] => Err(foreign("the lock key holds a value that is not a string")),
            [Value::Int(-2)] => Err(foreign("the lock key holds a string without a TTL")),
            _ => Err(unexpected(key, Phase::Acquiring, reply)),
        },
        _ => Err(unexpected(key, Phase::Acquiring, reply)),
    }
}

/// The reply of `lua/release.lua`, and the error of a refused wake-up `PUBLISH`.
fn decode_release(key: &LockKey, reply: &Value) -> Result<(Released, Option<String>)> {
    if let Value::Array(items) = reply
        && let [Value::Int(released @ (0 | 1)), others, rest @ ..] = items.as_slice()
        && let Some(refused) = refused_publish(rest)
    {
        let released = Released {
            released: *released == 1,
            waiting: waiting(others),
        };
        return Ok((released, refused));
    }
    Err(unexpected(key, Phase::Releasing, reply))
}

/// The reply of `lua/extend.lua`.
fn decode_extend(key: &LockKey, reply: &Value) -> Result<Extend> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1), others] => Ok(Extend::Extended {
                waiting: waiting(others),
            }),
            [Value::Int(0), _] => Ok(Extend::NotOwner),
            _ => Err(unexpected(key, Phase::Renewing, reply)),
        },
        _ => Err(unexpected(key, Phase::Renewing, reply)),
    }
}

/// The reply of `lua/leave.lua`: whether the instance left, and the error of a
/// refused wake-up `PUBLISH`.
fn decode_leave(key: &LockKey, reply: &Value) -> Result<(bool, Option<String>)> {
    if let Value::Array(items) = reply {
        match items.as_slice() {
            [Value::Int(1), _, rest @ ..] => {
                if let Some(refused) = refused_publish(rest) {
                    return Ok((true, refused));
                }
            }
            [Value::Int(0), _] => return Ok((false, None)),
            _ => {}
        }
    }
    Err(unexpected(key, Phase::Acquiring, reply))
}

#[async_trait]
impl LockBackend for RedisBackend {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
    ) -> Result<Acquire> {
        self.inner.acquire(key, token, ttl, queue, None).await
    }

    /// The same script as [`acquire`](Self::acquire) with four more arguments: the
    /// age (µs), and the claim TTL, channel prefix and raw key with which it wakes
    /// the earliest waiter of a free lock that nobody was told to take.
    async fn acquire_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
        age: Duration,
    ) -> Result<Acquire> {
        self.inner.acquire(key, token, ttl, queue, Some(age)).await
    }

    fn supports_fair(&self) -> bool {
        true
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

    async fn extend(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Extend> {
        let inner = &*self.inner;
        let n = Names::new(&inner.prefix, key);
        let ttl_ms = millis(ttl);
        let fence_ttl_ms = (ttl_ms.saturating_mul(10)).max(60_000);
        let reply = inner
            .invoke(
                &EXTEND,
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
        decode_extend(key, &reply)
    }

    async fn leave(&self, key: &LockKey) -> Result<()> {
        self.inner.leave(key, false).await.map(drop)
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

    #[test]
    fn names_share_one_hash_tag_and_escape_braces() {
        let n = Names::new("lf", &LockKey::from(&b"a{b}%"[..]));
        assert_eq!(n.lock, b"lf:{a%7Bb%7D%25}");
        assert_eq!(n.fence, b"lf:{a%7Bb%7D%25}:fence");
        assert_eq!(n.queue, b"lf:{a%7Bb%7D%25}:wq");
        assert_eq!(n.claim, b"lf:{a%7Bb%7D%25}:claim");
        assert_eq!(n.tombstone, b"lf:{a%7Bb%7D%25}:rel");
        assert_eq!(n.queue_expiry, b"lf:{a%7Bb%7D%25}:wqx");
        // Distinct keys never share a name, even when one looks escaped.
        assert_ne!(
            Names::new("lf", &LockKey::from("%7B")).lock,
            Names::new("lf", &LockKey::from("{")).lock
        );
    }

    fn ints(ns: &[i64]) -> Value {
        Value::Array(ns.iter().map(|n| Value::Int(*n)).collect())
    }

    fn key() -> LockKey {
        LockKey::from("k")
    }

    fn assert_backend_error<T: fmt::Debug>(result: Result<T>, needle: &str) {
        match result {
            Err(e @ Error::Backend { .. }) => assert!(e.to_string().contains(needle), "{e}"),
            other => panic!("expected Backend({needle}), got {other:?}"),
        }
    }

    #[test]
    fn decodes_every_acquire_reply() {
        let max = Duration::from_secs(1);
        let k = key();
        assert_eq!(
            decode_acquire(&k, &ints(&[1, 42, 3]), max).unwrap(),
            Acquire::Acquired {
                epoch: 42,
                waiting: 3
            }
        );
        assert_eq!(
            decode_acquire(&k, &ints(&[0, 250, 1]), max).unwrap(),
            Acquire::Busy {
                retry_in: Duration::from_millis(250)
            }
        );
        // Bounded by the queue entry's refresh interval.
        assert_eq!(
            decode_acquire(&k, &ints(&[0, 60_000, 0]), max).unwrap(),
            Acquire::Busy { retry_in: max }
        );
        for code in [-1, -2] {
            assert!(matches!(
                decode_acquire(&k, &ints(&[code]), max),
                Err(Error::ForeignValue { .. })
            ));
        }
        assert_backend_error(decode_acquire(&k, &Value::Int(1), max), "unexpected");
        assert_backend_error(decode_acquire(&k, &ints(&[1, 2]), max), "unexpected");
    }

    #[test]
    fn a_malformed_epoch_is_an_error_not_zero() {
        let k = key();
        let max = Duration::from_secs(1);
        for epoch in [
            Value::Int(0),
            Value::Int(-5),
            Value::BulkString(b"12".to_vec()),
            Value::Nil,
        ] {
            let reply = Value::Array(vec![Value::Int(1), epoch, Value::Int(0)]);
            assert_backend_error(decode_acquire(&k, &reply, max), "malformed epoch");
        }
        assert_eq!(
            decode_epoch(&k, &Value::Int(i64::MAX)).unwrap(),
            i64::MAX as u64
        );
    }

    #[test]
    fn decodes_every_release_reply() {
        let k = key();
        assert_eq!(
            decode_release(&k, &ints(&[1, 2])).unwrap(),
            (
                Released {
                    released: true,
                    waiting: 2
                },
                None
            )
        );
        assert_eq!(
            decode_release(&k, &ints(&[0, 0])).unwrap(),
            (
                Released {
                    released: false,
                    waiting: 0
                },
                None
            )
        );
        let refused = Value::Array(vec![
            Value::Int(1),
            Value::Int(1),
            Value::BulkString(b"ERR no channel".to_vec()),
        ]);
        assert_eq!(
            decode_release(&k, &refused).unwrap(),
            (
                Released {
                    released: true,
                    waiting: 1
                },
                Some("ERR no channel".to_owned())
            )
        );
        assert_backend_error(decode_release(&k, &ints(&[2, 0])), "unexpected");
        assert_backend_error(decode_release(&k, &ints(&[1, 0, 5])), "unexpected");
    }

    #[test]
    fn decodes_every_extend_and_leave_reply() {
        let k = key();
        assert_eq!(
            decode_extend(&k, &ints(&[1, 4])).unwrap(),
            Extend::Extended { waiting: 4 }
        );
        assert_eq!(decode_extend(&k, &ints(&[0, 0])).unwrap(), Extend::NotOwner);
        assert_backend_error(decode_extend(&k, &Value::Int(1)), "unexpected");

        assert_eq!(decode_leave(&k, &ints(&[1, 0])).unwrap(), (true, None));
        assert_eq!(decode_leave(&k, &ints(&[0, 0])).unwrap(), (false, None));
        let refused = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::BulkString(b"ERR no channel".to_vec()),
        ]);
        assert_eq!(
            decode_leave(&k, &refused).unwrap(),
            (true, Some("ERR no channel".to_owned()))
        );
        // The bare integer the old script returned is not a valid reply.
        assert_backend_error(decode_leave(&k, &Value::Int(1)), "unexpected");
    }

    fn server_error(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn classifies_server_errors() {
        use redis::ServerErrorKind;
        let known = |kind: ServerErrorKind| RedisError::from((ErrorKind::Server(kind), "detail"));
        assert_eq!(
            classify(&known(ServerErrorKind::NoPerm)),
            Class::NoPermission
        );
        assert_eq!(
            classify(&server_error(
                "ERR",
                "The user executing the script can't run this command or subcommand script: x"
            )),
            Class::NoPermission
        );
        assert_eq!(classify(&server_error("WRONGTYPE", "x")), Class::Foreign);
        for (error, code) in [
            (server_error("OOM", "command not allowed"), "OOM"),
            (known(ServerErrorKind::ReadOnly), "READONLY"),
            (known(ServerErrorKind::NoScript), "NOSCRIPT"),
            (known(ServerErrorKind::ResponseError), "ERR"),
            (server_error("MISCONF", "x"), "MISCONF"),
            (server_error("NOAUTH", "x"), "NOAUTH"),
            (server_error("WRONGPASS", "x"), "WRONGPASS"),
            (
                RedisError::from((ErrorKind::AuthenticationFailed, "x")),
                "WRONGPASS",
            ),
        ] {
            assert_eq!(classify(&error), Class::Refused(code.into()), "{error}");
        }
        for error in [
            RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)),
            RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
            known(ServerErrorKind::BusyLoading),
            known(ServerErrorKind::MasterDown),
            known(ServerErrorKind::TryAgain),
            known(ServerErrorKind::ClusterDown),
            server_error("BUSY", "a script is running"),
            server_error("MOVED", "3999 127.0.0.1:6381"),
            server_error("ASK", "3999 127.0.0.1:6381"),
        ] {
            assert_eq!(classify(&error), Class::Transient, "{error}");
        }
    }

    #[test]
    fn maps_classes_to_errors() {
        let k = key();
        assert!(matches!(
            map_err(&k, Phase::Renewing, RedisError::from((ErrorKind::Server(redis::ServerErrorKind::ReadOnly), "x"))),
            Error::Refused { code, phase: Phase::Renewing, .. } if code == "READONLY"
        ));
        match map_err(
            &k,
            Phase::Acquiring,
            server_error(
                "WRONGTYPE",
                "the fence key holds a value of another type script: abc, on @user_script:1.",
            ),
        ) {
            Error::ForeignValue { detail, .. } => {
                assert_eq!(detail, "the fence key holds a value of another type")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            map_err(
                &k,
                Phase::Releasing,
                RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
            ),
            Error::Backend { .. }
        ));
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn rejects_bad_settings() {
        let e = RedisBackend::builder("redis://x")
            .prefix("a{b")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("prefix"), "{e}");
        let e = RedisBackend::builder("redis://x")
            .claim_ttl(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("claim_ttl"), "{e}");
        let e = RedisBackend::builder("redis://x")
            .replica_ack(0, Duration::from_millis(100))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("replica_ack"), "{e}");
        #[cfg(feature = "cluster")]
        {
            let e = RedisBackend::cluster(["redis://x"])
                .replica_ack(1, Duration::from_millis(100))
                .validate()
                .unwrap_err();
            assert!(e.to_string().contains("cluster"), "{e}");
        }
    }
}
