//! Redis Cluster: the command connection and the nodes the notification task may
//! subscribe on.
//!
//! # Routing
//!
//! Commands go through the `redis` crate's async cluster client: each script is
//! routed by its first key (the lock name); all its keys share the key's hash tag, so
//! every script is single-slot. The one exception is batched renewal, which renews
//! the leases of many slots of one primary in one call (see `renew` and `owners`).
//! The client follows `MOVED` (and refreshes its slot map) and `ASK` (with
//! `ASKING`) redirects, reconnects to nodes, and retries a
//! request a few times with a short backoff within the response timeout. A
//! `CLUSTERDOWN` or `TRYAGAIN` that outlasts those retries (a shard failing over, a
//! slot mid-migration with the key's names split) reaches the caller as a transient
//! [`Error::Backend`](crate::Error::Backend), which the locker retries.
//!
//! # Wake-ups: classic pub/sub, not sharded
//!
//! A release wakes the instance at the head of the key's queue with a `PUBLISH` on
//! that instance's channel `<prefix>:inst:<id>`, from inside the release script. In
//! a cluster, a classic `PUBLISH` is forwarded by the node that runs it to every
//! other node over the cluster bus, so each instance keeps **one** subscription on
//! **one** node (any node, a replica included) and hears every wake-up meant for it,
//! whatever the key's shard. When that node fails, the notification task moves to
//! another node listed by `CLUSTER NODES` (waiters use their timers meanwhile).
//!
//! Sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`, Redis 7) keeps a message inside the
//! shard, but a script may only `SPUBLISH` on a channel in the slot of its keys. The
//! wake-up channel would then have to name both the instance and the key's slot
//! (`<prefix>:inst:<id>:{<tag of slot s>}`), and an instance would have to
//! `SSUBSCRIBE` to one channel per slot it may be woken for: up to 16,384 channels,
//! moved by every resharding, or a subscription per key waited on. That is the
//! per-key subscription the design rules out.
//!
//! Since every PUBLISH reaches the node that runs it first, each instance also keeps
//! a subscription on **every primary** (`notify`'s mirrors, best effort): the
//! wake-up of a key is then delivered by the key's own primary, without the
//! cluster-bus hop, whose tail decided the hot-key throughput; the copies
//! that arrive over the bus are spurious wake-ups, which cost a waiter at most one
//! extra request.
//!
//! Classic `PUBLISH` costs one cluster-bus hop and sends every wake-up to every node;
//! at one message per contended release that is small next to the per-slot
//! subscriptions sharded pub/sub would need (`tests/topology/cluster/latency.rs` measures both,
//! `pubsub_classic_vs_sharded` and `wakeup_latency_cluster_vs_single`; the figures are
//! in BENCHMARKS.md).
//!
//! # Fencing across a failover
//!
//! A key's epochs are minted by its shard's primary as `max(last + 1, server TIME in
//! µs)`. Replication is asynchronous, so a promoted replica may miss the newest
//! `fence` value; the TIME floor still keeps epochs increasing **provided the clocks
//! of a shard's primary and replicas agree to better than the failover time** (a
//! failover takes at least the cluster's `node-timeout`). On one machine, as in the
//! tests, they share one clock.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError, Script, Value};

use super::client::Timeouts;
use super::owners::{OwnersCache, SlotNodes};

/// At most this many requests in flight per node connection (a burst without a
/// limit queues behind a slow node until most requests time out).
const CONCURRENCY_LIMIT: usize = 1024;

/// The cluster command connection and the seed nodes.
#[derive(Clone)]
pub(in crate::backend::redis) struct ClusterConn {
    pub(super) conn: ClusterConnection,
    /// What a detached thread connects with (see
    /// [`detached_connection`](Self::detached_connection)).
    detached: std::sync::Arc<Detached>,
    seeds: Vec<ConnectionInfo>,
    /// The slot map batched renewal groups leases by (see `owners`).
    pub(super) owners: std::sync::Arc<OwnersCache>,
}

/// What made a backend's cluster connection, to make another on a detached
/// thread, and the connection of the detached thread that runs now.
struct Detached {
    client: redis::cluster::ClusterClient,
    config: redis::cluster::ClusterConfig,
    conn: std::sync::Mutex<Option<(std::thread::ThreadId, ClusterConnection)>>,
}

impl ClusterConn {
    /// Connects to the cluster through `nodes` (any subset of its nodes).
    pub(super) async fn connect(nodes: &[String], t: Timeouts) -> Result<ClusterConn, RedisError> {
        let seeds = nodes
            .iter()
            .map(|n| n.as_str().into_connection_info())
            .collect::<Result<Vec<_>, _>>()?;
        let client = ClusterClientBuilder::new(seeds.clone())
            .connection_timeout(t.connection)
            .response_timeout(t.response)
            .retries(10)
            .min_retry_wait(5)
            .max_retry_wait(200)
            .retry_wait_formula(5, 2)
            .connection_concurrency_limit(CONCURRENCY_LIMIT)
            // Without it, Nagle's algorithm holds a request back behind an
            // unacknowledged one on the same node connection.
            .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
            .build()?;
        let config = redis::cluster::ClusterConfig::new();
        let conn = client
            .get_async_connection_with_config(config.clone())
            .await?;
        Ok(ClusterConn {
            conn,
            detached: std::sync::Arc::new(Detached {
                client,
                config,
                conn: Default::default(),
            }),
            seeds,
            owners: Default::default(),
        })
    }

    /// A cluster connection from the application's `client` (its retries, TLS,
    /// credentials, protocol, read routing are kept; the connection and response
    /// timeouts are the backend's), with `seeds` as the template of lockflight's
    /// own per-node pub/sub connections.
    pub(super) async fn from_client(
        client: &redis::cluster::ClusterClient,
        seeds: Vec<ConnectionInfo>,
        t: Timeouts,
    ) -> Result<ClusterConn, RedisError> {
        let config = redis::cluster::ClusterConfig::new()
            .set_connection_timeout(t.connection)
            .set_response_timeout(t.response);
        let conn = client
            .get_async_connection_with_config(config.clone())
            .await?;
        Ok(ClusterConn {
            conn,
            detached: std::sync::Arc::new(Detached {
                client: client.clone(),
                config,
                conn: Default::default(),
            }),
            seeds,
            owners: Default::default(),
        })
    }

    /// A cluster connection driven by the current runtime, for a request on a
    /// detached thread (`backend::detached`): `conn`'s task runs on the runtime
    /// that made it, which may be blocked in the drop that runs the detached work,
    /// or gone. Made once per detached thread (its slot map read once), and
    /// dropped with the next thread's.
    pub(super) async fn detached_connection(&self) -> Result<ClusterConnection, RedisError> {
        let here = std::thread::current().id();
        {
            let held = self
                .detached
                .conn
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((thread, conn)) = held.as_ref()
                && *thread == here
            {
                return Ok(conn.clone());
            }
        }
        let conn = self
            .detached
            .client
            .get_async_connection_with_config(self.detached.config.clone())
            .await?;
        *self
            .detached
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((here, conn.clone()));
        Ok(conn)
    }

    /// Every node `CLUSTER NODES` lists as reachable (primaries first), else the
    /// seed nodes; each with the seeds' credentials and TLS settings.
    pub(super) async fn nodes(&self) -> Result<Vec<redis::Client>, RedisError> {
        let mut addrs = self
            .cluster_nodes()
            .await
            .map_or_else(Vec::new, |t| parse_nodes(&t));
        let mut seen: HashSet<(String, u16)> = addrs.iter().cloned().collect();
        for seed in &self.seeds {
            if let Some(hp) = host_port(seed.addr())
                && seen.insert(hp.clone())
            {
                addrs.push(hp);
            }
        }
        let template = &self.seeds[0];
        addrs
            .into_iter()
            .map(|(host, port)| super::client::nodelay_client(with_addr(template, host, port)))
            .collect()
    }
}

impl ClusterConn {
    /// `CLUSTER NODES`, asked within 2 s; `None` if it cannot be.
    pub(super) async fn cluster_nodes(&self) -> Option<String> {
        let listed = tokio::time::timeout(Duration::from_secs(2), async {
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut self.conn.clone())
                .await
        })
        .await;
        listed.ok()?.ok()
    }

    /// The reachable primaries `CLUSTER NODES` lists now (none if it cannot be
    /// asked), each with the seeds' credentials and TLS settings.
    pub(super) async fn primaries(&self) -> Vec<redis::Client> {
        let Some(text) = self.cluster_nodes().await else {
            return Vec::new();
        };
        let template = &self.seeds[0];
        parse_nodes_by_role(&text)
            .0
            .into_iter()
            .filter_map(|(host, port)| {
                super::client::nodelay_client(with_addr(template, host, port)).ok()
            })
            .collect()
    }
}

fn host_port(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(h, p) => Some((h.clone(), *p)),
        ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// `template` at `host:port`, keeping its credentials and TLS mode.
fn with_addr(template: &ConnectionInfo, host: String, port: u16) -> ConnectionInfo {
    let addr = match template.addr().clone() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            tls_params,
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    template.clone().set_addr(addr)
}

/// The reachable nodes of a `CLUSTER NODES` reply, primaries first.
fn parse_nodes(text: &str) -> Vec<(String, u16)> {
    let (mut primaries, replicas) = parse_nodes_by_role(text);
    primaries.extend(replicas);
    primaries
}

/// A node's `host:port`.
type HostPort = (String, u16);

/// The reachable nodes of a `CLUSTER NODES` text: primaries, replicas.
fn parse_nodes_by_role(text: &str) -> (Vec<HostPort>, Vec<HostPort>) {
    let mut primaries = Vec::new();
    let mut replicas = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        if flags
            .split(',')
            .any(|f| matches!(f, "fail" | "fail?" | "noaddr" | "handshake"))
        {
            continue;
        }
        // `ip:port@cport[,hostname]`
        let hostport = addr.split(['@', ',']).next().unwrap_or("");
        let Some((host, port)) = hostport.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        if host.is_empty() || port == 0 {
            continue;
        }
        let entry = (host.trim_matches(['[', ']']).to_owned(), port);
        if flags.split(',').any(|f| f == "master") {
            primaries.push(entry);
        } else {
            replicas.push(entry);
        }
    }
    (primaries, replicas)
}

impl ClusterConn {
    /// `cmd` on the primary of the slot in `route`, as the cluster client's slot
    /// map says (it follows `MOVED`); an error reply as an error.
    pub(super) async fn route(&self, cmd: redis::Cmd, route: Route) -> Result<Value, RedisError> {
        let reply = self
            .conn
            .clone()
            .route_command(
                cmd,
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
            )
            .await?;
        match reply {
            Value::ServerError(e) => Err(e.into()),
            reply => Ok(reply),
        }
    }

    /// Runs `script` with no declared keys on the primary of `slot` (loading it
    /// there on `NOSCRIPT`).
    pub(super) async fn invoke_on(
        &self,
        script: &Script,
        source: &str,
        slot: u16,
        args: &[&[u8]],
    ) -> Result<Value, RedisError> {
        let route = Route::new(slot, SlotAddr::Master);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.get_hash()).arg(0);
        for a in args {
            evalsha.arg(*a);
        }
        match self.route(evalsha.clone(), route).await {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                self.route(redis::cmd("SCRIPT").arg("LOAD").arg(source).clone(), route)
                    .await?;
                self.route(evalsha, route).await
            }
            other => other,
        }
    }
}

impl SlotNodes for ClusterConn {
    fn cluster_nodes(&self) -> impl Future<Output = Option<String>> + Send {
        ClusterConn::cluster_nodes(self)
    }

    fn route(
        &self,
        cmd: redis::Cmd,
        route: Route,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send {
        ClusterConn::route(self, cmd, route)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
a 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b 127.0.0.1:7004@17004 slave a 0 0 1 connected
c 127.0.0.1:7002@17002,host2 master - 0 0 2 connected 5461-10922
d 127.0.0.1:7005@17005 master,fail - 0 0 3 connected
e :0@0 master,noaddr - 0 0 3 disconnected
";
        assert_eq!(
            parse_nodes(text),
            vec![
                ("127.0.0.1".to_owned(), 7001),
                ("127.0.0.1".to_owned(), 7002),
                ("127.0.0.1".to_owned(), 7004),
            ]
        );
    }
}
