//! `lockflight doctor --sentinel` on a real Sentinel set (a primary, two replicas,
//! three sentinels with quorum 2, started once for this test binary): a healthy
//! set passes; an unknown master name, a `replica_ack` the replicas cannot meet
//! and an evicting policy on the primary get their verdicts. A second set whose
//! nodes require passwords is checked with `--primary-user` and
//! `LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD`.
//!
//! The tests change the primary's configuration, so they run one at a time (the
//! `SERIAL` lock).

mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::{args, lockflight, lockflight_with_env, verdict, verdicts};
use testkit::sentinel::{Auth, MASTER, Sentinels};
use testkit::wait_until;
use tokio::sync::OnceCell;

static TOPOLOGY: OnceCell<Sentinels> = OnceCell::const_new();
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The topology, for this test alone (hold the guard), once the first sentinel
/// sees both replicas linked to the primary (a fresh replica reports its link
/// down until its first sync, and sentinels refresh that every 10 s).
async fn sentinels_for_this_test() -> (tokio::sync::MutexGuard<'static, ()>, &'static Sentinels) {
    let serial = SERIAL.lock().await;
    let t = TOPOLOGY.get_or_init(Sentinels::start).await;
    wait_linked(t).await;
    (serial, t)
}

/// Waits until the first sentinel sees both replicas linked to the primary.
async fn wait_linked(t: &Sentinels) {
    let linked = wait_until(Duration::from_secs(30), || async {
        let replicas: Vec<HashMap<String, String>> = t.sentinels[0]
            .cmd(&["SENTINEL", "REPLICAS", MASTER])
            .await
            .unwrap_or_default();
        replicas.len() == 2
            && replicas
                .iter()
                .all(|r| r.get("master-link-status").is_some_and(|s| s == "ok"))
    })
    .await;
    assert!(linked, "the sentinels never saw both replicas linked");
}

/// `doctor --json --sentinel <master> <extra…> <every sentinel>`.
async fn doctor(t: &Sentinels, master: &str, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut list = vec!["doctor", "--json", "--sentinel", master];
    list.extend(extra);
    let urls = t.sentinel_urls();
    list.extend(urls.iter().map(String::as_str));
    lockflight(args(&list)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_asks_the_sentinels_then_checks_the_primary() {
    let (_serial, t) = sentinels_for_this_test().await;
    let primary = t.primary_addr().await;
    let (code, report) = doctor(t, MASTER, &[]).await;
    assert_eq!(code, 0, "{report:#}");
    let (v, detail) = verdict(&report, "sentinels");
    assert_eq!(v, "pass", "{report:#}");
    assert!(
        detail.contains("3 of 3") && detail.contains(&primary),
        "{detail}"
    );
    assert_eq!(verdict(&report, "sentinel-quorum").0, "pass", "{report:#}");
    let (v, detail) = verdict(&report, "sentinel-replicas");
    assert_eq!(v, "pass", "{report:#}");
    assert!(detail.contains("2 of 2"), "{detail}");
    // The per-server checks ran on the primary the sentinels named.
    for id in ["version", "scripts", "acl", "maxmemory-policy", "replicas"] {
        let (v, detail) = verdict(&report, id);
        assert_eq!(v, "pass", "{id}: {report:#}");
        assert!(
            detail.contains(&primary),
            "{id} names the primary: {detail}"
        );
    }
    // The clocks of the primary and both replicas are compared.
    assert_eq!(verdict(&report, "clock").0, "pass", "{report:#}");
    assert_eq!(
        verdict(&report, "clock").1.matches("127.0.0.1:").count(),
        3,
        "{report:#}"
    );

    // replica_ack(2) can be met; replica_ack(3) cannot.
    let (code, report) = doctor(t, MASTER, &["--replica-ack", "2"]).await;
    assert_eq!(code, 0, "{report:#}");
    let (code, report) = doctor(t, MASTER, &["--replica-ack", "3"]).await;
    assert_eq!(code, 1, "{report:#}");
    let (v, detail) = verdict(&report, "sentinel-replicas");
    assert_eq!(v, "fail", "{report:#}");
    assert!(detail.contains("replica_ack(3)"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_fails_an_unknown_master_and_an_evicting_primary() {
    let (_serial, t) = sentinels_for_this_test().await;
    let (code, report) = doctor(t, "no-such-master", &[]).await;
    assert_eq!(code, 1, "{report:#}");
    let (v, detail) = verdict(&report, "sentinels");
    assert_eq!(v, "fail", "{report:#}");
    assert!(detail.contains("no-such-master"), "{detail}");
    assert!(
        verdicts(&report, "version").is_empty(),
        "no primary to check"
    );

    let primary = t.primary_addr().await;
    let node = t.by_addr(&primary);
    node.cmd::<()>(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .await
        .unwrap();
    let (code, report) = doctor(t, MASTER, &[]).await;
    node.cmd::<()>(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await
        .unwrap();
    assert_eq!(code, 1, "{report:#}");
    let (v, detail) = verdict(&report, "maxmemory-policy");
    assert_eq!(v, "fail", "{report:#}");
    assert!(
        detail.contains(&primary) && detail.contains("allkeys-lru"),
        "{detail}"
    );
}

/// A set whose data nodes have an ACL user (the `default` user off) and whose
/// sentinels have a password of their own (in their URLs): without the
/// primary's credentials the per-server checks cannot connect; with
/// `--primary-user` and the password in `LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD`
/// they pass on the primary, and no report or message shows a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reaches_a_password_protected_primary_with_its_credentials() {
    let _serial = SERIAL.lock().await;
    let auth = Auth::default();
    let t = Sentinels::start_with_auth(&auth).await;
    wait_linked(&t).await;
    let primary = t.primary_addr().await;
    let run = |user: Option<&str>, password: Option<&str>| {
        let mut list = vec!["doctor", "--json", "--sentinel", MASTER];
        if let Some(u) = user {
            list.extend(["--primary-user", u]);
        }
        let urls = t.sentinel_urls();
        list.extend(urls.iter().map(String::as_str));
        let env = password
            .map(|p| {
                vec![(
                    "LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD".to_owned(),
                    p.to_owned(),
                )]
            })
            .unwrap_or_default();
        lockflight_with_env(args(&list), env)
    };
    let hides_passwords = |report: &serde_json::Value, stderr: &str| {
        let all = format!("{report} {stderr}");
        assert!(
            !all.contains(&auth.password) && !all.contains(&auth.sentinel_password),
            "{all}"
        );
    };

    // Without the primary's credentials: the sentinels answer, the primary does not.
    let ((code, report), stderr) = run(None, None).await;
    assert_ne!(code, 0, "{report:#} {stderr}");
    assert!(
        format!("{report} {stderr}").contains("uthentication"),
        "{report:#} {stderr}"
    );
    hides_passwords(&report, &stderr);
    // A username without its password is bad usage.
    let ((code, _), stderr) = run(Some(&auth.username), None).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD"),
        "{stderr}"
    );

    // With them: the primary's checks pass, the replicas' clocks are read.
    let ((code, report), stderr) = run(Some(&auth.username), Some(&auth.password)).await;
    assert_eq!(code, 0, "{report:#} {stderr}");
    assert_eq!(verdict(&report, "sentinels").0, "pass", "{report:#}");
    for id in ["version", "scripts", "acl", "replicas"] {
        let (v, detail) = verdict(&report, id);
        assert_eq!(v, "pass", "{id}: {report:#}");
        assert!(detail.contains(&primary), "{id}: {detail}");
    }
    assert_eq!(
        verdict(&report, "clock").1.matches("127.0.0.1:").count(),
        3,
        "{report:#}"
    );
    hides_passwords(&report, &stderr);
}
