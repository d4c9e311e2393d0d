//! The `metrics` feature: counters mirror `Stats`, and wait time, hold time and
//! renewals per lease are recorded as histograms under their documented names,
//! labelled with the `kind` of lease (lock, read, write, permit).

use std::collections::HashMap;
use std::time::Duration;

use lockflight::{Handoff, Locker, MemoryBackend};
use metrics_util::debugging::{DebugValue, Snapshotter};

/// Histogram samples and counter values by metric name.
fn read(snapshotter: &Snapshotter) -> (HashMap<String, Vec<f64>>, HashMap<String, u64>) {
    let mut histograms = HashMap::new();
    let mut counters = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        match value {
            DebugValue::Histogram(samples) => {
                let samples: Vec<f64> = samples.into_iter().map(|s| s.into_inner()).collect();
                // By name, and by name and `kind` label ("name{kind}").
                for label in key.key().labels() {
                    histograms
                        .entry(format!("{name}{{{}}}", label.value()))
                        .or_insert_with(Vec::new)
                        .extend(samples.iter().copied());
                }
                histograms
                    .entry(name)
                    .or_insert_with(Vec::new)
                    .extend(samples);
            }
            DebugValue::Counter(n) => {
                counters.insert(name, n);
            }
            DebugValue::Gauge(_) => {}
        }
    }
    (histograms, counters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_hold_and_renewals_are_recorded() {
    let (_serial, snapshotter) = super::recorder().await;

    // No handoff: each holder has its own lease (and its own renewals sample).
    let locker = Locker::builder(MemoryBackend::new())
        .lease_ttl(Duration::from_millis(300))
        .handoff(Handoff::disabled())
        .build()
        .unwrap();
    // A holder that keeps the lock across two renewals, and a waiter behind it.
    let guard = locker.lock("k").await.unwrap();
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move { locker.lock("k").await.unwrap().release().await.unwrap() }
    });
    // The hold the samples measure (real time: the histograms record it).
    tokio::time::sleep(Duration::from_millis(250)).await;
    // And a renewal of it seen, not guessed from the hold's length.
    assert!(
        testkit::wait_until(testkit::EVENTUALLY, || async {
            locker.stats().renewals >= 1
        })
        .await,
        "the long holder's lease was never renewed: {:?}",
        locker.stats()
    );
    guard.release().await.unwrap();
    waiter.await.unwrap();

    let (histograms, counters) = read(snapshotter);
    let waits = &histograms["lockflight_wait_seconds"];
    assert_eq!(waits.len(), 2, "one sample per grant: {waits:?}");
    assert!(
        waits.iter().any(|w| *w >= 0.2),
        "the waiter waited for the holder: {waits:?}"
    );
    let holds = &histograms["lockflight_hold_seconds"];
    assert_eq!(holds.len(), 2, "{holds:?}");
    assert!(holds.iter().any(|h| *h >= 0.2), "{holds:?}");
    let renewals = &histograms["lockflight_lease_renewals"];
    assert_eq!(
        renewals.len(),
        2,
        "one sample per final release: {renewals:?}"
    );
    assert!(
        renewals.iter().any(|n| *n >= 1.0),
        "the long holder's lease was renewed: {renewals:?}"
    );
    assert_eq!(histograms["lockflight_wait_seconds{lock}"].len(), 2);
    let stats = locker.stats();
    assert_eq!(counters["lockflight_acquired_total"], stats.acquired);
    assert_eq!(counters["lockflight_releases_total"], stats.releases);

    // Every member of the family records under its own `kind`.
    locker
        .rwlock("rw")
        .read()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locker
        .rwlock("rw")
        .write()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locker
        .semaphore("sem", 2)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let (histograms, _) = read(snapshotter);
    for kind in ["read", "write", "permit"] {
        for name in [
            "lockflight_wait_seconds",
            "lockflight_hold_seconds",
            "lockflight_lease_renewals",
        ] {
            let samples = histograms.get(&format!("{name}{{{kind}}}"));
            assert_eq!(
                samples.map(Vec::len),
                Some(1),
                "{name} with kind={kind}: {samples:?}"
            );
        }
    }
}
