//! What lockflight tells the operator through the `metrics` facade (feature
//! `metrics`): the locks' counters and histograms ([`metrics`]) and an
//! election's gauge, counters and tracing events ([`election`], feature `testing`
//! too).
//!
//! A process has one metrics recorder, and every lease of every test would
//! report to it: so this binary holds only these tests, they share one
//! debugging recorder ([`recorder`]), and they run one at a time, each starting
//! from an empty snapshot.
#![cfg(feature = "metrics")]

#[cfg(feature = "testing")]
mod election;
mod metrics;

use std::sync::OnceLock;

use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use tokio::sync::MutexGuard;

/// The binary's recorder, installed at the first call, for the calling test
/// alone while it holds the guard: what it reports from then on is the test's.
async fn recorder() -> (MutexGuard<'static, ()>, &'static Snapshotter) {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    let serial = SERIAL.lock().await;
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    });
    // A snapshot takes what it reports: what earlier tests left is gone.
    drop(snapshotter.snapshot());
    (serial, snapshotter)
}
