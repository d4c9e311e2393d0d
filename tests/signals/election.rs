//! What an election tells the operator, on the test kit's clock: a tracing event
//! when leadership is gained, lost (with the loss's cause) and given up, and the
//! `metrics` feature's `lockflight_leader` gauge, `lockflight_leader_terms_total`
//! and `lockflight_elect_seconds`, labelled with the election key.

use std::collections::HashMap;
use std::time::Duration;

use lockflight::Locker;
use lockflight::testing::SimServer;
use metrics_util::debugging::{DebugValue, Snapshotter};
use testkit::Logs;

/// The metrics labelled `election=key` since the last snapshot, by name: a
/// gauge's value, a counter's increase, a histogram's number of samples (a
/// snapshot of the debugging recorder takes what it reports).
fn metrics(snapshotter: &Snapshotter, key: &str) -> HashMap<String, f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| {
            k.key()
                .labels()
                .any(|l| l.key() == "election" && l.value() == key)
        })
        .map(|(k, .., value)| {
            let value = match value {
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Counter(n) => n as f64,
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            (k.key().name().to_owned(), value)
        })
        .collect()
}

/// Waits until the observation names the leader of `term` (or nobody), within
/// one second of the paused clock: less than the TTL, so only an announcement
/// explains it.
async fn sees(
    seen: &mut lockflight::election::Observation,
    term: Option<lockflight::FencingToken>,
) {
    use lockflight::election::Observed;
    let names = async {
        loop {
            match seen.next().await.expect("the observation ended") {
                Observed::Leader(l) if Some(l.term) == term => return,
                Observed::NoLeader if term.is_none() => return,
                _ => {}
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(1), names)
        .await
        .is_err()
    {
        panic!(
            "the observer did not see {term:?} within 1 s: {:?}",
            seen.current()
        );
    }
}

/// A current-thread runtime, so that every task's events reach this thread's
/// subscriber.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn gain_loss_and_resignation_are_logged_and_counted() {
    let (_serial, snapshotter) = super::recorder().await;
    let (logs, _guard) = Logs::capture();
    let server = SimServer::new();
    let locker = Locker::builder(server.backend())
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let election = locker.election("jobs").identity("worker-a");
    // Another instance watches: the kit announces each change of the record, as
    // Redis does, so it follows without waiting for its once-per-TTL re-read.
    let watcher = Locker::builder(server.backend())
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let mut seen = watcher.election("jobs").observe();
    // Its first read (nobody leads) is not a change.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut changes = 0.0;

    // Gained, then resigned.
    let first = election.campaign().await.unwrap();
    assert!(
        server.requests().leader >= 1,
        "the leader record was written"
    );
    sees(&mut seen, Some(first.fencing_token())).await;
    let m = metrics(snapshotter, "jobs");
    changes += m
        .get("lockflight_leader_changes_total")
        .copied()
        .unwrap_or(0.0);
    assert_eq!(m["lockflight_leader"], 1.0, "{m:?}");
    assert_eq!(m["lockflight_leader_terms_total"], 1.0, "{m:?}");
    assert_eq!(m["lockflight_elect_seconds"], 1.0, "{m:?}");
    let term = first.fencing_token().to_string();
    assert_eq!(
        logs.lines_with(&["INFO", "leadership gained", "worker-a", &term]),
        1
    );
    first.resign().await.unwrap();
    sees(&mut seen, None).await;
    assert_eq!(
        logs.lines_with(&["INFO", "leadership given up", "resigned", &term]),
        1
    );

    // Gained again, then lost: the lease disappears from the server, and the next
    // renewal finds it gone.
    let second = election.campaign().await.unwrap();
    sees(&mut seen, Some(second.fencing_token())).await;
    let m = metrics(snapshotter, "jobs");
    changes += m
        .get("lockflight_leader_changes_total")
        .copied()
        .unwrap_or(0.0);
    assert_eq!(changes, 2.0, "the watcher saw two new leaders: {m:?}");
    assert_eq!(m["lockflight_leader"], 1.0, "{m:?}");
    assert_eq!(m["lockflight_leader_terms_total"], 1.0, "one more: {m:?}");
    assert!(server.lose_lease("jobs").unwrap());
    second.lost().await;
    let term = second.fencing_token().to_string();
    // Virtual time: the refresher sees the loss at once; a second is plenty.
    for _ in 0..100 {
        if logs.lines_with(&["leadership lost"]) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(logs.lines_with(&["WARN", "leadership lost", &term]), 1);
    let cause = second
        .loss_signal()
        .reason()
        .expect("a lost lease has a reason");
    assert_eq!(logs.lines_with(&["leadership lost", &cause]), 1);
    // Dropping a lost leadership says nothing more.
    drop(second);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(logs.lines_with(&["leadership given up"]), 1);
}
