//! `inspect` and `list` on held keys, queues and elections.

use std::time::Duration;

use lockflight::{Locker, RedisBackend};
use serde_json::Value;
use testkit::{shared, unique_prefix};

use crate::support::{args, lockflight};
use crate::{locker, locker_and_instance, lockflight_text};

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
    let term = leadership.fencing_token().to_string();

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
