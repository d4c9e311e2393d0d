//! The command connection behind `Inner::invoke`: one server, a Redis Cluster, or
//! the primary that a set of sentinels names.
//!
//! Every mode answers the same three questions: run a script (`EVALSHA`, loading it
//! on `NOSCRIPT`), run a plain command, and say which servers the notification
//! task may subscribe on (see `notify`).

use redis::aio::ConnectionManager;
use redis::{Cmd, RedisError, Script, Value};

use super::acked::{Acked, LeaseScript, Pool};
use crate::backend::detached;

/// How a backend reaches Redis.
#[derive(Clone, Debug)]
pub(super) enum Topology {
    /// One server.
    Single(String),
    /// One server, through a client the application built (and its address, for
    /// messages).
    Client(Box<redis::Client>, String),
    /// A Redis Cluster, through any of these seed nodes.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    /// A Redis Cluster, through a cluster client the application built, and the
    /// nodes (with credentials and TLS settings) lockflight's own pub/sub
    /// connections use, or why they are unusable; with their addresses, for
    /// messages.
    #[cfg(feature = "cluster")]
    ClusterClient(
        Box<redis::cluster::ClusterClient>,
        std::result::Result<Vec<redis::ConnectionInfo>, String>,
        Vec<String>,
    ),
    /// The primary of `master` as the sentinels name it.
    #[cfg(feature = "sentinel")]
    Sentinel(super::sentinel::SentinelSettings),
}

impl Topology {
    /// The URLs this topology was given (for messages; passwords are redacted by
    /// the caller).
    pub(super) fn urls(&self) -> Vec<&str> {
        match self {
            Topology::Single(url) | Topology::Client(_, url) => vec![url.as_str()],
            #[cfg(feature = "cluster")]
            Topology::Cluster(nodes) | Topology::ClusterClient(_, _, nodes) => {
                nodes.iter().map(String::as_str).collect()
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel(s) => s.sentinels.iter().map(String::as_str).collect(),
        }
    }
}

/// One server: its connection and a client for the subscription.
#[derive(Clone)]
pub(super) struct Single {
    pub(super) conn: ConnectionManager,
    pub(super) client: redis::Client,
}

impl Single {
    /// A connection of its own, driven by the current runtime: what a request on
    /// a detached thread uses (`backend::detached`), because `conn`'s task runs on
    /// the runtime that made it, which may be blocked or gone by then.
    async fn own_connection(&self) -> Result<redis::aio::MultiplexedConnection, RedisError> {
        self.client.get_multiplexed_async_connection().await
    }
}

/// The command connection of a backend. Cheap to clone.
#[derive(Clone)]
pub(super) enum Conn {
    /// One server, reconnected by the `ConnectionManager`.
    Single(Box<Single>),
    /// A cluster: slot routing, `MOVED`/`ASK`, topology refresh and reconnects are
    /// the `redis` crate's cluster client's.
    #[cfg(feature = "cluster")]
    Cluster(super::cluster::ClusterConn),
    /// The primary named by sentinels, re-resolved on connection errors, on
    /// `READONLY` and on `+switch-master`.
    #[cfg(feature = "sentinel")]
    Sentinel(std::sync::Arc<super::sentinel::SentinelConn>),
}

impl Conn {
    /// Runs `script` with `EVALSHA` (loading it on `NOSCRIPT`). A `renewal` is not
    /// run again on a new primary after a `READONLY` (see `sentinel`): for every
    /// kind, that refusal reaches the lease as a loss.
    #[cfg_attr(not(feature = "sentinel"), allow(unused_variables))]
    pub(super) async fn invoke(
        &self,
        script: &Script,
        renewal: bool,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, RedisError> {
        let mut call = script.prepare_invoke();
        for k in keys {
            call.key(*k);
        }
        for a in args {
            call.arg(*a);
        }
        match self {
            Conn::Single(single) if detached::is_detached() => {
                call.invoke_async(&mut single.own_connection().await?).await
            }
            Conn::Single(single) => call.invoke_async(&mut single.conn.clone()).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) if detached::is_detached() => {
                call.invoke_async(&mut c.detached_connection().await?).await
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => call.invoke_async(&mut c.conn.clone()).await,
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(s) if detached::is_detached() => {
                let call = &call;
                s.with_primary(renewal, |client, _| async move {
                    let mut own = client.get_multiplexed_async_connection().await?;
                    call.invoke_async(&mut own).await
                })
                .await
            }
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(s) => s.invoke(&call, renewal).await,
        }
    }

    /// Runs a lease script on a connection of `pool`'s to the (current) primary,
    /// followed there by `WAIT` if it wrote the lease (see `acked`); returns the
    /// script's reply and, if it waited, how many replicas acknowledged.
    pub(super) async fn invoke_acked(
        &self,
        pool: &Pool,
        lease: &LeaseScript,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Acked, RedisError> {
        let mut call = lease.prepare_invoke();
        for k in keys {
            call.key(*k);
        }
        for a in args {
            call.arg(*a);
        }
        match self {
            Conn::Single(single) => pool.run(&single.client, 0, &call, lease.wrote).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "replica acknowledgement is not supported on a cluster",
            ))),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(s) => {
                let call = &call;
                s.with_primary(lease.renewal, |client, generation| async move {
                    pool.run(&client, generation, call, lease.wrote).await
                })
                .await
            }
        }
    }

    /// Whether this is a Redis Cluster (a script's keys must share one slot).
    pub(super) fn is_cluster(&self) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => true,
            _ => false,
        }
    }

    /// The cluster connection, on a cluster.
    #[cfg(feature = "cluster")]
    pub(super) fn cluster(&self) -> Option<&super::cluster::ClusterConn> {
        match self {
            Conn::Cluster(c) => Some(c),
            _ => None,
        }
    }

    /// The server commands go to now (see `RedisBackend::server`).
    pub(super) fn server(&self) -> String {
        match self {
            Conn::Single(single) => single.client.get_connection_info().addr().to_string(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => "cluster".to_owned(),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(s) => s.server(),
        }
    }

    /// Loads `script` (`SCRIPT LOAD`; on every primary of a cluster).
    pub(super) async fn load(&self, script: &Script) -> Result<(), RedisError> {
        let call = script.prepare_invoke();
        match self {
            Conn::Single(single) => call.load_async(&mut single.conn.clone()).await.map(drop),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => call.load_async(&mut c.conn.clone()).await.map(drop),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(s) => s.load(&call).await,
        }
    }

    /// Runs a plain command (routed by its first key in a cluster; a keyless one
    /// goes to any node, `SCRIPT LOAD` to every primary).
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(single) if detached::is_detached() => {
                cmd.query_async(&mut single.own_connection().await?).await
            }
            Conn::Single(single) => cmd.query_async(&mut single.conn.clone()).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) if detached::is_detached() => {
                cmd.query_async(&mut c.detached_connection().await?).await
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => cmd.query_async(&mut c.conn.clone()).await,
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(s) if detached::is_detached() => {
                s.with_primary(false, |client, _| async move {
                    let mut own = client.get_multiplexed_async_connection().await?;
                    cmd.query_async(&mut own).await
                })
                .await
            }
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(s) => s.query(cmd).await,
        }
    }

    /// The servers the notification task may subscribe on, best first. The
    /// notification channel is a classic pub/sub channel: on one server it is that
    /// server; in a cluster a `PUBLISH` reaches every node, so any node will do; with
    /// sentinels, the current primary.
    /// Whether wake-ups are published first on other servers than the one
    /// subscription's: a Cluster's primaries (a subscription on each hears the
    /// wake-ups of its keys without the cluster-bus hop); not on other topologies,
    /// whose one subscription is on the server that publishes.
    pub(super) fn has_publishers(&self) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => true,
            _ => false,
        }
    }

    /// See [`has_publishers`](Self::has_publishers).
    pub(super) async fn publishers(&self) -> Vec<redis::Client> {
        match self {
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.primaries().await,
            _ => Vec::new(),
        }
    }

    pub(super) async fn subscribe_targets(&self) -> Result<Vec<redis::Client>, RedisError> {
        match self {
            Conn::Single(single) => Ok(vec![single.client.clone()]),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.nodes().await,
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(s) => Ok(vec![s.primary_client().await?]),
        }
    }
}
