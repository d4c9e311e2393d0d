//! Loss: a holder learns at once when the backend no longer keeps its lease, for
//! every kind.

use std::time::Duration;

use lockflight::Error;

use crate::exclusion::assert_idle;
use crate::{Kind, Topology, matrix};
use testkit::{RedisServer, query, wait_until, within};

/// A holder's lease is deleted in Redis behind its back (what an operator's `DEL`,
/// an eviction or a failover to a replica that never saw it does): the renewal
/// finds it gone, the loss is signalled within one validity window, and the
/// release says `LeaseLost`. On Redlock the lease is deleted from every node.
async fn a_deleted_lease_is_signalled_lost(kind: Kind, topology: Topology) {
    if topology.refuses(kind).await {
        return;
    }
    let ttl = Duration::from_secs(1);
    let (lockers, prefix) = topology
        .instances(&format!("deleted-{kind:?}"), 1, ttl)
        .await;
    let held = kind
        .acquire(&lockers[0], "k", Duration::from_secs(5))
        .await
        .unwrap();
    let lost = held.lost();
    let lock = format!("{prefix}:{{k}}");
    let names = [
        lock.clone(),
        format!("{lock}:rd"),
        format!("{lock}:wr"),
        format!("{lock}:sem"),
    ];
    let deleted = match topology {
        // Its failover: the key's leases deleted behind the holder's back.
        #[cfg(feature = "testing")]
        Topology::Sim => u64::from(
            crate::kinds::sim_server(&prefix)
                .lose_lease("k")
                .expect("a valid key"),
        ),
        _ => topology.delete(&names).await,
    };
    let holders = if topology == Topology::Redlock {
        2..=3
    } else {
        1..=1
    };
    assert!(
        holders.contains(&deleted),
        "{kind:?} on {topology:?}: exactly the lease's own name held it, on {holders:?} \
         node(s); {deleted} deleted"
    );
    within(
        ttl * 2,
        "the loss of the deleted lease to be signalled",
        lost,
    )
    .await;
    let released = held.release().await;
    assert!(
        matches!(released, Err(Error::LeaseLost { .. })),
        "{kind:?} on {topology:?}: the release of a deleted lease returned {released:?}"
    );
    assert_idle(&lockers, "after the loss").await;
}
matrix!(a_deleted_lease_is_signalled_lost:
    one_server => OneServer,
    cluster => Cluster,
    sentinel => Sentinel,
    redlock => Redlock,
    uncoalesced => Uncoalesced,
    #[cfg(feature = "testing")]
    sim => Sim,
);

/// The server holding the lease is turned into a replica with the same data (a
/// demoted primary): the lease's next renewal is refused `READONLY`, and that is a
/// loss at once, for every kind, long before the validity would run out; the
/// reason says why.
async fn a_renewal_refused_readonly_is_a_loss(kind: Kind, topology: Topology) {
    assert_eq!(topology, Topology::OneServer, "demotes its own server");
    let (x, y) = (RedisServer::start(), RedisServer::start());
    let _logs = (x.log_on_panic(), y.log_on_panic());
    let prefix = testkit::unique_prefix(&format!("readonly-{kind:?}"));
    let ttl = Duration::from_secs(6);
    let locker = lockflight::Locker::builder(testkit::backend_at(&x.url(), &prefix).await)
        .lease_ttl(ttl)
        .renew_every(Duration::from_millis(300))
        .build()
        .unwrap();
    let held = kind
        .acquire(&locker, "k", Duration::from_secs(5))
        .await
        .unwrap();
    let lost = held.lost();

    // Y copies X's data, takes over as a primary, and X follows it: X keeps the
    // lease but refuses writes.
    let (mut cx, mut cy) = (x.connection().await, y.connection().await);
    let replicaof = |port: Option<u16>| {
        let mut cmd = redis::cmd("REPLICAOF");
        match port {
            Some(port) => cmd.arg("127.0.0.1").arg(port),
            None => cmd.arg("NO").arg("ONE"),
        };
        cmd
    };
    query::<()>(&mut cy, &replicaof(Some(x.port()))).await;
    assert!(synced(&y).await, "Y did not finish its sync from X in time");
    query::<()>(&mut cy, &replicaof(None)).await;
    let demoted = std::time::Instant::now();
    query::<()>(&mut cx, &replicaof(Some(y.port()))).await;
    assert!(synced(&x).await, "X did not finish its sync from Y in time");

    within(ttl / 2, "the loss after a renewal refused READONLY", lost).await;
    println!("{kind:?}: lost {:?} after the demotion", demoted.elapsed());
    let reason = match &held {
        crate::Held::Lock(g) => g.loss_signal().reason(),
        crate::Held::Read(g) => g.loss_signal().reason(),
        crate::Held::Write(g) => g.loss_signal().reason(),
        crate::Held::Permit(p) => p.loss_signal().reason(),
        // A MultiGuard shows no reason of its own; its leases are mutexes.
        crate::Held::Many(_) => Some("read-only (the mutex's)".into()),
    }
    .unwrap_or_default();
    assert!(
        reason.contains("read-only"),
        "{kind:?}: the loss must say the node refused as a read-only replica: {reason}"
    );
    // The release goes to a replica: refused, or the lease reported lost; never Ok.
    let released = held.release().await;
    assert!(
        matches!(
            released,
            Err(Error::Refused { .. } | Error::LeaseLost { .. })
        ),
        "{kind:?}: a release on a demoted node returned {released:?}"
    );
    drop(locker);
}
matrix!(a_renewal_refused_readonly_is_a_loss: one_server => OneServer);

/// Waits (up to 10 s) until `replica` reports its link to the primary up and no
/// sync in progress.
async fn synced(replica: &RedisServer) -> bool {
    wait_until(Duration::from_secs(10), || async {
        let mut con = replica.connection().await;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await
            .unwrap_or_default();
        info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0")
    })
    .await
}
