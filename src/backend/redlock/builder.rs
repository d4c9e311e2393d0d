//! [`RedlockBackendBuilder`]: the nodes, their timeouts and the validation of
//! both, and connecting to every node.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio_util::sync::CancellationToken;

use super::{FENCE, Inner, MAX_NODES, Node, RoundTokens};
use crate::backend::schedule::release_record_ttl;
use crate::backend::{RedisBackend, RedlockBackend, Signals};
use crate::error::{Error, Result};
/// Settings of a [`RedlockBackend`]; see [`RedlockBackend::builder`].
#[derive(Clone)]
#[must_use]
pub struct RedlockBackendBuilder {
    pub(super) urls: Vec<String>,
    pub(super) prefix: String,
    pub(super) node_timeout: Duration,
    pub(super) connection_timeout: Duration,
    pub(super) retry_delay: Duration,
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
    ///   [`RedisBackendBuilder::connect`](crate::backend::RedisBackendBuilder::connect): every node must be reachable at start
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
                signals: Signals::new(),
                rounds: RoundTokens::new(release_record_ttl(self.node_timeout)),
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
            .without_grants()
            .connect()
            .await?;
        let target = format!("{backend:?}");
        let client = crate::backend::redis::nodelay_client(url)
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
