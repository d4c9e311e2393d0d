//! The Redis backend: one Redis server (or a Redis Cluster behind the same scripts).
//!
//! # Protocol
//!
//! Every name of a key shares one hash tag, so each script touches a single cluster
//! slot: the lock `<prefix>:{<key>}`, its fence `<prefix>:{<key>}:fence`, its waiter
//! queue `<prefix>:{<key>}:q` and its claim `<prefix>:{<key>}:claim`. In `<key>` the
//! bytes `%`, `{` and `}` are percent-escaped, so binary keys cannot break the hash
//! tag or collide with each other.
//!
//! Each backend has a random instance id and **one** notification channel
//! `<prefix>:inst:<id>`, subscribed once on one pub/sub connection. A release
//! publishes the key on the channel of the instance at the head of the key's queue
//! and gives it a short claim window; exactly one waiting instance is woken.
//!
//! All operations are Lua scripts (`lua/*.lua`) run with `EVALSHA`, loaded on
//! `NOSCRIPT`: one round trip each.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Acquire, Extend, LeaseToken, LockBackend, Released, WakeRegistry};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

mod notify;

const PRELUDE: &str = include_str!("lua/queue.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/release.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/extend.lua")));
static LEAVE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/leave.lua")));

/// Settings of a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Clone)]
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    prefix: String,
    response_timeout: Duration,
    connection_timeout: Duration,
    claim_ttl: Duration,
    queue_entry_ttl: Duration,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("url", &redact(&self.url))
            .field("prefix", &self.prefix)
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
    /// 2 s). A lock operation whose reply is late is reconciled by repeating it.
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

    fn validate(&self) -> Result<()> {
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

    /// Connects the command connection and starts the notification subscriber.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a malformed URL or setting; [`Error::Connect`]
    /// if the server cannot be reached within the connection timeout.
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
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| Error::config(format!("redis url {}: {e}", redact(&self.url))))?;
        let target = client.get_connection_info().addr().to_string();
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| Error::Connect {
                target: target.clone(),
                source: Arc::new(e),
            })?;
        let instance_id = format!("{:016x}", rand::random::<u64>());
        let channel_prefix = format!("{}:inst:", self.prefix);
        let channel = format!("{channel_prefix}{instance_id}");
        let wakeups = WakeRegistry::new();
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            conn,
            target,
            prefix: self.prefix,
            instance_id,
            channel_prefix,
            wakeups: wakeups.clone(),
            claim_ttl_ms: millis(self.claim_ttl),
            entry_ttl_ms: millis(self.queue_entry_ttl),
            entry_refresh: self.queue_entry_ttl / 3,
            subscriber: notify::Status::default(),
            _stop: stop.clone().drop_guard(),
        });
        tokio::spawn(notify::run(
            client,
            channel,
            self.connection_timeout,
            Arc::downgrade(&inner),
            stop,
        ));
        Ok(RedisBackend { inner })
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
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionManager,
    target: String,
    prefix: String,
    instance_id: String,
    channel_prefix: String,
    wakeups: WakeRegistry,
    claim_ttl_ms: u64,
    entry_ttl_ms: u64,
    entry_refresh: Duration,
    subscriber: notify::Status,
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
            queue: with(b":q"),
            claim: with(b":claim"),
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
    /// [`Error::InvalidConfig`] for a malformed URL, [`Error::Connect`] when the
    /// server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempt.
    pub async fn connect(url: &str) -> Result<RedisBackend> {
        Self::builder(url).connect().await
    }

    /// Starts configuring a backend for `url`.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            prefix: RedisBackendBuilder::DEFAULT_PREFIX.to_owned(),
            response_timeout: RedisBackendBuilder::DEFAULT_RESPONSE_TIMEOUT,
            connection_timeout: RedisBackendBuilder::DEFAULT_CONNECTION_TIMEOUT,
            claim_ttl: RedisBackendBuilder::DEFAULT_CLAIM_TTL,
            queue_entry_ttl: RedisBackendBuilder::DEFAULT_QUEUE_ENTRY_TTL,
        }
    }

    /// This instance's random id (its queue entries and its channel carry it).
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// The pub/sub channel this instance is woken on.
    pub fn channel(&self) -> String {
        format!("{}{}", self.inner.channel_prefix, self.inner.instance_id)
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
}

impl Inner {
    async fn invoke(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Vec<i64>, RedisError> {
        let mut call = script.prepare_invoke();
        for k in keys {
            call.key(*k);
        }
        for a in args {
            call.arg(*a);
        }
        let mut conn = self.conn.clone();
        call.invoke_async(&mut conn).await
    }

    /// Leaves the queue of `key`; with `only_if_claimed`, only if this instance
    /// holds the key's claim (see `lua/leave.lua`).
    async fn leave(&self, key: &LockKey, only_if_claimed: bool) -> Result<()> {
        let n = Names::new(&self.prefix, key);
        self.invoke(
            &LEAVE,
            &[&n.lock, &n.queue, &n.claim],
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
        Ok(())
    }
}

fn map_err(key: &LockKey, phase: Phase, e: RedisError) -> Error {
    use redis::{ErrorKind, ServerErrorKind};
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        return Error::NoPermission {
            key: key.clone(),
            phase,
            source: Arc::new(e),
        };
    }
    if e.code() == Some("WRONGTYPE") {
        return Error::ForeignValue {
            key: key.clone(),
            phase,
            detail: e.to_string(),
        };
    }
    Error::Backend {
        key: key.clone(),
        phase,
        source: Arc::new(e),
    }
}

fn unexpected(key: &LockKey, phase: Phase, reply: &[i64]) -> Error {
    Error::backend(key, phase, format!("unexpected script reply {reply:?}"))
}

fn waiting(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(0)
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
        let inner = &*self.inner;
        let n = Names::new(&inner.prefix, key);
        let ttl_ms = millis(ttl);
        let fence_ttl_ms = (ttl_ms.saturating_mul(10)).max(60_000);
        let reply = inner
            .invoke(
                &ACQUIRE,
                &[&n.lock, &n.fence, &n.queue, &n.claim],
                &[
                    token.to_hex().as_bytes(),
                    ttl_ms.to_string().as_bytes(),
                    inner.instance_id.as_bytes(),
                    inner.entry_ttl_ms.to_string().as_bytes(),
                    fence_ttl_ms.to_string().as_bytes(),
                    if queue { b"1" } else { b"0" },
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        match reply[..] {
            [1, epoch, others] => Ok(Acquire::Acquired {
                epoch: u64::try_from(epoch).unwrap_or(0),
                waiting: waiting(others),
            }),
            [0, wait_ms, _] => Ok(Acquire::Busy {
                retry_in: Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0))
                    .min(inner.entry_refresh),
            }),
            [-1] => Err(Error::ForeignValue {
                key: key.clone(),
                phase: Phase::Acquiring,
                detail: "the lock key holds a value that is not a string".into(),
            }),
            [-2] => Err(Error::ForeignValue {
                key: key.clone(),
                phase: Phase::Acquiring,
                detail: "the lock key holds a string without a TTL".into(),
            }),
            _ => Err(unexpected(key, Phase::Acquiring, &reply)),
        }
    }

    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        let inner = &*self.inner;
        let n = Names::new(&inner.prefix, key);
        let reply = inner
            .invoke(
                &RELEASE,
                &[&n.lock, &n.queue, &n.claim],
                &[
                    token.to_hex().as_bytes(),
                    inner.instance_id.as_bytes(),
                    inner.claim_ttl_ms.to_string().as_bytes(),
                    inner.channel_prefix.as_bytes(),
                    key.as_bytes(),
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Releasing, e))?;
        match reply[..] {
            [released @ (0 | 1), others] => Ok(Released {
                released: released == 1,
                waiting: waiting(others),
            }),
            _ => Err(unexpected(key, Phase::Releasing, &reply)),
        }
    }

    async fn extend(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Extend> {
        let inner = &*self.inner;
        let n = Names::new(&inner.prefix, key);
        let ttl_ms = millis(ttl);
        let fence_ttl_ms = (ttl_ms.saturating_mul(10)).max(60_000);
        let reply = inner
            .invoke(
                &EXTEND,
                &[&n.lock, &n.fence, &n.queue],
                &[
                    token.to_hex().as_bytes(),
                    ttl_ms.to_string().as_bytes(),
                    fence_ttl_ms.to_string().as_bytes(),
                    inner.instance_id.as_bytes(),
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Renewing, e))?;
        match reply[..] {
            [1, others] => Ok(Extend::Extended {
                waiting: waiting(others),
            }),
            [0, _] => Ok(Extend::NotOwner),
            _ => Err(unexpected(key, Phase::Renewing, &reply)),
        }
    }

    async fn leave(&self, key: &LockKey) -> Result<()> {
        self.inner.leave(key, false).await
    }

    fn wakeups(&self) -> &WakeRegistry {
        &self.inner.wakeups
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
        assert_eq!(n.queue, b"lf:{a%7Bb%7D%25}:q");
        assert_eq!(n.claim, b"lf:{a%7Bb%7D%25}:claim");
        // Distinct keys never share a name, even when one looks escaped.
        assert_ne!(
            Names::new("lf", &LockKey::from("%7B")).lock,
            Names::new("lf", &LockKey::from("{")).lock
        );
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
    }
}
