//! The grant column: where a release passes the key to an instance waiting at
//! the backend without that instance asking ("The grant" in ARCHITECTURE.md), and
//! where it only wakes it.
//!
//! * `a_release_passes_the_key_to_a_waiting_instance`: instance A holds the
//!   key, instance B waits for it at the backend with the kind that excludes A's
//!   (a writer behind a reader, a mutex behind `lock_many`), A releases. Where the
//!   release is a mutex's on one server, a Cluster or Sentinel (coalescing or
//!   not), the release script grants the key to B, which takes the lease from the
//!   message alone: one grant, no acquire request of B's, a greater fencing
//!   token. Everywhere else B is woken and asks: Redlock's nodes do not grant (one
//!   node's grant is no quorum), nor do the memory backend and the test kit, and
//!   the read-write lock and the semaphore wake their waiters. `lock_many` takes
//!   each key as a mutex, so its release of the first key grants it too.

use std::time::Duration;

use lockflight::{LockKey, Locker};
use testkit::{eventually, within};

use crate::exclusion::assert_idle;
use crate::{Kind, Topology, matrix};

/// The key of the cell, under its own prefix.
const KEY: &str = "k";

/// How long a waiting instance's queue entry lives in the cell.
const ENTRY_TTL: Duration = Duration::from_secs(60);

/// Whether A's release of `kind` on `topology` grants the key to B's waiting
/// `kind.rival()`: a release grants to a waiting mutex (`lock_many` releases
/// mutexes) or a waiting writer (behind a writer or a reader), and only a Redis
/// backend that is no Redlock node (`Inner::grants`).
fn grants(kind: Kind, topology: Topology) -> bool {
    matches!(kind.rival(), Kind::Mutex | Kind::Write)
        && matches!(
            topology,
            Topology::OneServer | Topology::Cluster | Topology::Sentinel | Topology::Uncoalesced
        )
}

/// Waits until `waiter`'s acquire is waiting at the backend: its request is
/// sent, and where the release grants, its entry is in the key's queue (a
/// writer's: among the waiting writers) on the server (the busy answer wrote it:
/// the release finds B first).
async fn waits_at_the_backend(waiter: &Locker, kind: Kind, topology: Topology, prefix: &str) {
    eventually("B's acquire request", || {
        let sent = waiter.stats().acquire_attempts > 0;
        async move { sent }
    })
    .await;
    if grants(kind, topology) {
        let key = LockKey::from(KEY);
        let queue = if kind.rival() == Kind::Write {
            [&testkit::names::lock(prefix, &key)[..], b":ww"].concat()
        } else {
            testkit::names::queue(prefix, &key)
        };
        let con = topology.connection_for(&queue).await;
        eventually("B queued at the server", || {
            let (mut con, queue) = (con.clone(), queue.clone());
            async move {
                redis::cmd("ZCARD")
                    .arg(&queue)
                    .query_async::<u64>(&mut con)
                    .await
                    .expect("ZCARD")
                    == 1
            }
        })
        .await;
    }
}

/// A holds `kind`, B waits for the key with `kind.rival()`, A releases: where the
/// release grants, B holds the key from the grant message with no request of its
/// own; elsewhere it took no grant and got the key when woken. The key is free
/// and nothing stays in memory afterwards.
async fn a_release_passes_the_key_to_a_waiting_instance(kind: Kind, topology: Topology) {
    if topology.refuses(kind).await {
        return;
    }
    // B's queue entry lives a minute, so B refreshes it every 20 s: no refresh
    // of its own can fall between A's release and B's lease, and a request of
    // B's there is the wake-up path's.
    let (lockers, prefix) = topology
        .instances_with_entries(
            &format!("transfer-{kind:?}"),
            2,
            Duration::from_secs(30),
            Some(ENTRY_TTL),
        )
        .await;
    let (a, b) = (&lockers[0], &lockers[1]);
    let held = kind
        .acquire(a, KEY, Duration::from_secs(5))
        .await
        .expect("A takes the key");
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { kind.rival().acquire(&b, KEY, Duration::from_secs(30)).await })
    };
    waits_at_the_backend(b, kind, topology, &prefix).await;
    let before = b.stats();
    let a_token = held.fencing_token();
    held.release().await.expect("A's release");
    let next = within(Duration::from_secs(10), "B to take the key", waiting)
        .await
        .expect("B's acquire task")
        .unwrap_or_else(|e| panic!("{kind:?} on {topology:?}: B's acquire: {e}"));
    let delta = b.stats() - before;
    if grants(kind, topology) {
        assert_eq!(
            (delta.grants, delta.acquire_attempts),
            (1, 0),
            "{kind:?} on {topology:?}: B holds from the grant, with no request: {delta:?}"
        );
    } else {
        assert_eq!(
            b.stats().grants,
            0,
            "{kind:?} on {topology:?}: no grant here: B was woken and asked"
        );
    }
    assert!(!next.is_lost(), "{kind:?} on {topology:?}: B's lease");
    if let (Some(a_token), Some(b_token)) = (a_token, next.fencing_token()) {
        assert!(
            b_token > a_token,
            "{kind:?} on {topology:?}: B's token {b_token:?} after A's {a_token:?}"
        );
    }
    next.release().await.expect("B's release");
    let again = within(Duration::from_secs(10), "A to find the key free", async {
        kind.try_acquire(a, KEY).await
    })
    .await
    .expect("A's try")
    .unwrap_or_else(|| panic!("{kind:?} on {topology:?}: the key stayed locked after B's release"));
    again.release().await.expect("A's second release");
    assert_idle(&lockers, "after the transfer").await;
}
matrix!(a_release_passes_the_key_to_a_waiting_instance: every topology);
