//! `doctor`'s verdicts on deliberately misconfigured servers.

use serde_json::Value;
use testkit::{Engine, MINIMAL_ACL_RULES, RedisServer, set_acl_user, shared};

use crate::lockflight_text;
use crate::support::{args, lockflight, verdict};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_fails_an_evicting_policy() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let (code, report) = lockflight(args(&["doctor", "--json", &server.url()])).await;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(verdict(&report, "maxmemory-policy").0, "pass");
    assert_eq!(verdict(&report, "acl").0, "pass");
    assert_eq!(verdict(&report, "script-publish").0, "pass");
    // The test server has no persistence: a warning, which only --strict fails.
    assert_eq!(verdict(&report, "persistence").0, "warn", "{report:#}");
    let (code, _) = lockflight(args(&["doctor", "--json", "--strict", &server.url()])).await;
    assert_eq!(code, 1, "--strict fails on warnings");

    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory-policy", "allkeys-lru"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let (code, report) = lockflight(args(&["doctor", "--json", &server.url()])).await;
    // An evicting policy can delete a held lock: two holders, so a failure.
    assert_eq!(code, 1, "{report:#}");
    let (v, detail) = verdict(&report, "maxmemory-policy");
    assert_eq!(v, "fail");
    assert!(detail.contains("allkeys-lru"), "{detail}");
    assert_eq!(report["summary"]["verdict"], "fail", "{report:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_fails_a_user_missing_a_right_and_passes_the_minimal_line() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let url = |user: &str| format!("redis://{user}:pw@127.0.0.1:{}/", server.port());

    set_acl_user(&mut admin, "full", MINIMAL_ACL_RULES).await;
    let (code, report) = lockflight(args(&[
        "doctor",
        "--json",
        "--prefix",
        "lfacl",
        &url("full"),
    ]))
    .await;
    assert_eq!(verdict(&report, "acl").0, "pass", "{report:#}");
    assert_eq!(verdict(&report, "scripts").0, "pass", "{report:#}");
    assert_eq!(code, 0, "{report:#}");

    let lacking: Vec<&str> = MINIMAL_ACL_RULES
        .iter()
        .copied()
        .filter(|r| *r != "+zadd")
        .collect();
    set_acl_user(&mut admin, "nozadd", &lacking).await;
    let (code, report) = lockflight(args(&[
        "doctor",
        "--json",
        "--prefix",
        "lfacl",
        &url("nozadd"),
    ]))
    .await;
    let (v, detail) = verdict(&report, "acl");
    assert_eq!((v, code), ("fail", 1), "{report:#}");
    assert!(
        detail.contains("+zadd") && !detail.contains("+zrem,"),
        "{detail}"
    );

    // Without +time the server's clock cannot be read: "unknown", never "pass".
    let lacking: Vec<&str> = MINIMAL_ACL_RULES
        .iter()
        .copied()
        .filter(|r| *r != "+time")
        .collect();
    set_acl_user(&mut admin, "notime", &lacking).await;
    let (_, report) = lockflight(args(&[
        "doctor",
        "--json",
        "--prefix",
        "lfacl",
        &url("notime"),
    ]))
    .await;
    let (v, detail) = verdict(&report, "clock");
    assert_eq!(v, "unknown", "{report:#}");
    assert!(detail.contains("could not be read"), "{detail}");
    assert!(verdict(&report, "acl").1.contains("+time"), "{report:#}");

    // The wrong prefix: the key pattern is missing.
    let (code, report) = lockflight(args(&[
        "doctor",
        "--json",
        "--prefix",
        "other",
        &url("full"),
    ]))
    .await;
    let (v, detail) = verdict(&report, "acl");
    assert_eq!((v, code), ("fail", 1), "{report:#}");
    assert!(detail.contains("~other:*"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_fails_replica_ack_without_replicas() {
    let (code, report) = lockflight(args(&[
        "doctor",
        "--json",
        "--replica-ack",
        "1",
        &shared().url(),
    ]))
    .await;
    let (v, detail) = verdict(&report, "replicas");
    assert_eq!((v, code), ("fail", 1), "{report:#}");
    assert!(detail.contains("replica_ack(1)"), "{detail}");
}

#[tokio::test]
async fn doctor_takes_several_urls_only_for_sentinels() {
    let (code, report) = lockflight(args(&[
        "doctor",
        "--json",
        "redis://127.0.0.1:1/",
        "redis://127.0.0.1:2/",
    ]))
    .await;
    assert_eq!((code, report), (2, Value::Null), "bad usage, nothing run");
}

#[tokio::test]
async fn doctor_reports_an_unreachable_server_with_exit_3() {
    let (code, report) = lockflight(args(&["doctor", "--json", "redis://127.0.0.1:1/"])).await;
    assert_eq!(code, 3);
    assert!(
        report["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot connect"))
    );
}

/// The test run's engine (`LOCKFLIGHT_TEST_ENGINE`, testkit's `Engine`) is the
/// one `doctor` names, with its own version: Valkey says `redis_version:7.2.4`
/// for compatibility, which is not its version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_the_engine_of_the_test_run() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut admin)
        .await
        .unwrap();
    let field = match Engine::current() {
        Engine::Redis => "redis_version:",
        Engine::Valkey => "valkey_version:",
    };
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {info}"))
        .trim();

    let (code, report) = lockflight(args(&["doctor", "--json", &server.url()])).await;
    assert_eq!(code, 0, "{report:#}");
    let (v, detail) = verdict(&report, "version");
    assert_eq!(v, "pass", "{report:#}");
    let engine = format!("engine: {} {version} ", Engine::current().name());
    assert!(
        detail.starts_with(&engine),
        "{detail:?} should name {engine:?}"
    );
}

/// doctor's summary counts one warning as one: the default user sees one (no
/// persistence), a user without `+info` two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_counts_one_warning_and_two_warnings() {
    let server = RedisServer::start();
    let (code, text) = lockflight_text(&["doctor", &server.url()]).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.lines()
            .last()
            .is_some_and(|l| l.contains(", 1 warning, ")),
        "{text}"
    );

    let mut admin = server.connection().await;
    set_acl_user(&mut admin, "noinfo", MINIMAL_ACL_RULES).await;
    let url = format!("redis://noinfo:pw@127.0.0.1:{}/", server.port());
    let (_, text) = lockflight_text(&["doctor", "--prefix", "lfacl", &url]).await;
    assert!(
        text.lines()
            .last()
            .is_some_and(|l| l.contains(", 2 warnings, ")),
        "{text}"
    );
}
