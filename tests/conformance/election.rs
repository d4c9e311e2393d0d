//! The election column: the same election cells on every topology (Redlock, which
//! keeps no leader record, refuses a campaign with `Error::Unsupported`).
//!
//! * `a_resignation_hands_over_and_observers_follow`: A leads, B waits, C only
//!   observes. A resigns: B leads with a greater term, and the leader record, as
//!   `leader()` and C's `observe()` read it, names B; B resigns: nobody leads.
//! * `a_leader_that_vanishes_is_replaced_after_its_ttl`: the leader's process
//!   "dies" (its leadership is dropped on a thread without a runtime, so nothing is
//!   sent, as after `kill -9`): the waiting instance leads once the lease's TTL
//!   ends, with a greater term, and observers follow. (Real processes killed and
//!   stopped: `tests/election/processes.rs`, on one server.)

use std::time::Duration;

use lockflight::{Error, Locker};
use testkit::{eventually, within};

use crate::{Topology, matrix};

/// A limit that only a hang reaches.
const TOLD: Duration = Duration::from_secs(30);

/// Whether `topology` refuses elections; checks that the refusal is typed.
async fn refuses(topology: Topology, locker: &Locker) -> bool {
    if topology != Topology::Redlock {
        return false;
    }
    let refused = locker.election("leader").identity("a").campaign().await;
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    true
}

/// Takes the items of `observer` until one names `identity` (or nobody, for
/// `None`).
async fn observed(
    observer: &mut lockflight::election::Observation,
    identity: Option<&str>,
    term: Option<lockflight::FencingToken>,
) {
    use lockflight::election::Observed;
    within(TOLD, &format!("the observer sees {identity:?}"), async {
        loop {
            match (
                observer.next().await.expect("the observation ended"),
                identity,
            ) {
                (Observed::NoLeader, None) => return,
                (Observed::Leader(l), Some(id))
                    if l.identity == id && term.is_none_or(|t| l.term == t) =>
                {
                    return;
                }
                _ => {}
            }
        }
    })
    .await
}

async fn a_resignation_hands_over_and_observers_follow(topology: Topology) {
    let (lockers, _) = topology
        .instances("election-resign", 3, Duration::from_secs(10))
        .await;
    if refuses(topology, &lockers[0]).await {
        return;
    }
    let (a, b) = (
        lockers[0].election("leader").identity("a"),
        lockers[1].election("leader").identity("b"),
    );
    let watcher = lockers[2].election("leader");
    let mut seen = watcher.observe();
    let a_leads = within(TOLD, "A leads", a.campaign()).await.unwrap();
    observed(&mut seen, Some("a"), Some(a_leads.fencing_token())).await;
    let asked = lockers[1].stats().acquire_attempts;
    let next = tokio::spawn(async move { b.campaign().await });
    // B asked (and was told to wait), then a window for a wrong grant to show.
    eventually("B's campaign asked", || async {
        lockers[1].stats().acquire_attempts > asked
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!next.is_finished(), "B leads while A does");
    let a_term = a_leads.fencing_token();
    a_leads.resign().await.unwrap();
    let b_leads = within(TOLD, "B leads", next).await.unwrap().unwrap();
    assert!(
        b_leads.fencing_token() > a_term,
        "{} <= {a_term}",
        b_leads.fencing_token()
    );
    observed(&mut seen, Some("b"), Some(b_leads.fencing_token())).await;
    let read = watcher.leader().await.unwrap().expect("B leads");
    assert_eq!(
        (read.identity.as_str(), read.term),
        ("b", b_leads.fencing_token())
    );
    b_leads.resign().await.unwrap();
    observed(&mut seen, None, None).await;
    assert_eq!(watcher.leader().await.unwrap(), None);
}
matrix!(a_resignation_hands_over_and_observers_follow: every topology, no kind);

async fn a_leader_that_vanishes_is_replaced_after_its_ttl(topology: Topology) {
    let ttl = Duration::from_secs(1);
    let (lockers, _) = topology.instances("election-vanish", 3, ttl).await;
    if refuses(topology, &lockers[0]).await {
        return;
    }
    let a = lockers[0].election("leader").identity("a");
    let b = lockers[1].election("leader").identity("b");
    let mut seen = lockers[2].election("leader").observe();
    let a_leads = within(TOLD, "A leads", a.campaign()).await.unwrap();
    let a_term = a_leads.fencing_token();
    observed(&mut seen, Some("a"), Some(a_term)).await;
    let next = tokio::spawn(async move { b.campaign().await });
    // A's process is gone: nothing is sent, its lease ends at its TTL.
    std::thread::spawn(move || drop(a_leads))
        .join()
        .expect("dropped without a runtime");
    let b_leads = within(TOLD, "B leads", next).await.unwrap().unwrap();
    assert!(
        b_leads.fencing_token() > a_term,
        "{} <= {a_term}",
        b_leads.fencing_token()
    );
    observed(&mut seen, Some("b"), Some(b_leads.fencing_token())).await;
    b_leads.resign().await.unwrap();
}
matrix!(a_leader_that_vanishes_is_replaced_after_its_ttl: every topology, no kind);
