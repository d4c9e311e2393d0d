//! A plain Redis lock, written on redis-rs without lockflight: what the `plain`
//! locking mode (`--locking plain`) uses for `POST /items/{sku}/reserve`, so the
//! demo's first row shows what a service gets without lockflight.
//!
//! It is the lock as the usual libraries write it:
//!
//! * acquire: `SET <key> <random token> NX PX <ttl>`; while another holder has it,
//!   sleep [`RETRY`] (1 ms) and send the `SET` again, until the wait timeout;
//! * release: a Lua compare-and-delete, so a holder never deletes a lock that
//!   expired and was taken by someone else:
//!   `if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) else return 0 end`.
//!
//! Every waiting request of every instance polls Redis on its own: no coalescing,
//! no queue, no wake-ups, no handoff. What it cannot give:
//!
//! * **no fencing token**: a holder that outlives its TTL (a pause longer than
//!   [`PLAIN_LOCK_TTL`]) writes after the next holder and nothing can tell; the
//!   reservation's write is therefore not fenced in this mode (the decrement
//!   still refuses to go below zero);
//! * **no renewal**: the TTL must outlast every critical section, and a crashed
//!   holder blocks its key until the TTL expires;
//! * **no loss signal**: a lock that expired under its holder is only noticed at
//!   release (counted as `expired_before_release` in `/stats`).
//!
//! Only the reservation route takes it: in the plain mode the app's other routes
//! (shared reads, checkout, the read-write lock) keep lockflight's locks, which
//! live under other Redis keys, so a checkout does not exclude a plain-locked
//! reservation of the same SKU (both decrements still refuse to go below zero).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error_response;

/// The lock's time to live. It is never renewed, so it must outlast the longest
/// critical section (a reservation takes milliseconds).
pub const PLAIN_LOCK_TTL: Duration = Duration::from_secs(30);

/// The pause between two `SET NX` attempts while the lock is taken.
pub const RETRY: Duration = Duration::from_millis(1);

/// The compare-and-delete release. KEYS[1]: the lock; ARGV[1]: the holder's
/// token. Returns 1 if it deleted the holder's lock, 0 if the lock was gone or
/// someone else's.
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) else return 0 end",
    )
});

/// The connection the lock talks over: one server, or a Redis Cluster (every
/// command touches one key, so a cluster needs nothing more).
#[derive(Clone)]
pub enum Connection {
    /// One Redis server.
    Single(redis::aio::MultiplexedConnection),
    /// A Redis Cluster.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Connection {
    /// Connects to the Redis at `url`.
    pub async fn single(url: &str) -> redis::RedisResult<Connection> {
        let client = redis::Client::open(url)?;
        Ok(Connection::Single(
            client.get_multiplexed_async_connection().await?,
        ))
    }

    /// Connects to the Redis Cluster of the seed nodes `nodes`.
    #[cfg(feature = "cluster")]
    pub async fn cluster(nodes: &[String]) -> redis::RedisResult<Connection> {
        let client = redis::cluster::ClusterClient::new(nodes.to_vec())?;
        Ok(Connection::Cluster(client.get_async_connection().await?))
    }

    /// `SET name token NX PX ttl`: whether the lock was taken.
    async fn set_nx(&self, name: &str, token: &str, ttl: Duration) -> redis::RedisResult<bool> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(name)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64);
        let set: Option<String> = match self.clone() {
            Connection::Single(mut con) => cmd.query_async(&mut con).await?,
            #[cfg(feature = "cluster")]
            Connection::Cluster(mut con) => cmd.query_async(&mut con).await?,
        };
        Ok(set.is_some())
    }

    /// The compare-and-delete release: whether the lock was still `token`'s.
    async fn release(&self, name: &str, token: &str) -> redis::RedisResult<bool> {
        let mut invocation = RELEASE.key(name);
        invocation.arg(token);
        let deleted: i64 = match self.clone() {
            Connection::Single(mut con) => invocation.invoke_async(&mut con).await?,
            #[cfg(feature = "cluster")]
            Connection::Cluster(mut con) => invocation.invoke_async(&mut con).await?,
        };
        Ok(deleted == 1)
    }
}

/// What the lock did, for `/stats`.
#[derive(Debug, Default)]
struct Counts {
    /// `SET NX` commands sent (one per attempt, so one per 1 ms of waiting).
    set_attempts: AtomicU64,
    /// Locks taken.
    acquired: AtomicU64,
    /// Compare-and-delete scripts run.
    releases: AtomicU64,
    /// Releases that found the lock expired (or taken by another holder).
    expired_before_release: AtomicU64,
    /// Requests that gave up after the wait timeout.
    timeouts: AtomicU64,
}

/// A plain Redis lock per key, shared by one instance's requests; cheap to clone.
#[derive(Clone)]
pub struct PlainLock {
    inner: Arc<Inner>,
}

struct Inner {
    con: Connection,
    prefix: String,
    wait_timeout: Duration,
    counts: Counts,
}

impl fmt::Debug for PlainLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlainLock")
            .field("prefix", &self.inner.prefix)
            .field("wait_timeout", &self.inner.wait_timeout)
            .finish_non_exhaustive()
    }
}

/// Why [`PlainLock::lock`] failed.
#[derive(Debug)]
pub enum PlainLockError {
    /// Another holder kept the lock for the whole wait timeout.
    Timeout,
    /// Redis failed.
    Redis(redis::RedisError),
}

impl IntoResponse for PlainLockError {
    /// 503 either way, with `Retry-After: 1` for a timeout (as lockflight answers).
    fn into_response(self) -> Response {
        match self {
            PlainLockError::Timeout => {
                let mut res = error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({ "error": "lock_timeout" }),
                );
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                res
            }
            PlainLockError::Redis(e) => error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": "lock_backend_unavailable", "message": e.to_string() }),
            ),
        }
    }
}

impl PlainLock {
    /// Locks `<prefix><key>` over `con`; a request waits at most `wait_timeout`.
    pub fn new(con: Connection, prefix: &str, wait_timeout: Duration) -> Self {
        PlainLock {
            inner: Arc::new(Inner {
                con,
                prefix: prefix.to_owned(),
                wait_timeout,
                counts: Counts::default(),
            }),
        }
    }

    /// Takes the lock of `key`: `SET NX PX` with a fresh random token, again every
    /// [`RETRY`] until it is taken or the wait timeout passes.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after its `SET` succeeded but before it returned
    /// leaves the lock held until [`PLAIN_LOCK_TTL`] (nothing knows its token).
    pub async fn lock(&self, key: &str) -> Result<PlainGuard, PlainLockError> {
        let inner = &self.inner;
        let name = format!("{}{key}", inner.prefix);
        let token = format!("{:032x}", rand::random::<u128>());
        let deadline = Instant::now() + inner.wait_timeout;
        loop {
            inner.counts.set_attempts.fetch_add(1, Ordering::Relaxed);
            let taken = inner
                .con
                .set_nx(&name, &token, PLAIN_LOCK_TTL)
                .await
                .map_err(PlainLockError::Redis)?;
            if taken {
                inner.counts.acquired.fetch_add(1, Ordering::Relaxed);
                return Ok(PlainGuard {
                    lock: self.clone(),
                    name,
                    token,
                    released: false,
                });
            }
            if Instant::now() >= deadline {
                inner.counts.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(PlainLockError::Timeout);
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Requests sent to Redis so far: `(SET NX, compare-and-delete)`.
    pub fn requests(&self) -> (u64, u64) {
        let c = &self.inner.counts;
        (
            c.set_attempts.load(Ordering::Relaxed),
            c.releases.load(Ordering::Relaxed),
        )
    }

    /// The lock's counters, for `/stats`.
    pub fn stats_json(&self) -> serde_json::Value {
        let c = &self.inner.counts;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "set_attempts": n(&c.set_attempts),
            "acquired": n(&c.acquired),
            "releases": n(&c.releases),
            "expired_before_release": n(&c.expired_before_release),
            "timeouts": n(&c.timeouts),
        })
    }

    /// Runs the compare-and-delete for `name` held with `token`.
    async fn release(&self, name: &str, token: &str) -> redis::RedisResult<bool> {
        let c = &self.inner.counts;
        c.releases.fetch_add(1, Ordering::Relaxed);
        let ours = self.inner.con.release(name, token).await?;
        if !ours {
            c.expired_before_release.fetch_add(1, Ordering::Relaxed);
        }
        Ok(ours)
    }
}

/// A held plain lock. [`release`](Self::release) it; dropping it releases it in
/// the background.
#[derive(Debug)]
pub struct PlainGuard {
    lock: PlainLock,
    name: String,
    token: String,
    released: bool,
}

impl PlainGuard {
    /// Releases the lock; `Ok(false)` if it had expired (or been taken by another
    /// holder) before, i.e. the critical section was not exclusive at its end.
    ///
    /// # Cancel safety
    ///
    /// If dropped, the release may or may not have run; the lock expires after
    /// its TTL either way.
    pub async fn release(mut self) -> redis::RedisResult<bool> {
        self.released = true;
        self.lock.release(&self.name, &self.token).await
    }
}

impl Drop for PlainGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // A handler dropped mid-section (client gone): release in the background.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (lock, name, token) = (
                self.lock.clone(),
                std::mem::take(&mut self.name),
                std::mem::take(&mut self.token),
            );
            rt.spawn(async move { lock.release(&name, &token).await });
        }
    }
}
