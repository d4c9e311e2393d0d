//! Single-SKU reservations, the lock layer's error mapping and coalesced reads.

use super::*;

/// Two instances (two servers, each with its own Redis backend and locker, one
/// SQLite file) on one Redis; 500 concurrent reservations of qty 1 over real HTTP
/// for a SKU with 300 units: exactly 300 succeed, 200 are out of stock, every
/// remaining count from 299 down to 0 is handed out once, fencing tokens increase
/// with every reservation, and the stock ends at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_sell_exactly_the_stock() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-two-instances");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut states = Vec::new();
    let mut urls = Vec::new();
    for name in ["a", "b"] {
        // Each instance opens its own pool on the shared file, like a process would.
        let state = instance(name, &prefix, file_db(dir.path()).await, |b| {
            b.wait_timeout(Duration::from_secs(20))
        })
        .await;
        urls.push(serve(app::app(state.clone())).await);
        states.push(state);
    }
    let http = Http::new();
    create_item(&http, &urls[0], "widget", 300).await;

    let started = Instant::now();
    let (bodies, out_of_stock) = reserve_concurrently(&http, &urls, "widget", 500).await;
    let mut reserved: Vec<_> = bodies
        .iter()
        .map(|body| {
            let token = &body["fencing_token"];
            (
                body["remaining"].as_i64().expect("remaining"),
                (
                    token["epoch"].as_u64().expect("epoch"),
                    token["seq"].as_u64().expect("seq"),
                ),
            )
        })
        .collect();
    let elapsed = started.elapsed();
    assert_eq!(reserved.len(), 300, "reservations");
    assert_eq!(out_of_stock, 200, "refused as out of stock");

    // Every remaining count 299..=0 exactly once, tokens increasing with them.
    reserved.sort_by_key(|(remaining, _)| std::cmp::Reverse(*remaining));
    let remaining: Vec<i64> = reserved.iter().map(|r| r.0).collect();
    assert_eq!(remaining, (0..300).rev().collect::<Vec<i64>>());
    for w in reserved.windows(2) {
        assert!(w[0].1 < w[1].1, "fencing tokens out of order: {w:?}");
    }

    let item = http
        .get(&format!("{}/items/widget", urls[1]))
        .await
        .expect("GET");
    assert_eq!(item.json()["stock"], 0);
    assert_eq!(
        app::reservation_log(&states[0].db, "widget")
            .await
            .expect("log"),
        (300, 300)
    );
    let by_instance: Vec<u64> = states
        .iter()
        .map(|s| s.counters.reservations.load(Ordering::Relaxed))
        .collect();
    assert_eq!(by_instance.iter().sum::<u64>(), 300, "{by_instance:?}");
    assert!(
        by_instance.iter().all(|&n| n > 0),
        "both instances served: {by_instance:?}"
    );
    for s in &states {
        assert_eq!(s.counters.stale_rejected.load(Ordering::Relaxed), 0);
        assert_eq!(s.locker.stats().leases_lost, 0);
    }
    eprintln!("500 reservations over two instances in {elapsed:?}");
}

/// A handler whose lease is lost while it is parked before its database write is
/// dropped: the client gets 503 long before the handler would have written, and
/// the database never sees that fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lease_drops_the_handler_before_it_writes() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-lease-lost");
    let dir = tempfile::tempdir().expect("tempdir");
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    const SLOW_STEP: Duration = Duration::from_millis(1500);
    let state = instance("slow", &prefix, file_db(dir.path()).await, |b| {
        b.lease_ttl(Duration::from_millis(300))
    })
    .await
    .with_hooks(Hooks {
        before_write: SLOW_STEP,
        entered: Some(entered_tx),
        ..Hooks::default()
    });
    let url = serve(app::app(state.clone())).await;
    let http = Http::new();
    create_item(&http, &url, "gadget", 10).await;

    let started = Instant::now();
    let request = {
        let http = http.clone();
        let url = format!("{url}/items/gadget/reserve");
        tokio::spawn(async move { http.post(&url, &json!({ "qty": 1 })).await })
    };
    let info: LockInfo = tokio::time::timeout(Duration::from_secs(5), entered.recv())
        .await
        .expect("the handler entered its critical section")
        .expect("hook");
    assert_eq!(info.key, LockKey::from("gadget"));

    // Someone deletes the lock behind the holder's back (an operator, an eviction,
    // a failover that lost the key): the next renewal finds it gone.
    let lock_name = testkit::names::lock(&prefix, &LockKey::from("gadget"));
    let mut con = testkit::shared().connection().await;
    let deleted: u64 = redis::cmd("DEL")
        .arg(&lock_name)
        .query_async(&mut con)
        .await
        .expect("DEL");
    assert_eq!(deleted, 1, "the lock key existed while the handler held it");

    let res = request.await.expect("task").expect("request");
    let answered = started.elapsed();
    assert_eq!(
        res.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        res.text()
    );
    assert!(
        answered < SLOW_STEP,
        "answered after {answered:?}: the handler was not dropped before its write"
    );

    // Wait past the moment the handler would have written: nothing is written.
    tokio::time::sleep((SLOW_STEP + Duration::from_millis(300)).saturating_sub(answered)).await;
    assert_eq!(
        app::reservations_with_token(&state.db, info.fencing_token)
            .await
            .expect("query"),
        0
    );
    assert_eq!(
        app::item_fence(&state.db, "gadget").await.expect("query"),
        Some(FencingToken::default()),
        "no write was ever accepted"
    );
    let item = http.get(&format!("{url}/items/gadget")).await.expect("GET");
    assert_eq!(item.json()["stock"], 10);
    assert_eq!(state.counters.reservations.load(Ordering::Relaxed), 0);
    assert_eq!(state.locker.stats().leases_lost, 1);
}

/// The database's fencing guard, on its own: a write with token (e, s) is
/// accepted; the same token again and older ones are rejected and counted; newer
/// ones are accepted.
#[tokio::test]
async fn stale_fencing_tokens_are_rejected_by_the_database() {
    let db = app::open_db(None).await.expect("in-memory database");
    sqlx::query("INSERT INTO items (sku, name, stock) VALUES ('bolt', 'Bolt', 10)")
        .execute(&db)
        .await
        .expect("insert");
    let locker = Locker::builder(MemoryBackend::new())
        .build()
        .expect("locker");
    let state = AppState::new(db, locker, "unit");
    let t = |epoch, seq| FencingToken::new(epoch, seq);
    let write = |token| {
        let state = state.clone();
        async move {
            state
                .write_reservation("bolt", 1, token)
                .await
                .expect("write")
        }
    };

    assert_eq!(
        write(t(1_000, 5)).await,
        WriteOutcome::Reserved { remaining: 9 }
    );
    let stale = WriteOutcome::Stale {
        current: t(1_000, 5),
    };
    assert_eq!(write(t(1_000, 5)).await, stale, "the same token again");
    assert_eq!(write(t(1_000, 4)).await, stale, "an older handoff");
    assert_eq!(write(t(999, 99)).await, stale, "an older lease");
    assert_eq!(
        write(t(1_000, 6)).await,
        WriteOutcome::Reserved { remaining: 8 },
        "the next handoff"
    );
    assert_eq!(
        write(t(1_001, 0)).await,
        WriteOutcome::Reserved { remaining: 7 },
        "a newer lease"
    );
    // Newer token but not enough stock: out of stock, not stale, nothing written.
    assert_eq!(
        state
            .write_reservation("bolt", 100, t(1_002, 0))
            .await
            .expect("write"),
        WriteOutcome::OutOfStock { available: 7 }
    );
    assert_eq!(
        state
            .write_reservation("nope", 1, t(1_003, 0))
            .await
            .expect("write"),
        WriteOutcome::NotFound
    );

    let c = &state.counters;
    assert_eq!(c.stale_rejected.load(Ordering::Relaxed), 3);
    assert_eq!(c.reservations.load(Ordering::Relaxed), 3);
    assert_eq!(c.out_of_stock.load(Ordering::Relaxed), 1);
    assert_eq!(
        app::item_fence(&state.db, "bolt").await.expect("fence"),
        Some(t(1_001, 0))
    );
    for (token, rows) in [
        (t(1_000, 5), 1),
        (t(1_000, 4), 0),
        (t(999, 99), 0),
        (t(1_000, 6), 1),
        (t(1_001, 0), 1),
        (t(1_002, 0), 0),
    ] {
        assert_eq!(
            app::reservations_with_token(&state.db, token)
                .await
                .expect("count"),
            rows,
            "rows logged with {token}"
        );
    }
    let stats = state.stats_json();
    assert_eq!(stats["app"]["stale_rejected"], 3);
    assert_eq!(stats["app"]["reservations"], 3);
}

/// A request that cannot get its SKU's lock within the wait timeout gets 503 with
/// `Retry-After`; once the lock is free, the same request succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_is_503_with_retry_after() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-timeout");
    let dir = tempfile::tempdir().expect("tempdir");
    let state = instance("impatient", &prefix, file_db(dir.path()).await, |b| {
        b.wait_timeout(Duration::from_millis(300))
    })
    .await;
    let url = serve(app::app(state.clone())).await;
    let http = Http::new();
    create_item(&http, &url, "busy", 5).await;

    // Another process (another locker on its own backend) holds the SKU's lock.
    let other = Locker::builder(redis_backend(&prefix).await)
        .build()
        .expect("locker");
    let guard = other.lock("busy").await.expect("lock");

    let started = Instant::now();
    let res = reserve_one(&http, &url, "busy").await;
    assert_busy(&res);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(state.locker.stats().timeouts, 1);

    guard.release().await.expect("release");
    let res = reserve_one(&http, &url, "busy").await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    assert_eq!(res.json()["remaining"], 4);
}

/// A reservation sent again with the same `Idempotency-Key`, to the other
/// instance, is replayed (the first answer, byte for byte, marked
/// `idempotent-replayed: true`) and reserves once; the key with another body is
/// 422 and reserves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_reservation_is_replayed_and_reserves_once() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-idempotent");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut urls = Vec::new();
    for name in ["a", "b"] {
        let state = instance(name, &prefix, file_db(dir.path()).await, |b| b).await;
        urls.push(serve(app::app(state)).await);
    }
    let http = Http::new();
    create_item(&http, &urls[0], "gadget", 5).await;

    let reserve = |url: &str, qty: u32| {
        let http = http.clone();
        let url = format!("{url}/items/gadget/reserve");
        async move {
            http.send_with(
                http::Method::POST,
                &url,
                Some(&json!({ "qty": qty })),
                &[("idempotency-key", "order-17")],
            )
            .await
            .expect("request")
        }
    };
    let first = reserve(&urls[0], 2).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(first.json()["remaining"], 3);
    assert!(!first.headers.contains_key("idempotent-replayed"));

    let again = reserve(&urls[1], 2).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body, first.body, "the first answer, replayed");

    let reused = reserve(&urls[1], 1).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        reused.error_code().as_deref(),
        Some("idempotency_key_reused")
    );

    let item = http
        .get(&format!("{}/items/gadget", urls[1]))
        .await
        .expect("GET");
    assert_eq!(item.json()["stock"], 3, "reserved once");
}

/// A route whose requests carry no key (no `{sku}` in the route): the lock layer
/// refuses them, unless told to run them unlocked.
#[tokio::test]
async fn missing_key_follows_the_policy() {
    let prefix = testkit::unique_prefix("inventory-missing-key");
    let locker = Locker::builder(redis_backend(&prefix).await)
        .build()
        .expect("locker");
    let runs = Arc::new(AtomicU64::new(0));
    let router = |layer: LockLayer<KeyFrom>| {
        let runs = Arc::clone(&runs);
        Router::new()
            .route(
                "/restock",
                post(move |info: Option<Extension<LockInfo>>| async move {
                    runs.fetch_add(1, Ordering::Relaxed);
                    if info.is_some() { "locked" } else { "unlocked" }
                }),
            )
            .route_layer(layer.handle_errors())
    };
    let layer = || LockLayer::new(locker.clone(), KeyFrom::path_param("sku"));
    let request = || {
        Request::post("/restock")
            .body(Body::empty())
            .expect("request")
    };

    // The default: refused. The route has no `{sku}`, so it is the route's fault.
    let res = router(layer())
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.load(Ordering::Relaxed), 0, "the handler must not run");

    let res = router(layer().run_unlocked_without_key())
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"unlocked");
    assert_eq!(
        runs.load(Ordering::Relaxed),
        1,
        "the handler ran, without a lock"
    );
    assert_eq!(locker.stats().acquire_attempts, 0);
}

/// 100 concurrent identical `GET /items/{sku}` share one execution of the handler
/// (`SharedResponseLayer`), and all get the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_reads_run_once() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-coalesce");
    let dir = tempfile::tempdir().expect("tempdir");
    let state = instance("reader", &prefix, file_db(dir.path()).await, |b| b)
        .await
        .with_hooks(Hooks {
            item_read_delay: Duration::from_millis(300),
            ..Hooks::default()
        });
    sqlx::query("INSERT INTO items (sku, name, stock) VALUES ('nut', 'Nut', 42)")
        .execute(&state.db)
        .await
        .expect("insert");
    let router = app::app(state.clone());

    let calls = (0..100).map(|_| {
        let router = router.clone();
        async move {
            let res = router
                .oneshot(
                    Request::get("/items/nut")
                        .body(Body::empty())
                        .expect("request"),
                )
                .await
                .expect("infallible");
            let status = res.status();
            let body = res.into_body().collect().await.expect("body").to_bytes();
            (status, body)
        }
    });
    let replies = futures::future::join_all(calls).await;
    assert_eq!(state.counters.item_reads.load(Ordering::Relaxed), 1);
    let bodies: HashSet<_> = replies
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, StatusCode::OK);
            body.clone()
        })
        .collect();
    assert_eq!(bodies.len(), 1, "everyone got the same response");
    let item: serde_json::Value =
        serde_json::from_slice(bodies.iter().next().expect("a body")).expect("json");
    assert_eq!(item["stock"], 42);
    // One flight took the lock once.
    assert_eq!(state.locker.stats().acquired, 1);
}

/// The gateway sends every request for one SKU to one instance (and different
/// SKUs to different instances).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_routes_each_sku_to_one_instance() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-gateway");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut upstreams = Vec::new();
    for name in ["a", "b", "c"] {
        let state = instance(name, &prefix, file_db(dir.path()).await, |b| b).await;
        upstreams.push((name.to_owned(), serve(app::app(state)).await));
    }
    let (router, members) = gateway::gateway(&upstreams);
    let url = serve(router).await;
    let http = Http::new();
    let skus: Vec<String> = (0..12).map(|i| format!("sku-{i}")).collect();
    for sku in &skus {
        create_item(&http, &url, sku, 100).await;
    }
    let mut served_by: HashMap<String, HashSet<String>> = HashMap::new();
    for _ in 0..3 {
        for sku in &skus {
            let res = http
                .post(&format!("{url}/items/{sku}/reserve"), &json!({ "qty": 1 }))
                .await
                .expect("request");
            assert_eq!(res.status, StatusCode::OK, "{}", res.text());
            let instance = res.json()["instance"]
                .as_str()
                .expect("instance")
                .to_owned();
            served_by.entry(sku.clone()).or_default().insert(instance);
        }
    }
    let mut used = HashSet::new();
    for (sku, instances) in &served_by {
        assert_eq!(instances.len(), 1, "{sku} reached {instances:?}");
        let instance = instances.iter().next().expect("one");
        assert_eq!(members.route(sku).as_ref(), Some(instance));
        used.insert(instance.clone());
    }
    assert!(used.len() > 1, "12 SKUs all on one instance: {used:?}");
}
