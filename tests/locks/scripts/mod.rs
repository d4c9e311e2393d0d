//! The Redis backend's scripts and connection checks against a real Redis: every
//! reply of every script through `RedisBackend`'s decoding, foreign values refused
//! before anything is written, release reconciliation by release record, a refused
//! wake-up `PUBLISH`, the classification of server refusals (`OOM`, `READONLY`),
//! `connect()`'s verification (passwords, ACLs, the minimal ACL line) and the
//! notifier's restart on a new runtime, the fast paths' server commands, the
//! elections' leader records, and the idempotency records.
//!
//! Tests that only need *a* Redis use [`testkit::shared`] with their own
//! [`testkit::unique_prefix`]; tests that change the server's configuration or ACLs
//! start their own [`RedisServer`].

mod connect;
mod fast_paths;
mod leader;
mod reads_first;
mod refusals;
mod replies;
mod runtime;

use std::time::{Duration, Instant};

use lockflight::backend::{Acquire, LeaseToken, LockKind, Released, Renewal, WhenBusy};
use lockflight::{Error, LockKey, Locker, RedisBackend, backend::LockBackend};
use redis::aio::MultiplexedConnection;
use testkit::{
    LogOnPanic, MINIMAL_ACL_RULES, RedisServer, del, exists, get_string, pttl, query, set_acl_user,
    set_for_30s, shared_scene, suffixed, wait_until,
};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const TTL: Duration = Duration::from_secs(30);

/// The expiry (ms) of a queue entry that stays live for the whole test.
const LIVE_ENTRY: u64 = 99_999_999_999_999;

async fn connect(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect the backend")
}

/// One instance on the shared server under a new prefix (from `name`), a connection
/// to the server, a guard that prints the server's log if the test panics, and the
/// prefix.
async fn one_instance(
    name: &str,
) -> (
    LogOnPanic<'static>,
    RedisBackend,
    MultiplexedConnection,
    String,
) {
    let (server, log, prefix) = shared_scene(name);
    let backend = connect(&server.url(), &prefix).await;
    (log, backend, server.connection().await, prefix)
}

/// The Redis name `<lock name><suffix>` of `key` under `prefix` (`:fence`, `:wq`,
/// `:wqx`, `:claim`, `:rel`).
fn name(prefix: &str, key: &LockKey, suffix: &str) -> Vec<u8> {
    suffixed(&testkit::names::lock(prefix, key), suffix)
}

async fn hexists(con: &mut MultiplexedConnection, name: &[u8], field: &str) -> bool {
    query::<i64>(con, redis::cmd("HEXISTS").arg(name).arg(field)).await == 1
}

/// Whether `id` has an entry in the waiter queue `queue` (a sorted set).
async fn queued(con: &mut MultiplexedConnection, queue: &[u8], id: &str) -> bool {
    query::<Option<String>>(con, redis::cmd("ZSCORE").arg(queue).arg(id))
        .await
        .is_some()
}

/// Puts `id` into the waiter queue `queue` (and its expiry index `<queue>x`),
/// enqueued at `enqueued_us`, expiring at `expires_ms`.
async fn enqueue(
    con: &mut MultiplexedConnection,
    queue: &[u8],
    id: &str,
    enqueued_us: u64,
    expires_ms: u64,
) {
    let expiry = [queue, b"x"].concat();
    query::<()>(con, redis::cmd("ZADD").arg(queue).arg(enqueued_us).arg(id)).await;
    query::<()>(con, redis::cmd("ZADD").arg(expiry).arg(expires_ms).arg(id)).await;
}

async fn hset(con: &mut MultiplexedConnection, name: &[u8], field: &str, value: &str) {
    query::<()>(con, redis::cmd("HSET").arg(name).arg(field).arg(value)).await
}

/// Puts a value of the wrong type at `<lock name><suffix>`: a list at the queue and
/// its expiry index (sorted sets), a hash elsewhere (strings).
async fn put_foreign(con: &mut MultiplexedConnection, name: &[u8], suffix: &str) {
    if suffix == ":wq" || suffix == ":wqx" {
        query::<()>(con, redis::cmd("RPUSH").arg(name).arg("x")).await
    } else {
        hset(con, name, "f", "v").await
    }
}

async fn type_of(con: &mut MultiplexedConnection, name: &[u8]) -> String {
    query(con, redis::cmd("TYPE").arg(name)).await
}

fn epoch_of(reply: Acquire) -> u64 {
    match reply {
        Acquire::Acquired { epoch, .. } => epoch,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn assert_foreign<T: std::fmt::Debug>(what: &str, result: lockflight::Result<T>) {
    match result {
        Err(Error::ForeignValue { .. }) => {}
        other => panic!("{what}: expected ForeignValue, got {other:?}"),
    }
}
