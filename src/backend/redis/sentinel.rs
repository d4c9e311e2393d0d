//! Sentinel: the command connection to the primary that a set of sentinels names,
//! re-resolved when it moves.
//!
//! The primary is looked up with the `redis` crate's [`Sentinel`]
//! (`SENTINEL GET-MASTER-ADDR-BY-NAME` on the sentinels in turn, then a `ROLE`
//! check on the named node) and reached through one `ConnectionManager`. It is
//! looked up again:
//!
//! * when a sentinel announces `+switch-master` for the master name (one pub/sub
//!   connection per sentinel listens for it);
//! * when a command fails with a connection error (the primary died) or with
//!   `READONLY` (it was demoted to a replica).
//!
//! A lock operation that failed that way is run once more on the new primary if
//! the primary changed, except a renewal: a renewal answered `READONLY` reaches the
//! lease as [`Error::Refused`](crate::Error::Refused) with code `READONLY`, which the
//! watchdog treats as a loss at once (the lease was granted by a node that is no
//! longer the primary; whether the new primary has it depends on replication).
//! Acquire, release and leave are idempotent (same token), so repeating them is
//! safe.
//!
//! With `replica_ack`, grants and renewals run on connections of their own to the
//! current primary (see `acked`), which follow it the same way: they are made for
//! one generation of the primary and dropped once it has been replaced.
//!
//! Every connection to a data node (the command connection, the notification
//! subscription, the acknowledged-write pool, the `ROLE` checks of a lookup and of
//! a `+switch-master`) is made with the settings of
//! [`primary_connection_info`](super::RedisBackendBuilder::primary_connection_info)
//! (username, password, database): the sentinels name only `host:port`. The
//! sentinels themselves are reached with the credentials of their own URLs.
//!
//! Fencing epochs are minted by the primary as `max(last + 1, server TIME in µs)`:
//! they stay increasing across a failover provided the old and new primaries'
//! clocks agree to better than the failover time.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::aio::ConnectionManager;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Cmd, RedisError, ScriptInvocation, Value};
use tokio_util::sync::CancellationToken;

use super::client::{Timeouts, manager_config};

/// What a sentinel-mode builder was given.
#[derive(Clone, Debug)]
pub(in crate::backend::redis) struct SentinelSettings {
    /// Sentinel URLs.
    pub(in crate::backend::redis) sentinels: Vec<String>,
    /// The monitored master's name.
    pub(in crate::backend::redis) master: String,
    /// Username, password and database for the data nodes (`None`: none, db 0).
    /// Its `Debug` hides the password.
    pub(in crate::backend::redis) primary: Option<redis::RedisConnectionInfo>,
}

impl SentinelSettings {
    /// How the `redis` crate's `Sentinel` should connect to the nodes it names.
    fn node_info(&self) -> SentinelNodeConnectionInfo {
        let info = SentinelNodeConnectionInfo::default();
        match &self.primary {
            Some(redis) => info.set_redis_connection_info(redis.clone()),
            None => info,
        }
    }
}

/// Why connecting failed.
pub(super) enum ConnectError {
    Config(String),
    Redis(RedisError),
}

/// The current primary and its connection.
struct Current {
    client: redis::Client,
    conn: ConnectionManager,
    generation: u64,
}

/// At most one lookup per this interval after failed commands.
const RESOLVE_INTERVAL: Duration = Duration::from_millis(50);

/// The command connection of a sentinel-mode backend.
pub(in crate::backend::redis) struct SentinelConn {
    settings: SentinelSettings,
    /// `settings.primary` as the `redis` crate's lookups take it.
    node_info: SentinelNodeConnectionInfo,
    timeouts: Timeouts,
    sentinel: tokio::sync::Mutex<Sentinel>,
    current: Mutex<Arc<Current>>,
    last_resolve: Mutex<Option<Instant>>,
    stop: CancellationToken,
}

impl Drop for SentinelConn {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl SentinelConn {
    /// Finds the primary and connects to it; starts the `+switch-master` listeners.
    pub(super) async fn connect(
        settings: SentinelSettings,
        timeouts: Timeouts,
    ) -> Result<Arc<SentinelConn>, ConnectError> {
        if settings.sentinels.is_empty() {
            return Err(ConnectError::Config(
                "sentinel mode needs at least one sentinel url".into(),
            ));
        }
        if settings.master.is_empty() {
            return Err(ConnectError::Config(
                "sentinel mode needs a master name".into(),
            ));
        }
        let sentinel = Sentinel::build(settings.sentinels.clone())
            .map_err(|e| ConnectError::Config(format!("sentinel urls: {e}")))?;
        let sentinel = tokio::sync::Mutex::new(sentinel);
        let node_info = settings.node_info();
        let client = resolve(&sentinel, &settings.master, &node_info, timeouts)
            .await
            .map_err(ConnectError::Redis)?;
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config(timeouts))
            .await
            .map_err(ConnectError::Redis)?;
        let this = Arc::new(SentinelConn {
            settings,
            node_info,
            timeouts,
            sentinel,
            current: Mutex::new(Arc::new(Current {
                client,
                conn,
                generation: 0,
            })),
            last_resolve: Mutex::new(None),
            stop: CancellationToken::new(),
        });
        for url in &this.settings.sentinels {
            crate::runtime::spawn(listen_switch_master(
                url.clone(),
                Arc::downgrade(&this),
                this.stop.clone(),
            ));
        }
        Ok(this)
    }

    fn current(&self) -> Arc<Current> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A client for the current primary (where the notification task subscribes).
    pub(super) async fn primary_client(&self) -> Result<redis::Client, RedisError> {
        Ok(self.current().client.clone())
    }

    /// `host:port` of the current primary.
    pub(super) fn server(&self) -> String {
        self.current()
            .client
            .get_connection_info()
            .addr()
            .to_string()
    }

    /// How many times the primary has been replaced.
    pub(super) fn generation(&self) -> u64 {
        self.current().generation
    }

    /// Looks the primary up again (unless `seen` is already stale, or a lookup ran
    /// less than `RESOLVE_INTERVAL` ago, unless `force`) and switches to it if it
    /// moved. Returns whether the connection changed.
    pub(super) async fn re_resolve(&self, seen: u64, force: bool) -> bool {
        {
            let mut last = self
                .last_resolve
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if self.generation() != seen {
                return true;
            }
            if !force && last.is_some_and(|t| t.elapsed() < RESOLVE_INTERVAL) {
                return false;
            }
            *last = Some(Instant::now());
        }
        let client = match resolve(
            &self.sentinel,
            &self.settings.master,
            &self.node_info,
            self.timeouts,
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(master = %self.settings.master, error = %e, "resolving the primary failed");
                return false;
            }
        };
        let old = self.current();
        if old.generation != seen {
            return true;
        }
        if old.client.get_connection_info().addr() == client.get_connection_info().addr() {
            return false;
        }
        let conn =
            match ConnectionManager::new_with_config(client.clone(), manager_config(self.timeouts))
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "connecting to the new primary failed");
                    return false;
                }
            };
        let mut cur = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if cur.generation != seen {
            return true;
        }
        tracing::info!(
            master = %self.settings.master,
            from = %old.client.get_connection_info().addr(),
            to = %client.get_connection_info().addr(),
            "the primary moved; following it"
        );
        *cur = Arc::new(Current {
            client,
            conn,
            generation: seen + 1,
        });
        true
    }

    /// Switches to the primary at `host:port` that a `+switch-master` announced,
    /// once it answers `ROLE` as master (the sentinel that announces it may be the
    /// only one that knows yet, so asking the sentinels could still name the old
    /// one). The connection keeps the current one's credentials and database.
    /// Returns whether the connection is now on that primary.
    pub(super) async fn switch_to(&self, host: &str, port: u16, seen: u64) -> bool {
        let cur = self.current();
        if cur.generation != seen {
            return true;
        }
        let addr = format!("{host}:{port}");
        if cur.client.get_connection_info().addr().to_string() == addr {
            return true;
        }
        let info = cur
            .client
            .get_connection_info()
            .clone()
            .set_addr(redis::ConnectionAddr::Tcp(host.to_owned(), port));
        let Ok(client) = super::client::nodelay_client(info) else {
            return false;
        };
        let connected =
            tokio::time::timeout(self.timeouts.connection + self.timeouts.response, async {
                let mut conn = ConnectionManager::new_with_config(
                    client.clone(),
                    manager_config(self.timeouts),
                )
                .await?;
                let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
                Ok::<_, RedisError>((conn, role))
            })
            .await;
        let conn = match connected {
            Ok(Ok((conn, role))) if matches!(role.first(), Some(Value::BulkString(b)) if b == b"master") => {
                conn
            }
            _ => return false,
        };
        let mut cur = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if cur.generation != seen {
            return true;
        }
        tracing::info!(master = %self.settings.master, to = %addr, "+switch-master: following the new primary");
        let generation = seen + 1;
        *cur = Arc::new(Current {
            client,
            conn,
            generation,
        });
        true
    }

    /// Runs a script on the primary. A connection error or `READONLY` makes it look
    /// the primary up again; if it moved, the script runs once more there (not a
    /// renewal (`renewal`) answered `READONLY`: see the module docs).
    pub(super) async fn invoke(
        &self,
        call: &ScriptInvocation<'_>,
        renewal: bool,
    ) -> Result<Value, RedisError> {
        let cur = self.current();
        let first = call.invoke_async(&mut cur.conn.clone()).await;
        match first {
            Err(e) if moved(&e) => {
                let renewal = renewal && is_readonly(&e);
                if self.re_resolve(cur.generation, false).await && !renewal {
                    call.invoke_async(&mut self.current().conn.clone()).await
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }

    /// Runs `f` with a client for the primary and the primary's generation (how
    /// many times it has been replaced), re-resolving and running it once more as
    /// [`invoke`](Self::invoke) does. For the acknowledged writes, which run on
    /// connections of their own (see `acked`).
    pub(super) async fn with_primary<T, F, Fut>(&self, renewal: bool, f: F) -> Result<T, RedisError>
    where
        F: Fn(redis::Client, u64) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let cur = self.current();
        match f(cur.client.clone(), cur.generation).await {
            Err(e) if moved(&e) => {
                let renewal = renewal && is_readonly(&e);
                if self.re_resolve(cur.generation, false).await && !renewal {
                    let now = self.current();
                    f(now.client.clone(), now.generation).await
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }

    /// Loads a script on the primary.
    pub(super) async fn load(&self, call: &ScriptInvocation<'_>) -> Result<(), RedisError> {
        call.load_async(&mut self.current().conn.clone())
            .await
            .map(drop)
    }

    /// Runs a command on the primary (re-resolving as [`invoke`](Self::invoke)).
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let cur = self.current();
        match cmd.query_async(&mut cur.conn.clone()).await {
            Err(e) if moved(&e) => {
                if self.re_resolve(cur.generation, false).await {
                    cmd.query_async(&mut self.current().conn.clone()).await
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }
}

/// Whether the error may mean the primary moved.
fn moved(e: &RedisError) -> bool {
    is_readonly(e)
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.code(), Some("MASTERDOWN" | "LOADING"))
}

fn is_readonly(e: &RedisError) -> bool {
    e.code() == Some("READONLY")
}

/// The current primary's client, from the sentinels, bounded by the timeouts;
/// connected (for its `ROLE` check, and afterwards) with `node`'s credentials.
async fn resolve(
    sentinel: &tokio::sync::Mutex<Sentinel>,
    master: &str,
    node: &SentinelNodeConnectionInfo,
    t: Timeouts,
) -> Result<redis::Client, RedisError> {
    let bound = t.connection + t.response;
    let mut s = sentinel.lock().await;
    match tokio::time::timeout(bound, s.async_master_for(master, Some(node))).await {
        Ok(r) => super::client::nodelay_client(r?.get_connection_info().clone()),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "asking the sentinels for the primary timed out",
        )
        .into()),
    }
}

/// Listens for `+switch-master` on one sentinel and follows the new primary.
async fn listen_switch_master(url: String, conn: Weak<SentinelConn>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let attempt = async {
            let client = super::client::nodelay_client(url.as_str())?;
            let mut ps = client.get_async_pubsub().await?;
            ps.subscribe("+switch-master").await?;
            Ok::<_, RedisError>(ps)
        };
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(Duration::from_secs(2), attempt) => r,
        };
        if let Ok(Ok(ps)) = connected {
            backoff = Duration::from_millis(50);
            let mut messages = ps.into_on_message();
            loop {
                let msg = tokio::select! {
                    _ = stop.cancelled() => return,
                    m = messages.next() => m,
                };
                let Some(msg) = msg else { break };
                let Some(c) = conn.upgrade() else { return };
                // `<master name> <old ip> <old port> <new ip> <new port>`
                let payload = String::from_utf8_lossy(msg.get_payload_bytes()).into_owned();
                let parts: Vec<&str> = payload.split(' ').collect();
                if let [name, _, _, host, port] = parts[..]
                    && name == c.settings.master
                    && let Ok(port) = port.parse::<u16>()
                {
                    tracing::debug!(%payload, "+switch-master");
                    let seen = c.generation();
                    // The new primary may need a moment to answer ROLE as master.
                    for _ in 0..40 {
                        if c.switch_to(host, port, seen).await {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    }
                }
            }
        }
        if conn.strong_count() == 0 {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
