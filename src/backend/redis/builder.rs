//! [`RedisBackendBuilder`]: the settings of a Redis backend, and `connect`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "cluster")]
use super::cluster;
#[cfg(feature = "sentinel")]
use super::sentinel;
use super::{
    Conn, Inner, Timeouts, Topology, acked, card, client, conn, connect_error, life, notify,
};
use crate::backend::{RedisBackend, Signals};
use crate::error::{Error, Result};

/// The key `connect` runs the renewal script on (with a random token: it writes
/// nothing) to check the key permissions: `<prefix>:{lockflight-probe}`.
pub(super) const PROBE_KEY: &str = "lockflight-probe";

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
    instance_name: Option<String>,
    /// Whether a mutex release may grant the key to the next waiting instance
    /// (`lua/release.lua`); off for a Redlock node, whose single node's grant is no
    /// quorum.
    grants: bool,
    /// See [`primary_connection_info`](Self::primary_connection_info).
    #[cfg(feature = "sentinel")]
    primary: Option<redis::RedisConnectionInfo>,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedisBackendBuilder");
        d.field(
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
        .field("instance_name", &self.instance_name);
        // `RedisConnectionInfo`'s `Debug` shows the username and the database,
        // never the password.
        #[cfg(feature = "sentinel")]
        d.field("primary_connection_info", &self.primary);
        d.finish()
    }
}

/// Hides the password of a `redis://user:password@host` URL.
pub(super) fn redact(url: &str) -> String {
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

    /// A name for this instance, shown by `lockflight inspect` beside its host
    /// name and process id (default: none, the host and process id only). At most
    /// 200 bytes, without control characters; `connect` refuses others with
    /// [`Error::InvalidConfig`]. The instance writes the three to its card,
    /// `<prefix>:inst:<instance id>`, at `connect` and every minute after (TTL
    /// 3 minutes); a refused write is only logged.
    pub fn instance_name(mut self, name: impl Into<String>) -> Self {
        self.instance_name = Some(name.into());
        self
    }

    /// Bound on one reply, time spent queued on the connection included (default
    /// 2 s). A lock operation whose reply is late is reconciled by repeating it; so
    /// that a repeated release is recognised, each release leaves a record of the
    /// lease it deleted for 6 s + 2 × `response_timeout` + `connection_timeout`
    /// (the release schedule's 5 s window, the longest request — a sentinel-mode
    /// request may be sent twice, to the old and the new primary — and a 1 s
    /// margin): 12 s with the defaults. Each record is a small string key; a server
    /// doing `r` releases a second keeps about `12 × r` of them.
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

    /// Replica acknowledgement: after a script grants or renews a lease, wait
    /// (`WAIT replicas timeout`) until at least `replicas` replicas have the write.
    ///
    /// Every grant and renewal of every kind of lease is acknowledged (a lock, plain or
    /// [fair](crate::Contention::Fair), a read lease, a write lease, a semaphore
    /// request granted at least one permit); a reply that wrote no lease, releases, queue
    /// entries and wake-ups are not. A grant that too few replicas acknowledged fails with
    /// [`Error::Refused`] with code `NOREPLICAS`, and what it wrote is released in the
    /// background; such a renewal counts as failed and is retried until the lease's
    /// validity ends, then the lease is lost.
    ///
    /// A granted lease (and each renewal that counted) was on at least `replicas`
    /// replicas when it was granted. Replication stays asynchronous: a failover may still
    /// promote a replica that missed the write; this narrows the window, it does not close
    /// it.
    ///
    /// Each grant and renewal takes one more round trip (at most `timeout`), on a pooled
    /// connection of its own (at most 16 in use; more wait), never delaying the process's
    /// other lock commands.
    ///
    /// One server and sentinel mode only: on a cluster backend
    /// [`connect`](Self::connect) fails with [`Error::InvalidConfig`].
    pub fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_ack = Some((replicas, timeout));
        self
    }

    /// The username, password and database lockflight uses on every connection
    /// to the primary that the sentinels name, and to each primary it follows
    /// after a failover: its commands, its notification subscription, the
    /// connections of [`replica_ack`](Self::replica_ack), and the `ROLE` check
    /// that confirms a named node is the primary. The sentinels name only the
    /// primary's address, so a primary with `requirepass` or ACL users needs
    /// this; without it lockflight connects as the `default` user with no
    /// password, to database 0, and [`connect`](Self::connect) fails with
    /// [`Error::Connect`] saying that authentication failed.
    ///
    /// The sentinels' own password, if they have one, goes in their URLs (see
    /// [`RedisBackend::sentinel`]). The password is never shown in `Debug`
    /// output nor in error messages. TLS to the primary is not supported.
    ///
    /// Sentinel backends only: on any other backend, [`connect`](Self::connect)
    /// fails with [`Error::InvalidConfig`] (one server takes its credentials in
    /// its URL or its `redis::Client`, a cluster in its node URLs or its
    /// `ClusterClient`).
    ///
    /// ```no_run
    /// # async fn demo() -> lockflight::Result<()> {
    /// use lockflight::{Locker, RedisBackend};
    ///
    /// let primary = redis::RedisConnectionInfo::default()
    ///     .set_username("locks")
    ///     .set_password("primary-secret")
    ///     .set_db(2);
    /// let backend = RedisBackend::sentinel(
    ///     // The sentinels' own password, if they require one.
    ///     ["redis://:sentinel-secret@10.0.0.1:26379", "redis://:sentinel-secret@10.0.0.2:26379"],
    ///     "mymaster",
    /// )
    /// .primary_connection_info(primary)
    /// .connect()
    /// .await?;
    /// let locker = Locker::builder(backend).build()?;
    /// # let _ = locker;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn primary_connection_info(mut self, info: redis::RedisConnectionInfo) -> Self {
        self.primary = Some(info);
        self
    }

    /// A backend whose releases (mutex and read-write) never grant the key on
    /// the server, only wake the next instance (a Redlock node: a grant on one
    /// node is no quorum).
    pub(crate) fn without_grants(mut self) -> Self {
        self.grants = false;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        #[cfg(feature = "sentinel")]
        if self.primary.is_some() && !matches!(self.topology, Topology::Sentinel(_)) {
            return Err(Error::config(
                "redis primary_connection_info is for a sentinel backend (RedisBackend::sentinel); \
                 give one server's credentials in its URL or its redis::Client, a cluster's in its node URLs",
            ));
        }
        #[cfg(feature = "sentinel")]
        if let Some(info) = &self.primary
            && info.username().is_some()
            && info.password().is_none()
        {
            return Err(Error::config(
                "redis primary_connection_info has a username but no password: \
                 the redis crate authenticates only with a password, so it would connect as `default`",
            ));
        }
        if let Some((replicas, timeout)) = self.replica_ack
            && (replicas == 0 || timeout < Duration::from_millis(1))
        {
            return Err(Error::config(format!(
                "redis replica_ack({replicas}, {timeout:?}): needs at least 1 replica and 1 ms"
            )));
        }
        #[cfg(feature = "cluster")]
        if self.replica_ack.is_some()
            && matches!(
                self.topology,
                Topology::Cluster(_) | Topology::ClusterClient(..)
            )
        {
            return Err(Error::config(
                "redis replica_ack is not supported on a cluster backend",
            ));
        }
        if let Some(name) = &self.instance_name
            && let Some(problem) = card::invalid_name(name)
        {
            return Err(Error::config(format!(
                "redis instance_name {name:?} {problem}: it must be 1 to 200 bytes without control characters"
            )));
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

    /// Connects, then checks that the server lets this backend do its work: loads the
    /// scripts (`SCRIPT LOAD`), runs the renewal script once on the probe key
    /// `<prefix>:{lockflight-probe}` (a random token: it writes nothing), waits for the
    /// notification subscription and publishes one empty message on this instance's
    /// channel. A backend that connects is one whose password and ACL rules work; see
    /// [`RedisBackend`] for the minimal ACL rules.
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
    #[cfg_attr(not(feature = "sentinel"), allow(unused_mut))]
    pub async fn connect(mut self) -> Result<RedisBackend> {
        self.validate()?;
        #[cfg(feature = "sentinel")]
        if let Topology::Sentinel(settings) = &mut self.topology {
            settings.primary = self.primary.take();
        }
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
        let (conn_is_cluster, prefix_for_life) = (conn.is_cluster(), self.prefix.clone());
        let record_ttl_ms = millis(crate::backend::schedule::release_record_ttl(
            self.response_timeout * 2 + self.connection_timeout,
        ));
        let instance = rand::random::<u64>();
        let instance_id = format!("{instance:016x}");
        let channel_prefix = format!("{}:inst:", self.prefix);
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            conn,
            target,
            channel: format!("{channel_prefix}{instance_id}"),
            card: card::text(self.instance_name.as_deref()),
            prefix: self.prefix,
            instance_id,
            instance,
            channel_prefix,
            signals: Signals::new(),
            claim_ttl_ms: millis(self.claim_ttl),
            entry_ttl_ms: millis(self.queue_entry_ttl),
            entry_refresh: self.queue_entry_ttl / 3,
            grants: self.grants && self.replica_ack.is_none(),
            acks: self
                .replica_ack
                .map(|(replicas, timeout)| acked::Pool::new(replicas, timeout, timeouts)),
            release_record_ttl_ms: record_ttl_ms,
            connection_timeout: self.connection_timeout,
            subscriber: notify::Status::default(),
            replays: Arc::default(),
            paces: Mutex::default(),
            life: life::Life::new(&prefix_for_life, conn_is_cluster, record_ttl_ms),
            notifier: Mutex::new(None),
            stop: stop.clone(),
            _stop: stop.drop_guard(),
        });
        inner.signals.set_grants(inner.grants());
        inner.ensure_notifier();
        inner.verify().await?;
        // The server's life this instance starts in (`life`). Only an ACL refusal
        // fails the connect: a read-only replica, say, refuses the life's first
        // write like every other, and the first grant learns the life instead.
        if let Err(e) = inner.check_life().await {
            if super::is_auth_failure(&e) || super::mapping(&e) == super::Mapping::NoPermission {
                let name = format!("{}:life", inner.prefix);
                return Err(inner.check_error(&format!("reading the server's life ({name})"), e));
            }
            tracing::debug!(target = %inner.target, error = %e, "reading the server's life failed");
        }
        let written = card::write(&inner).await;
        // Dropped with its runtime, like the notifier; the card then expires.
        crate::runtime::spawn(card::refresh(
            Arc::downgrade(&inner),
            inner.stop.clone(),
            written,
        ));
        Ok(RedisBackend { inner })
    }
}

/// Opens the command connection of `topology`; returns it with a description of
/// the target for error messages.
pub(super) async fn open(topology: &Topology, timeouts: Timeouts) -> Result<(Conn, String)> {
    match topology {
        Topology::Single(_) | Topology::Client(..) => {
            let client = match topology {
                Topology::Client(client, addr) => {
                    client::nodelay_client(client.get_connection_info().clone())
                        .map_err(|e| Error::config(format!("redis client for {addr}: {e}")))?
                }
                _ => {
                    let url = topology.urls()[0];
                    client::nodelay_client(url)
                        .map_err(|e| Error::config(format!("redis url {}: {e}", redact(url))))?
                }
            };
            let target = client.get_connection_info().addr().to_string();
            let conn = ConnectionManager::new_with_config(
                client.clone(),
                client::manager_config(timeouts),
            )
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
        #[cfg(feature = "cluster")]
        Topology::ClusterClient(client, seeds, addrs) => {
            let target = format!("cluster client [{}]", addrs.join(", "));
            let seeds = seeds.clone().map_err(Error::config)?;
            if seeds.is_empty() {
                return Err(Error::config(
                    "RedisBackend::from_cluster_client needs at least one node for lockflight's pub/sub connections",
                ));
            }
            let conn = cluster::ClusterConn::from_client(client, seeds, timeouts)
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
pub(super) fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

impl RedisBackendBuilder {
    pub(super) fn new(topology: Topology) -> RedisBackendBuilder {
        RedisBackendBuilder {
            topology,
            replica_ack: None,
            prefix: RedisBackendBuilder::DEFAULT_PREFIX.to_owned(),
            response_timeout: RedisBackendBuilder::DEFAULT_RESPONSE_TIMEOUT,
            connection_timeout: RedisBackendBuilder::DEFAULT_CONNECTION_TIMEOUT,
            claim_ttl: RedisBackendBuilder::DEFAULT_CLAIM_TTL,
            queue_entry_ttl: RedisBackendBuilder::DEFAULT_QUEUE_ENTRY_TTL,
            instance_name: None,
            grants: true,
            #[cfg(feature = "sentinel")]
            primary: None,
        }
    }
}
