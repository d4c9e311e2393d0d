//! What the command's test binaries share: running the binary, reading reports.

#![allow(dead_code, unreachable_pub)] // each test binary uses a part

use std::process::Command;

use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey};
use lockflight::{FencingToken, LockGuard};
use serde_json::Value;

/// Runs the binary with `args`; returns the exit code and stdout parsed as JSON
/// (`Value::Null` if it is not JSON).
pub async fn lockflight(args: Vec<String>) -> (i32, Value) {
    lockflight_with_env(args, Vec::new()).await.0
}

/// `lockflight release --force --yes --json [options…] --prefix P --fence F URL KEY`:
/// asserts it succeeded; returns its report and the token its fence advanced to.
pub async fn force_release(
    options: &[&str],
    prefix: &str,
    fence: &str,
    url: &str,
    key: &str,
) -> (Value, FencingToken) {
    let mut list = vec!["release", "--force", "--yes", "--json"];
    list.extend_from_slice(options);
    list.extend(["--prefix", prefix, "--fence", fence, url, key]);
    let (code, report) = lockflight(args(&list)).await;
    assert_eq!(code, 0, "{report:#}");
    let forced = FencingToken::new(report["fence"]["epoch"].as_u64().unwrap(), 0);
    (report, forced)
}

/// What a forced release of `stuck`'s key (its fence advanced to `forced`, past
/// `stuck`'s token `old`) must lead to, on `resource` through `data`: the stuck
/// holder's late write is refused at once, the `waiter` gets the key with a newer
/// token and its write lands, and the stuck holder learns of its loss (its
/// instance is told at once; its next renewal would find it too). Returns the
/// waiter's guard.
pub async fn after_forced_release<C>(
    resource: &FencedKey,
    data: &mut C,
    stuck: &LockGuard,
    (old, forced): (FencingToken, FencingToken),
    waiter: tokio::task::JoinHandle<lockflight::Result<LockGuard>>,
) -> LockGuard
where
    C: redis::aio::ConnectionLike + Send,
{
    assert!(
        forced > old,
        "the forced fence is newer than the old holder's token"
    );
    assert_eq!(
        resource
            .set(data, stuck, "the stuck holder's late write")
            .await
            .unwrap(),
        Fenced::Stale {
            last: forced,
            offered: old
        }
    );
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the key soon after the forced release")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > forced);
    assert!(
        resource
            .set(data, &next, "the waiter's write")
            .await
            .unwrap()
            .is_applied()
    );
    tokio::time::timeout(Duration::from_secs(15), stuck.lost())
        .await
        .expect("the stuck holder is told its lease is lost");
    next
}

/// [`lockflight`] with these environment variables set; also returns stderr.
pub async fn lockflight_with_env(
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> ((i32, Value), String) {
    let (code, stdout, stderr) = lockflight_output(args, env).await;
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    ((code, json), stderr)
}

/// Runs the binary with `args` and these environment variables (stdin empty);
/// returns the exit code, stdout and stderr (also printed, to show with a failing
/// test's output).
pub async fn lockflight_output(
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> (i32, String, String) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_lockflight"))
            .args(&args)
            .envs(env)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run lockflight")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprint!("{stderr}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

/// `list` as owned arguments.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The verdict of check `id` in a doctor report.
pub fn verdict<'a>(report: &'a Value, id: &str) -> (&'a str, &'a str) {
    let check = report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["id"] == id))
        .unwrap_or_else(|| panic!("no check {id} in {report:#}"));
    (
        check["verdict"].as_str().unwrap_or_default(),
        check["detail"].as_str().unwrap_or_default(),
    )
}

/// Every check `id` of a report (a cluster report has one per primary), as
/// `(verdict, detail)`.
pub fn verdicts<'a>(report: &'a Value, id: &str) -> Vec<(&'a str, &'a str)> {
    report["checks"]
        .as_array()
        .map(|checks| {
            checks
                .iter()
                .filter(|c| c["id"] == id)
                .map(|c| {
                    (
                        c["verdict"].as_str().unwrap_or_default(),
                        c["detail"].as_str().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
