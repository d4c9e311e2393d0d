//! The `plain` locking mode: reservations under a plain Redis lock (`SET NX PX`,
//! 1 ms retries, compare-and-delete release), without lockflight and without a
//! fencing token.

use super::*;
use app::Occupancy;
use app::plain_lock::{Connection, PlainLock};

/// A plain lock on the shared test server, under `prefix`, with its own
/// connection (as a separate process would have).
async fn plain_lock(prefix: &str, wait_timeout: Duration) -> PlainLock {
    let con = Connection::single(&testkit::shared().url())
        .await
        .expect("connect to the test Redis");
    PlainLock::new(con, &format!("{prefix}plain:"), wait_timeout)
}

/// Three instances in the plain mode (each its own plain lock and Redis
/// connection, one SQLite file) on one Redis; 240 concurrent reservations of
/// qty 1 over real HTTP for a SKU with 150 units, with a pause between the stock
/// check and the write: exactly 150 succeed, 90 are out of stock, every remaining
/// count from 149 down to 0 is handed out once, no two critical sections ever
/// overlapped, no write carried a fencing token, and the stock ends at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_lock_instances_never_oversell() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-plain");
    let dir = tempfile::tempdir().expect("tempdir");
    let occupancy = Arc::new(Occupancy::default());
    let mut states = Vec::new();
    let mut urls = Vec::new();
    for name in ["a", "b", "c"] {
        let plain = plain_lock(&prefix, Duration::from_secs(20)).await;
        let state = instance(name, &prefix, file_db(dir.path()).await, |b| b)
            .await
            .with_plain_lock(plain)
            .with_hooks(Hooks {
                before_write: Duration::from_millis(1),
                occupancy: Some(Arc::clone(&occupancy)),
                ..Hooks::default()
            });
        urls.push(serve(app::app(state.clone())).await);
        states.push(state);
    }
    let http = Http::new();
    create_item(&http, &urls[0], "bolt", 150).await;

    let (bodies, out_of_stock) = reserve_concurrently(&http, &urls, "bolt", 240).await;
    let mut remaining: Vec<i64> = bodies
        .iter()
        .map(|body| {
            assert!(
                body["fencing_token"].is_null(),
                "a plain lock has no fencing token: {body}"
            );
            body["remaining"].as_i64().expect("remaining")
        })
        .collect();
    assert_eq!(remaining.len(), 150, "reservations");
    assert_eq!(out_of_stock, 90, "refused as out of stock");
    remaining.sort_unstable_by_key(|r| std::cmp::Reverse(*r));
    assert_eq!(remaining, (0..150).rev().collect::<Vec<i64>>());
    assert_eq!(occupancy.most(), 1, "two critical sections overlapped");

    let mut acquired = 0;
    for s in &states {
        let stats = s.stats_json();
        let plain = &stats["plain_lock"];
        assert_eq!(plain["expired_before_release"], 0, "{plain}");
        assert_eq!(plain["releases"], plain["acquired"], "{plain}");
        assert!(plain["acquired"].as_u64().expect("acquired") > 0, "{plain}");
        acquired += plain["acquired"].as_u64().expect("acquired");
        // lockflight's lock took no part in the reservations.
        assert_eq!(stats["lockflight"]["acquired"], 0, "{stats}");
    }
    assert_eq!(acquired, 240, "one plain lock per request");
    let item = http
        .get(&format!("{}/items/bolt", urls[2]))
        .await
        .expect("GET");
    assert_eq!(item.json()["stock"], 0);
    assert_eq!(
        app::reservation_log(&states[0].db, "bolt")
            .await
            .expect("log"),
        (150, 150)
    );
    assert_eq!(
        app::item_fence(&states[0].db, "bolt").await.expect("fence"),
        Some(FencingToken::default()),
        "no write was fenced"
    );
    let mut con = testkit::shared().connection().await;
    let exists: u64 = redis::cmd("EXISTS")
        .arg(format!("{prefix}plain:bolt"))
        .query_async(&mut con)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0, "the last holder released the lock");
}

/// While another holder keeps the plain lock, a reservation retries until its
/// wait timeout and answers 503 `lock_timeout` with `Retry-After`; the
/// compare-and-delete never deletes a lock that is someone else's; once the lock
/// is free, the reservation goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_lock_times_out_and_releases_only_its_own() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-plain-timeout");
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = plain_lock(&prefix, Duration::from_millis(300)).await;
    let state = instance("impatient", &prefix, file_db(dir.path()).await, |b| b)
        .await
        .with_plain_lock(plain.clone());
    let url = serve(app::app(state.clone())).await;
    let http = Http::new();
    create_item(&http, &url, "busy", 5).await;

    // Another process holds the SKU's plain lock.
    let other = plain_lock(&prefix, Duration::from_millis(300)).await;
    let held = other.lock("busy").await.expect("lock");
    let started = Instant::now();
    let res = reserve_one(&http, &url, "busy").await;
    assert_busy(&res);
    assert_eq!(res.error_code().as_deref(), Some("lock_timeout"));
    assert!(started.elapsed() >= Duration::from_millis(300));
    let stats = state.stats_json();
    assert_eq!(stats["plain_lock"]["timeouts"], 1);
    assert!(
        stats["plain_lock"]["set_attempts"]
            .as_u64()
            .expect("attempts")
            > 10,
        "it retried every millisecond: {stats}"
    );

    // The lock expires under its holder and a third party takes it: the
    // holder's release finds it is not its own and leaves it.
    let name = format!("{prefix}plain:busy");
    let mut con = testkit::shared().connection().await;
    let () = redis::cmd("SET")
        .arg(&name)
        .arg("someone-else")
        .query_async(&mut con)
        .await
        .expect("SET");
    assert!(!held.release().await.expect("release"), "not its own lock");
    let value: Option<String> = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut con)
        .await
        .expect("GET");
    assert_eq!(value.as_deref(), Some("someone-else"));
    let () = redis::cmd("DEL")
        .arg(&name)
        .query_async(&mut con)
        .await
        .expect("DEL");

    let res = reserve_one(&http, &url, "busy").await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    assert_eq!(res.json()["remaining"], 4);
}
