//! The `lockflight` command against real Redis servers started by the tests:
//! `doctor`'s verdicts on deliberately misconfigured servers, `inspect` and `list`
//! on held keys, `release --force` fencing out the old holder, `selfcheck` on
//! lockflight.

use std::time::Duration;

mod support;

use lockflight::fence::{Fenced, FencedKey};
use lockflight::{Locker, RedisBackend};
use serde_json::Value;
use support::{after_forced_release, args, force_release, lockflight, verdict};
use testkit::{Engine, MINIMAL_ACL_RULES, RedisServer, set_acl_user, shared, unique_prefix};

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

async fn locker(url: &str, prefix: &str, ttl: Duration) -> Locker {
    locker_and_instance(url, prefix, ttl).await.0
}

/// A locker and its backend's instance id.
async fn locker_and_instance(url: &str, prefix: &str, ttl: Duration) -> (Locker, String) {
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .unwrap();
    let instance = backend.instance_id().to_owned();
    let locker = Locker::builder(backend)
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    (locker, instance)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_list_show_the_holder_the_fence_and_the_queue() {
    let server = shared();
    let prefix = unique_prefix("cli-inspect");
    let (a, a_instance) =
        locker_and_instance(&server.url(), &prefix, Duration::from_secs(30)).await;
    let b = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let held = a.lock("sku:9").await.unwrap();
    let waiter = tokio::spawn(async move { b.lock("sku:9").await.map(|g| g.fencing_token()) });
    let mut report = Value::Null;
    for _ in 0..100 {
        let (code, r) = lockflight(args(&[
            "inspect",
            "--json",
            "--prefix",
            &prefix,
            &server.url(),
            "sku:9",
        ]))
        .await;
        assert_eq!(code, 0);
        report = r;
        if report["mutex"]["queue"]
            .as_array()
            .is_some_and(|q| q.len() == 1)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(report["held"], true, "{report:#}");
    assert!(
        report["mutex"]["holder"]["ttl_ms"]
            .as_u64()
            .is_some_and(|t| t <= 30_000)
    );
    assert_eq!(report["mutex"]["fence_epoch"], held.fencing_token().epoch);
    assert_eq!(
        report["mutex"]["holder"]["instance"], a_instance,
        "the holder's instance, from its token"
    );
    assert_eq!(
        report["mutex"]["queue"].as_array().map(Vec::len),
        Some(1),
        "{report:#}"
    );
    assert!(report["mutex"]["queue"][0]["waited_ms"].is_u64());

    let (code, listing) = lockflight(args(&[
        "list",
        "--json",
        "--prefix",
        &prefix,
        &server.url(),
    ]))
    .await;
    assert_eq!(code, 0);
    assert_eq!(listing["keys"][0]["key"], "sku:9", "{listing:#}");
    assert_eq!(listing["keys"][0]["kinds"][0], "mutex");
    assert!(listing["looked_in"].is_null(), "{listing:#}");

    // A wrong prefix finds nothing, and both commands say where they looked.
    let wrong = format!("{prefix}-wrong");
    let (code, report) = lockflight(args(&[
        "inspect",
        "--json",
        "--prefix",
        &wrong,
        &server.url(),
        "sku:9",
    ]))
    .await;
    assert_eq!(code, 0);
    assert_eq!(report["nothing_stored"], true, "{report:#}");
    let hint = report["looked_in"].as_str().unwrap_or_default();
    assert!(
        hint.contains(&format!("prefix `{wrong}`"))
            && hint.contains("database 0")
            && hint.contains(&format!("`{wrong}:{{sku:9}}`")),
        "{report:#}"
    );
    let (code, listing) =
        lockflight(args(&["list", "--json", "--prefix", &wrong, &server.url()])).await;
    assert_eq!(code, 0);
    assert_eq!(
        listing["keys"].as_array().map(Vec::len),
        Some(0),
        "{listing:#}"
    );
    assert!(
        listing["looked_in"]
            .as_str()
            .is_some_and(|h| h.contains(&format!("prefix `{wrong}`"))),
        "{listing:#}"
    );

    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
}

/// Runs the binary with `args`; returns the exit code and stdout.
async fn lockflight_text(list: &[&str]) -> (i32, String) {
    let (code, stdout, _) = support::lockflight_output(args(list), Vec::new()).await;
    (code, stdout)
}

/// `inspect` names the holder as its service named it (`instance_name`), with
/// its host and process id, and how long it has held the key; `release --force`
/// names the holder it freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_the_holder_and_since_when() {
    let server = shared();
    let url = server.url();
    let prefix = unique_prefix("cli-who");
    let backend = RedisBackend::builder(url.as_str())
        .prefix(&prefix)
        .instance_name("billing-7")
        .connect()
        .await
        .unwrap();
    let id = backend.instance_id().to_owned();
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let before = std::time::Instant::now();
    let held = locker.lock("invoice:1").await.unwrap();

    let (code, report) = lockflight(args(&[
        "inspect",
        "--json",
        "--prefix",
        &prefix,
        &url,
        "invoice:1",
    ]))
    .await;
    let elapsed = before.elapsed();
    assert_eq!(code, 0, "{report:#}");
    let card = &report["instances"][id.as_str()];
    assert_eq!(card["name"], "billing-7", "{report:#}");
    assert_eq!(card["pid"], std::process::id(), "{report:#}");
    assert_eq!(card["lockflight"], env!("CARGO_PKG_VERSION"), "{report:#}");
    assert!(card["host"].is_string(), "{report:#}");
    let held_for = report["mutex"]["held_for_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("the time held is known: {report:#}"));
    // Held from after `before` until the snapshot, read before `elapsed`.
    assert!(
        u128::from(held_for) <= elapsed.as_millis() + 1,
        "held {held_for} ms within {elapsed:?}"
    );

    let (code, text) = lockflight_text(&["inspect", "--prefix", &prefix, &url, "invoice:1"]).await;
    assert_eq!(code, 0, "{text}");
    let pid = format!("pid {}), instance {id}", std::process::id());
    assert!(text.contains("held by billing-7 ("), "{text}");
    assert!(text.contains(&pid), "{text}");
    assert!(text.contains(", for "), "{text}");

    let (code, text) = lockflight_text(&[
        "release",
        "--force",
        "--yes",
        "--prefix",
        &prefix,
        &url,
        "invoice:1",
    ])
    .await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(" of billing-7 ("), "{text}");
    assert!(
        held.release().await.is_err(),
        "the freed holder's release is a loss"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_fences_out_the_old_holder() {
    let server = shared();
    let prefix = unique_prefix("cli-release");
    // A holds with a long TTL and is "stuck"; B waits.
    let a = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let b = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let stuck = a.lock("job").await.unwrap();
    let old = stuck.fencing_token();
    let waiter = tokio::spawn(async move { b.lock("job").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut data = server.connection().await;
    let resource = FencedKey::new(format!("{prefix}:result")).unwrap();
    assert!(
        resource
            .set(&mut data, &stuck, "A's first write")
            .await
            .unwrap()
            .is_applied()
    );

    let name = String::from_utf8(resource.name().to_vec()).unwrap();
    let (report, forced) = force_release(&[], &prefix, &name, &server.url(), "job").await;
    assert_eq!(
        report["holder"].as_str().map(str::len),
        Some(32),
        "{report:#}"
    );
    assert_eq!(
        (&report["told"], &report["receivers"]),
        (&Value::from(1), &Value::from(1)),
        "the holder's instance is told: {report:#}"
    );
    let next = after_forced_release(&resource, &mut data, &stuck, (old, forced), waiter).await;
    // The old holder's release is a loss.
    assert!(stuck.release().await.is_err());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_frees_a_stuck_permit_holders_semaphore() {
    let server = shared();
    let prefix = unique_prefix("cli-release-sem");
    // A holds the only permit with a long TTL and is "stuck"; B waits for it.
    let a = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let b = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let stuck = a.semaphore("exports", 1).acquire().await.unwrap();
    // A mutex token of the key minted before the forced release: what a late
    // write of the stuck side would carry (a permit has no token of its own).
    let before = {
        let g = a.lock("exports").await.unwrap();
        let t = g.fencing_token();
        g.release().await.unwrap();
        t
    };
    let waiter = tokio::spawn(async move {
        let permit = b.semaphore("exports", 1).acquire().await;
        (b, permit)
    });
    let (code, state) = lockflight(args(&[
        "inspect",
        "--json",
        "--prefix",
        &prefix,
        &server.url(),
        "exports",
    ]))
    .await;
    assert_eq!(code, 0);
    assert_eq!(state["semaphore"]["free"], 0, "{state:#}");
    let mut data = server.connection().await;
    let resource = FencedKey::new(format!("{prefix}:export-file")).unwrap();
    let name = String::from_utf8(resource.name().to_vec()).unwrap();

    let (report, forced) = force_release(&[], &prefix, &name, &server.url(), "exports").await;
    assert_eq!(report["permits"], 1, "{report:#}");
    assert_eq!(report["told"], 1, "{report:#}");
    assert!(forced > before);
    // The resource's fence holds the forced token: a write under any token minted
    // before the forced release is refused.
    assert_eq!(
        resource.set(&mut data, before, "late").await.unwrap(),
        Fenced::Stale {
            last: forced,
            offered: before
        }
    );
    // The waiter gets the freed permit soon (woken, not at A's 30 s TTL).
    let (b, permit) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the permit soon after the forced release")
        .unwrap();
    let permit = permit.unwrap();
    // The stuck holder learns of its loss (its instance is told); its release is a
    // loss.
    tokio::time::timeout(Duration::from_secs(15), stuck.lost())
        .await
        .expect("the stuck permit holder is told its permit is lost");
    assert!(matches!(
        stuck.release().await,
        Err(lockflight::Error::LeaseLost { .. })
    ));
    permit.release().await.unwrap();
    drop(b);
}

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

/// The inspector names a key's lock as the backend writes it (and as the test
/// harness computes it): each held lock exists in Redis under that name.
#[tokio::test]
async fn the_inspector_names_keys_as_the_backend_does() {
    let prefix = unique_prefix("inspector-names");
    let backend = RedisBackend::builder(shared().url())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let locker = Locker::builder(backend).build().unwrap();
    let inspector = lockflight::inspect::Inspector::new(&prefix);
    let mut con = shared().connection().await;
    for key in ["a", "a{b}", "100%", "x}"] {
        let key = lockflight::LockKey::from(key);
        let guard = locker.lock(&key).await.unwrap();
        let name = inspector.lock_name(&key);
        assert_eq!(name, testkit::names::lock(&prefix, &key));
        let exists: bool = redis::cmd("EXISTS")
            .arg(&name)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            exists,
            "no lock of {key} at {}",
            String::from_utf8_lossy(&name)
        );
        guard.release().await.unwrap();
    }
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

/// `inspect` of an election key names the leader's identity and term, in text and
/// in `--json`; after the leader resigns, nobody leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_who_leads_an_election() {
    let server = shared();
    let url = server.url();
    let prefix = unique_prefix("cli-leader");
    let backend = RedisBackend::builder(url.as_str())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let locker = Locker::builder(backend).build().unwrap();
    let leadership = locker
        .election("scheduler")
        .identity("node-a")
        .campaign()
        .await
        .unwrap();
    let term = leadership.term().to_string();

    let inspect = ["inspect", "--prefix", &prefix, &url, "scheduler"];
    let (code, text) = lockflight_text(&inspect).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("election: led by `node-a` in term {term}")),
        "{text}"
    );
    let json = [&["inspect", "--json"][..], &inspect[1..]].concat();
    let (code, report) = lockflight(args(&json)).await;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["leader"]["identity"], "node-a", "{report:#}");
    assert_eq!(report["leader"]["term"], term.as_str(), "{report:#}");

    leadership.resign().await.unwrap();
    let (code, report) = lockflight(args(&json)).await;
    assert_eq!(code, 0, "{report:#}");
    assert!(report["leader"].is_null(), "{report:#}");
}

/// `--help` (and `-h`) lists every exit code the command uses, 0 to 4.
#[tokio::test]
async fn help_lists_every_exit_code() {
    for flag in ["--help", "-h"] {
        let (code, text) = lockflight_text(&[flag]).await;
        assert_eq!(code, 0, "{text}");
        let listed = text
            .split("Exit codes:")
            .nth(1)
            .unwrap_or_else(|| panic!("no exit codes in `lockflight {flag}`: {text}"));
        for exit in 0..=4 {
            assert!(
                listed
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{exit}  "))),
                "exit code {exit} in `lockflight {flag}`: {text}"
            );
        }
    }
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

/// `release --force` counts leases, permits, woken instances, loss messages and
/// their receivers with the noun that agrees: 1 of each, then 2 read leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_counts_agree_with_their_nouns() {
    let server = shared();
    let url = server.url();
    let prefix = unique_prefix("cli-plural");
    let a = locker(&url, &prefix, Duration::from_secs(30)).await;
    let b = locker(&url, &prefix, Duration::from_secs(30)).await;

    // One holder, one waiting instance.
    let held = a.lock("one").await.unwrap();
    let waiter = tokio::spawn(async move { b.lock("one").await.map(|g| (b, g)) });
    wait_for_queue(&url, &prefix, "one").await;
    let (code, text) = lockflight_text(&[
        "release", "--force", "--yes", "--prefix", &prefix, &url, "one",
    ])
    .await;
    assert_eq!(code, 0, "{text}");
    for phrase in [
        "0 read leases",
        "0 permits",
        "1 waiting instance woken",
        "1 loss message, received by 1 subscriber",
    ] {
        assert!(text.contains(phrase), "{phrase:?} in {text}");
    }
    let (b, next) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is woken")
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
    drop(held);

    // Two read leases, of two instances; one permit.
    let (r1, r2) = (
        a.rwlock("two").read().await.unwrap(),
        b.rwlock("two").read().await.unwrap(),
    );
    let (code, text) = lockflight_text(&[
        "release", "--force", "--yes", "--prefix", &prefix, &url, "two",
    ])
    .await;
    assert_eq!(code, 0, "{text}");
    for phrase in [
        "2 read leases",
        "0 waiting instances woken",
        "2 loss messages, received by 2 subscribers",
    ] {
        assert!(text.contains(phrase), "{phrase:?} in {text}");
    }
    drop((r1, r2));
    let permit = a.semaphore("three", 1).acquire().await.unwrap();
    let (code, text) = lockflight_text(&[
        "release", "--force", "--yes", "--prefix", &prefix, &url, "three",
    ])
    .await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(", 1 permit;"), "{text}");
    drop(permit);
}

/// Polls `inspect` until one instance waits for the mutex of `key`.
async fn wait_for_queue(url: &str, prefix: &str, key: &str) {
    for _ in 0..100 {
        let (_, report) =
            lockflight(args(&["inspect", "--json", "--prefix", prefix, url, key])).await;
        if report["mutex"]["queue"]
            .as_array()
            .is_some_and(|q| q.len() == 1)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no instance came to wait for {key}");
}

/// `inspect` names the random **lease token** and the increasing **fencing
/// token** apart, never a bare "token" next to a "fencing epoch".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_the_lease_token_and_the_fencing_token_apart() {
    let server = shared();
    let url = server.url();
    let prefix = unique_prefix("cli-words");
    let a = locker(&url, &prefix, Duration::from_secs(30)).await;
    let held = a.lock("job").await.unwrap();
    let epoch = held.fencing_token().epoch;
    let (_, report) = lockflight(args(&[
        "inspect", "--json", "--prefix", &prefix, &url, "job",
    ]))
    .await;
    let token = report["mutex"]["holder"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("a holder's token: {report:#}"))
        .to_owned();

    let (code, text) = lockflight_text(&["inspect", "--prefix", &prefix, &url, "job"]).await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(&format!(", lease token {token} (")), "{text}");
    assert!(
        text.contains(&format!("mutex fencing token: epoch {epoch}\n")),
        "{text}"
    );
    assert!(
        !text.contains("with token") && !text.contains("fencing epoch"),
        "{text}"
    );

    held.release().await.unwrap();
    let (_, text) = lockflight_text(&["inspect", "--prefix", &prefix, &url, "job"]).await;
    assert!(
        text.contains(&format!(
            "mutex fencing token: epoch {epoch} (the last granted"
        )),
        "{text}"
    );
}

/// `list` prints a header and, for each kind that holds a key, a row with the
/// holder (a lease token, or a count of holders) and the TTL left, in aligned
/// columns; `--json` adds the same under `held`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_a_header_and_each_kinds_holder_and_ttl() {
    let server = shared();
    let url = server.url();
    let prefix = unique_prefix("cli-list");
    let a = locker(&url, &prefix, Duration::from_secs(30)).await;
    let b = locker(&url, &prefix, Duration::from_secs(30)).await;
    let job = a.lock("job:a").await.unwrap();
    let readers = (
        a.rwlock("report").read().await.unwrap(),
        b.rwlock("report").read().await.unwrap(),
    );
    let permit = a.semaphore("exports", 2).acquire().await.unwrap();
    let (_, report) = lockflight(args(&[
        "inspect", "--json", "--prefix", &prefix, &url, "job:a",
    ]))
    .await;
    let token = report["mutex"]["holder"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("a holder's token: {report:#}"))
        .to_owned();

    let (code, text) = lockflight_text(&["list", "--prefix", &prefix, &url]).await;
    assert_eq!(code, 0, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three rows: {text}");
    let header = lines[0];
    let columns: Vec<usize> = ["KEY", "KIND", "HOLDER", "TTL"]
        .iter()
        .map(|c| {
            header
                .find(c)
                .unwrap_or_else(|| panic!("{c} in the header: {text}"))
        })
        .collect();
    assert!(columns.windows(2).all(|w| w[0] < w[1]), "{text}");
    let cells = |line: &str| -> Vec<String> {
        columns
            .iter()
            .enumerate()
            .map(|(i, &start)| {
                let end = columns.get(i + 1).copied().unwrap_or(line.len());
                line.get(start..end).unwrap_or_default().trim().to_owned()
            })
            .collect()
    };
    let rows: Vec<Vec<String>> = lines[1..].iter().map(|l| cells(l)).collect();
    assert_eq!(
        rows[0][..3],
        ["exports", "semaphore", "1 of 2 permits"],
        "{text}"
    );
    assert_eq!(rows[1][..3], ["job:a", "mutex", token.as_str()], "{text}");
    assert_eq!(rows[2][..3], ["report", "read", "2 readers"], "{text}");
    for row in &rows {
        let seconds: f64 = row[3]
            .strip_suffix(" s")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("a TTL in seconds in {row:?}: {text}"));
        assert!(seconds > 0.0 && seconds <= 30.0, "{row:?}: {text}");
    }

    let (code, listing) = lockflight(args(&["list", "--json", "--prefix", &prefix, &url])).await;
    assert_eq!(code, 0, "{listing:#}");
    let held = |i: usize| &listing["keys"][i]["held"][0];
    assert_eq!(listing["keys"][1]["kinds"][0], "mutex", "{listing:#}");
    assert_eq!(held(1)["token"], token.as_str(), "{listing:#}");
    assert!(
        held(1)["ttl_ms"].as_u64().is_some_and(|t| t <= 30_000),
        "{listing:#}"
    );
    assert_eq!(
        (&held(0)["holders"], &held(0)["permits"]),
        (&1.into(), &2.into()),
        "{listing:#}"
    );
    assert_eq!(held(2)["holders"], 2, "{listing:#}");

    // One permit of one: singular.
    let (_, text) = lockflight_text(&["inspect", "--prefix", &prefix, &url, "exports"]).await;
    assert!(text.contains("semaphore: 2 permits, 1 free"), "{text}");
    let single = b.semaphore("single", 1).acquire().await.unwrap();
    let (_, text) = lockflight_text(&["inspect", "--prefix", &prefix, &url, "single"]).await;
    assert!(text.contains("semaphore: 1 permit, 0 free"), "{text}");

    single.release().await.unwrap();
    permit.release().await.unwrap();
    readers.0.release().await.unwrap();
    readers.1.release().await.unwrap();
    job.release().await.unwrap();
}
