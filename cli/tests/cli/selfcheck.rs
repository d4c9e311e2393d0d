//! `selfcheck` on lockflight.

use testkit::shared;

use crate::support::{args, lockflight, verdict};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selfcheck_finds_no_violation_on_lockflight() {
    let (code, report) = lockflight(args(&[
        "selfcheck",
        "--json",
        "--seconds",
        "20",
        &shared().url(),
    ]))
    .await;
    assert_eq!(code, 0, "{report:#}");
    for id in [
        "exclusion",
        "fenced-order",
        "lost-updates",
        "truthful-release",
        "nothing-left-locked",
        "lost-replies",
        "paused-client",
    ] {
        assert_eq!(verdict(&report, id).0, "pass", "{id}: {report:#}");
    }
    // The failures its own lost replies cause are not the server's errors.
    let ids: Vec<&str> = report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert!(!ids.contains(&"errors"), "{report:#}");
    assert!(
        verdict(&report, "lost-replies")
            .1
            .contains("because of those cuts"),
        "{report:#}"
    );
}
