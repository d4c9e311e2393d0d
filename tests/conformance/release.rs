//! Truthful releases: what a release reports is what happened to the lease, for
//! every kind.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockflight::backend::rw::RwBackend;
use lockflight::backend::semaphore::SemaphoreBackend;
use lockflight::backend::{LeaseToken, LockBackend};
use lockflight::{Error, LockKey, Locker, Result};

use crate::{Held, Kind, Topology, matrix};
use testkit::fault_proxy::{CommandMatcher, FaultProxy};
use testkit::{RedisServer, backend_at, query, shared_scene, unique_prefix, within};

/// The lease TTL of these cells: long, so that nothing here expires by itself.
const TTL: Duration = Duration::from_secs(30);

/// The key every cell locks.
const KEY: &str = "k";

/// A locker with 30 s leases on a subscribed backend on `url` under `prefix`.
async fn locker(url: &str, prefix: &str) -> Locker {
    Locker::builder(backend_at(url, prefix).await)
        .lease_ttl(TTL)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Runs `op` until it gives a definite answer: a connection that the fault proxy
/// or a restart closed fails the next request while it reconnects (at most 20
/// tries, 50 ms apart).
async fn settled<T, F, Fut>(what: &str, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    for _ in 0..20 {
        match op().await {
            Err(e @ (Error::Backend { .. } | Error::Connect { .. })) => {
                println!("{what}: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
    op().await
}

/// Matches every command that carries `name` among its arguments.
fn carrying(name: Vec<u8>) -> CommandMatcher {
    Arc::new(move |args: &[Vec<u8>]| args.contains(&name))
}

/// The Redis name of the release record of `token`'s lease of `key` under `prefix`.
fn record_name(prefix: &str, key: &LockKey, token: LeaseToken) -> Vec<u8> {
    [
        testkit::names::lock(prefix, key),
        b":rel:".to_vec(),
        token.to_hex().into_bytes(),
    ]
    .concat()
}

/// Instance A's release reaches Redis but A never hears the answer; instance B
/// then takes the key and releases it; A repeats its release (as the release
/// schedule does) and must hear "released", not "lost". Before releases kept one
/// record per key (and read-write and semaphore releases none), A's repeat
/// reported the lease lost.
///
/// On one server a proxy loses the reply of A's first attempt (A sees an
/// indeterminate error). Cluster and Sentinel have no proxy in front of their
/// nodes (clients follow the addresses the nodes announce), so there A's first
/// answer is discarded instead: what the cell checks there is the server side
/// that makes the repeat truthful (the per-lease record on the key's slot, where
/// the repeat is routed), which is the same script on every topology.
///
/// On the test kit, the reply of A's first attempt is lost by a fault
/// (`lose_reply(Op::Release)`), as the proxy loses it on one server.
async fn truthful_release_after_a_lost_reply(kind: Kind, topology: Topology) {
    #[cfg(feature = "testing")]
    if topology == Topology::Sim {
        use lockflight::testing::{Op, SimServer};

        let server = SimServer::new();
        let (a, b) = (server.backend(), server.backend());
        let (key, ta) = (LockKey::from(KEY), LeaseToken::random());
        assert!(kind.backend_acquire(&a, &key, ta, TTL).await.unwrap());
        server
            .fault()
            .on_key(KEY)
            .next(1)
            .lose_reply(Op::Release)
            .unwrap();
        let first = kind.backend_release(&a, &key, ta).await;
        assert!(
            matches!(&first, Err(e) if e.is_transient()),
            "{kind:?}: a release whose reply was lost is indeterminate: {first:?}"
        );
        return the_repeat_reports_the_release(kind, topology, &a, &b, ta).await;
    }
    let cell = format!("truthful-release-{kind:?}");
    let (prefix, a, b, proxy, _log) = match topology {
        Topology::OneServer => {
            let (server, log, prefix) = shared_scene(&cell);
            let proxy = FaultProxy::start(server).await;
            let a = backend_at(&proxy.url(), &prefix).await;
            let b = backend_at(&server.url(), &prefix).await;
            (prefix, a, b, Some(proxy), Some(log))
        }
        Topology::Cluster | Topology::Sentinel => {
            let prefix = unique_prefix(&cell);
            let a = topology.redis_backend(&prefix).await;
            let b = topology.redis_backend(&prefix).await;
            (prefix, a, b, None, None)
        }
        other => panic!("{other:?}: a cell of the Redis backend's single-keyspace topologies"),
    };
    let (key, ta) = (LockKey::from(KEY), LeaseToken::random());
    assert!(kind.backend_acquire(&a, &key, ta, TTL).await.unwrap());

    match &proxy {
        Some(proxy) => {
            // Only A's release carries A's record name from here on.
            proxy.drop_replies(carrying(record_name(&prefix, &key, ta)), 1);
            let first = kind.backend_release(&a, &key, ta).await;
            assert_eq!(proxy.dropped(), 1, "the release's reply was lost once");
            assert!(
                matches!(&first, Err(e) if e.is_transient()),
                "{kind:?}: a release whose reply was lost is indeterminate: {first:?}"
            );
        }
        // The answer A never hears.
        None => assert!(
            kind.backend_release(&a, &key, ta).await.unwrap(),
            "{kind:?} on {topology:?}: A's first release deletes its lease"
        ),
    }

    the_repeat_reports_the_release(kind, topology, &a, &b, ta).await;
}
matrix!(truthful_release_after_a_lost_reply:
    one_server => OneServer,
    cluster => Cluster,
    sentinel => Sentinel,
    #[cfg(feature = "testing")]
    sim => Sim,
);

/// After A's first release of its lease `ta` deleted it (A did not hear so): B
/// takes and releases the key, and A's repeated release reports the release.
async fn the_repeat_reports_the_release<B>(
    kind: Kind,
    topology: Topology,
    a: &B,
    b: &B,
    ta: LeaseToken,
) where
    B: LockBackend + RwBackend + SemaphoreBackend,
{
    let (key, tb) = (LockKey::from(KEY), LeaseToken::random());
    let rival = kind.rival();
    assert!(
        rival.backend_acquire(b, &key, tb, TTL).await.unwrap(),
        "{kind:?}: A's first attempt deleted its lease, so B gets the key"
    );
    assert!(rival.backend_release(b, &key, tb).await.unwrap());

    let repeated = settled("A's repeated release", || kind.backend_release(a, &key, ta)).await;
    assert!(
        repeated.unwrap(),
        "{kind:?} on {topology:?}: the repeated release must report the release its first \
         attempt made"
    );
    let stranger = LeaseToken::random();
    assert!(
        !kind.backend_release(a, &key, stranger).await.unwrap(),
        "{kind:?}: a token that never held the key is not released"
    );
}

/// Takes `key` as `kind` through `locker`, asking again while the backend
/// reconnects after a restart.
async fn take(kind: Kind, locker: &Locker, what: &str) -> Held {
    let wait = Duration::from_secs(10);
    within(
        Duration::from_secs(20),
        what,
        settled(what, || kind.acquire(locker, KEY, wait)),
    )
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A server of the cell's own (it restarts or reconfigures it), instances A and B
/// on it under a prefix of their own (`[A, B]`), and A holding [`KEY`] as `kind`.
async fn a_holds(cell: &str, kind: Kind, topology: Topology) -> (RedisServer, [Locker; 2], Held) {
    assert_eq!(
        topology,
        Topology::OneServer,
        "a cell of one server's faults"
    );
    let server = RedisServer::start();
    let prefix = unique_prefix(&format!("{cell}-{kind:?}"));
    let a = locker(&server.url(), &prefix).await;
    let b = locker(&server.url(), &prefix).await;
    let held = take(kind, &a, "A takes the key").await;
    (server, [a, b], held)
}

/// Redis restarts empty (no persistence) while A holds the lock: A's lease is
/// lost at once (not at its next renewal, 10 s away), B is not granted the same
/// lock while the restart's quarantine lasts, and A's release must say the lease was
/// lost. Before, a read-write or semaphore release whose first attempt met the
/// closed connection took "not held" on the repeat for its own doing, and said
/// `Ok`.
///
/// On the test kit, `SimServer::restart` is the empty restart.
async fn release_after_a_restart_reports_the_loss(kind: Kind, topology: Topology) {
    #[cfg(feature = "testing")]
    if topology == Topology::Sim {
        let (lockers, prefix) = topology
            .instances(&format!("restart-release-{kind:?}"), 2, TTL)
            .await;
        let held = take(kind, &lockers[0], "A takes the key").await;
        crate::kinds::sim_server(&prefix).restart();
        return lost_in_the_restart(kind, &lockers[1], held).await;
    }
    let (server, [_a, b], held) = a_holds("restart-release", kind, topology).await;
    let _log = server.log_on_panic();

    server.restart();
    lost_in_the_restart(kind, &b, held).await;
}
matrix!(release_after_a_restart_reports_the_loss:
    one_server => OneServer,
    #[cfg(feature = "testing")]
    sim => Sim,
);

/// After the restart: B takes the key, and A's release of `held` says its lease
/// was lost.
async fn lost_in_the_restart(kind: Kind, b: &Locker, held: Held) {
    within(Duration::from_secs(20), "A's loss", held.lost()).await;
    let other = settled("B tries the key during the quarantine", || {
        kind.rival().try_acquire(b, KEY)
    })
    .await
    .unwrap();
    assert!(
        other.is_none(),
        "{kind:?}: B was granted the key while the restart's quarantine lasts"
    );
    let released = held.release().await;
    assert!(
        matches!(released, Err(Error::LeaseLost { .. })),
        "{kind:?}: A's lease was lost in the restart, yet A's release returned {released:?}"
    );
}

/// The server is out of memory (`maxmemory` below its use, `noeviction`): new
/// locks are refused, but a release still deletes its lease, so the key is free
/// at once once memory is back, not after the 30 s TTL. Before, the mutex's
/// release wrote its tombstone before the delete, and Redis refused the whole
/// script.
async fn release_under_memory_pressure_frees_the_lock(kind: Kind, topology: Topology) {
    let (server, [_a, b], held) = a_holds("oom-release", kind, topology).await;
    let _log = server.log_on_panic();

    let mut con = server.connection().await;
    let config = |name: &'static str, value: &'static str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg(name).arg(value);
        cmd
    };
    query::<()>(&mut con, &config("maxmemory-policy", "noeviction")).await;
    query::<()>(&mut con, &config("maxmemory", "1")).await;
    let refused = kind.rival().try_acquire(&b, "another-key").await;
    let released = held.release().await;
    query::<()>(&mut con, &config("maxmemory", "0")).await;

    assert!(
        refused.is_err(),
        "the server is out of memory: a new lock must be refused, got {:?}",
        refused.map(|h| h.is_some())
    );
    assert!(
        released.is_ok(),
        "{kind:?}: a release under memory pressure failed: {released:?}"
    );
    let again = kind.rival().try_acquire(&b, KEY).await.unwrap();
    assert!(
        again.is_some(),
        "{kind:?}: the released lease is still in Redis"
    );
    again.unwrap().release().await.unwrap();
}
matrix!(release_under_memory_pressure_frees_the_lock: one_server => OneServer);
