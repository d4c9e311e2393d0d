//! The engine finds the violations of deliberately broken locks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::FencingToken;

use super::paused::paused_client;
use super::subject::{BoxFuture, Held, Release, Subject};
use super::workload::{cleanup, exercise};
use crate::report::Verdict;

/// A deliberately broken lock: grants every request at once, with a token that
/// only counts grants per instance (so two instances mint the same tokens);
/// never tells a holder of a loss.
struct Broken(AtomicU64);

impl Subject for Broken {
    fn acquire(&self, _key: String) -> BoxFuture<'_, Result<Held, String>> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Ok(Held {
                token: FencingToken::new(n, 0),
                is_lost: Box::new(|| false),
                release: Box::pin(async { Release::Done }),
            })
        })
    }

    fn is_held(&self, _key: String) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async { Ok(false) })
    }

    fn pause(&self, _paused: bool) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_the_violations_of_a_broken_lock() {
    let server = testkit::shared();
    let prefix = testkit::unique_prefix("selfcheck-broken");
    let subjects: Vec<Arc<dyn Subject>> = vec![
        Arc::new(Broken(AtomicU64::new(1))),
        Arc::new(Broken(AtomicU64::new(1))),
    ];
    let findings = exercise(
        subjects,
        server.connection().await,
        &prefix,
        super::ROUNDS,
        Duration::from_secs(10),
        || {},
    )
    .await;
    assert!(findings.sections > 0);
    assert!(findings.overlaps > 0, "{findings:?}");
    assert!(findings.out_of_order > 0, "{findings:?}");
    assert!(findings.checks().iter().any(|c| c.verdict == Verdict::Fail));
    cleanup(&mut server.connection().await, &prefix).await;
}

/// A lock that excludes (one process, a mutex per key, increasing tokens) but
/// takes a lost reply for a lost lease: every third release says "lost"
/// although nobody else took the key; and every fifth release forgets to free
/// its key in the state that `is_held` reads (a release that never landed).
#[derive(Default)]
struct Untruthful {
    keys: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    tokens: AtomicU64,
    releases: AtomicU64,
    stuck: Arc<Mutex<Vec<String>>>,
}

impl Subject for Untruthful {
    fn acquire(&self, key: String) -> BoxFuture<'_, Result<Held, String>> {
        Box::pin(async move {
            let lock = Arc::clone(self.keys.lock().unwrap().entry(key.clone()).or_default());
            let guard = lock.lock_owned().await;
            let epoch = self.tokens.fetch_add(1, Ordering::SeqCst) + 1;
            let n = self.releases.fetch_add(1, Ordering::SeqCst);
            let stuck = Arc::clone(&self.stuck);
            Ok(Held {
                token: FencingToken::new(epoch, 0),
                is_lost: Box::new(|| false),
                release: Box::pin(async move {
                    drop(guard);
                    if n % 5 == 4 {
                        stuck.lock().unwrap().push(key);
                    }
                    if n % 3 == 2 {
                        Release::Lost
                    } else {
                        Release::Done
                    }
                }),
            })
        })
    }

    fn is_held(&self, key: String) -> BoxFuture<'_, Result<bool, String>> {
        let held = self.stuck.lock().unwrap().contains(&key);
        Box::pin(async move { Ok(held) })
    }

    fn pause(&self, _paused: bool) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_untruthful_releases_and_keys_left_locked() {
    let server = testkit::shared();
    let prefix = testkit::unique_prefix("selfcheck-untruthful");
    let lock: Arc<dyn Subject> = Arc::new(Untruthful::default());
    let findings = exercise(
        vec![Arc::clone(&lock), lock],
        server.connection().await,
        &prefix,
        5,
        Duration::from_secs(10),
        || {},
    )
    .await;
    assert_eq!(findings.overlaps, 0, "{findings:?}");
    assert_eq!(findings.out_of_order, 0, "{findings:?}");
    assert!(findings.false_losses > 0, "{findings:?}");
    assert!(!findings.left_locked.is_empty(), "{findings:?}");
    let failed: Vec<&str> = findings
        .checks()
        .iter()
        .filter(|c| c.verdict == Verdict::Fail)
        .map(|c| c.id)
        .collect();
    assert_eq!(failed, ["truthful-release", "nothing-left-locked"]);
    cleanup(&mut server.connection().await, &prefix).await;
}

/// A lock that hands a paused holder's key to the next instance at once, with
/// the same token, and never tells the paused holder.
struct Amnesiac {
    paused: AtomicBool,
}

impl Subject for Amnesiac {
    fn acquire(&self, _key: String) -> BoxFuture<'_, Result<Held, String>> {
        Box::pin(async {
            Ok(Held {
                token: FencingToken::new(7, 0),
                is_lost: Box::new(|| false),
                release: Box::pin(async { Release::Done }),
            })
        })
    }

    fn is_held(&self, _key: String) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async { Ok(false) })
    }

    fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_a_paused_holder_that_is_not_fenced_out() {
    let server = testkit::shared();
    let prefix = testkit::unique_prefix("selfcheck-paused");
    let paused = Amnesiac {
        paused: AtomicBool::new(false),
    };
    let next = Amnesiac {
        paused: AtomicBool::new(false),
    };
    let check = paused_client(
        &paused,
        &next,
        server.connection().await,
        &prefix,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(check.verdict, Verdict::Fail, "{check:?}");
    assert!(check.detail.contains("not greater"), "{}", check.detail);
    assert!(
        check.detail.contains("did not report its loss"),
        "{}",
        check.detail
    );
    assert!(check.detail.contains("late write"), "{}", check.detail);
    assert!(
        check.detail.contains("reported success"),
        "{}",
        check.detail
    );
    assert!(!paused.paused.load(Ordering::SeqCst), "resumed at the end");
    cleanup(&mut server.connection().await, &prefix).await;
}
