//! Fenced writes (`lockflight::fence`) against real servers: Redis (one server and
//! a Cluster), PostgreSQL started by the test, and a SQLite file.
//!
//! Every helper gets the same scenario, [`paused_then_successor`]: holder A takes a
//! key through a proxy, the proxy turns into a black hole (A is paused or
//! partitioned: its renewals never arrive), its lease expires, holder B takes the
//! key and writes; then A, which never learned of its loss, writes late with its
//! own token. B's write must land and A's must be `Stale { last: B, offered: A }`.
//!
//! * `cases` (feature `testing`): the fenced-write cases written once and run
//!   on `FencedKey` against a real server and on the test kit's
//!   `SimFencedKey`, which must give the same outcomes and error texts (the
//!   scenario above included).
//! * `redis`: `FencedKey` with a `LockGuard`, a `WriteGuard` and a `LockInfo`,
//!   every operation, foreign values and bad input.
//! * `repeat`: writes with a write id repeated after a lost reply, while the first
//!   attempt still waits, late, and with too old an id; the write record's
//!   reads-first order and its behaviour out of memory.
//! * `cluster` (feature `cluster`): the same on a 3-shard Cluster.
//! * `sql` (features `sqlx-postgres`, `sqlx-sqlite`): `FencedUpdate` and
//!   `FencedUpsert` on PostgreSQL and SQLite.

#[cfg(feature = "testing")]
mod cases;
#[cfg(feature = "cluster")]
mod cluster;
mod redis_key;
mod repeat;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
mod sql;

use std::time::Duration;

use lockflight::{FencingToken, LockGuard, Locker, RedisBackend};
use testkit::{CountingProxy, RedisServer};

/// The lease TTL of both holders: short, so that A's lease ends soon.
pub(crate) const TTL: Duration = Duration::from_millis(800);

/// A locker on `backend` with [`TTL`] and a wait long enough for A's lease to end.
pub(crate) fn locker(backend: RedisBackend) -> Locker {
    Locker::builder(backend)
        .lease_ttl(TTL)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .expect("build a locker")
}

/// A paused holder and its successor on `key`: A holds the key through a proxy
/// that then black-holes A's traffic, B takes the key once A's lease has expired
/// in Redis. Returns both guards (A's is lost, without knowing it for sure) and
/// the proxy (dropping it ends the black hole).
pub(crate) async fn paused_then_successor(
    server: &RedisServer,
    prefix: &str,
    key: &str,
) -> (LockGuard, LockGuard, CountingProxy) {
    let proxy = CountingProxy::start(server).await;
    let a = locker(
        RedisBackend::builder(proxy.url())
            .prefix(prefix)
            .connect()
            .await
            .expect("A connects"),
    );
    let b = locker(
        RedisBackend::builder(server.url())
            .prefix(prefix)
            .connect()
            .await
            .expect("B connects"),
    );
    let held_by_a = a.lock(key).await.expect("A locks");
    proxy.blackhole(true);
    let held_by_b = b.lock(key).await.expect("B locks once A's lease expired");
    assert!(held_by_b.fencing_token() > held_by_a.fencing_token());
    (held_by_a, held_by_b, proxy)
}

/// `Stale { last: b, offered: a }`, what A's late write must get.
pub(crate) fn stale(a: FencingToken, b: FencingToken) -> lockflight::fence::Fenced {
    lockflight::fence::Fenced::Stale {
        last: b,
        offered: a,
    }
}
