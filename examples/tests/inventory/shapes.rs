//! The other lock shapes of the example: the cart checkout (several SKUs under
//! one multi-key lock, one transaction, a per-tenant semaphore cap), stock reads
//! under the read lock against restocks under the write lock, and the optimistic
//! reservation (a version column, no lock).

use super::*;

async fn stock(http: &Http, base: &str, sku: &str) -> i64 {
    let res = http
        .get(&format!("{base}/items/{sku}"))
        .await
        .expect("GET /items/{sku}");
    res.json()["stock"].as_i64().expect("a stock count")
}

/// `POST /checkout` of `lines` for `tenant`.
async fn checkout_as(
    http: &Http,
    base: &str,
    tenant: &str,
    lines: &[(&str, i64)],
) -> client::Reply {
    let items: Vec<_> = lines
        .iter()
        .map(|(sku, qty)| json!({ "sku": sku, "qty": qty }))
        .collect();
    http.send_with(
        http::Method::POST,
        &format!("{base}/checkout"),
        Some(&json!({ "items": items })),
        &[("x-tenant", tenant)],
    )
    .await
    .expect("POST /checkout")
}

async fn checkout(http: &Http, base: &str, lines: &[(&str, i64)]) -> client::Reply {
    checkout_as(http, base, "public", lines).await
}

/// A cart with one line out of stock writes nothing; a cart that fits writes
/// every line, each fenced by its own SKU's token; bad carts are 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_writes_every_line_or_none() {
    let prefix = testkit::unique_prefix("inventory-checkout");
    let dir = tempfile::tempdir().expect("tempdir");
    let state = instance("a", &prefix, file_db(dir.path()).await, |b| b).await;
    let base = serve(app::app(state.clone())).await;
    let http = Http::new();
    create_item(&http, &base, "pen", 10).await;
    create_item(&http, &base, "ink", 1).await;

    let res = checkout(&http, &base, &[("pen", 2), ("ink", 5)]).await;
    assert_eq!(res.status, StatusCode::CONFLICT, "{}", res.text());
    assert_eq!(res.error_code().as_deref(), Some("out_of_stock"));
    assert_eq!(
        stock(&http, &base, "pen").await,
        10,
        "nothing of the cart written"
    );
    assert_eq!(app::reservation_log(&state.db, "pen").await.unwrap().0, 0);

    let res = checkout(&http, &base, &[("pen", 2), ("ink", 1)]).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    let body = res.json();
    let lines = body["checkout"].as_array().expect("the written lines");
    assert_eq!(lines.len(), 2);
    for line in lines {
        let epoch = line["fencing_token"]["epoch"].as_u64().unwrap();
        assert!(epoch > 0, "each line is fenced by its SKU's token: {line}");
    }
    assert_eq!(stock(&http, &base, "pen").await, 8);
    assert_eq!(stock(&http, &base, "ink").await, 0);

    for bad in [
        json!({ "items": [] }),
        json!({ "items": [{ "sku": "pen", "qty": 1 }, { "sku": "pen", "qty": 1 }] }),
        json!({ "items": [{ "sku": "pen", "qty": 0 }] }),
        json!({ "items": [{ "sku": "no spaces", "qty": 1 }] }),
    ] {
        let res = http
            .post(&format!("{base}/checkout"), &bad)
            .await
            .expect("POST /checkout");
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{bad}: {}", res.text());
    }
    assert_eq!(stock(&http, &base, "pen").await, 8);
    // Every lock was released: a single reservation of each SKU gets in at once.
    let res = http
        .post(&format!("{base}/items/pen/reserve"), &json!({ "qty": 1 }))
        .await
        .expect("reserve");
    assert_eq!(res.status, StatusCode::OK, "{}", res.text());
}

/// Two instances, carts whose SKU sets overlap in every order plus single-SKU
/// reservations of the same SKUs, all at once: every request finishes (no
/// deadlock), and the shelves, the log and the acknowledgements agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_carts_never_deadlock_or_oversell() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-carts");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut urls = Vec::new();
    let mut states = Vec::new();
    for name in ["a", "b"] {
        let state = instance(name, &prefix, file_db(dir.path()).await, |b| {
            b.wait_timeout(Duration::from_secs(30))
        })
        .await;
        urls.push(serve(app::app(state.clone())).await);
        states.push(state);
    }
    let http = Http::new();
    const STOCK: i64 = 40;
    for sku in ["x", "y", "z"] {
        create_item(&http, &urls[0], sku, STOCK).await;
    }
    let carts: [&[&str]; 5] = [&["x", "y"], &["y", "x"], &["z", "x"], &["y", "z"], &["x"]];
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..60 {
        let (http, base) = (http.clone(), urls[i % 2].clone());
        let cart = carts[i % carts.len()];
        tasks.spawn(async move {
            let res = if cart.len() == 1 {
                http.post(
                    &format!("{base}/items/{}/reserve", cart[0]),
                    &json!({ "qty": 1 }),
                )
                .await
                .expect("reserve")
            } else {
                // Each request its own tenant: the per-tenant cap is not what
                // this test is about.
                let lines: Vec<(&str, i64)> = cart.iter().map(|s| (*s, 1)).collect();
                checkout_as(&http, &base, &format!("t{i}"), &lines).await
            };
            (cart, res.status)
        });
    }
    let mut acked: HashMap<&str, i64> = HashMap::new();
    let finished = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(done) = tasks.join_next().await {
            let (cart, status) = done.expect("request task");
            assert!(
                status == StatusCode::OK || status == StatusCode::CONFLICT,
                "{cart:?}: {status}"
            );
            if status == StatusCode::OK {
                for sku in cart {
                    *acked.entry(sku).or_default() += 1;
                }
            }
        }
    })
    .await;
    assert!(finished.is_ok(), "a checkout never finished: deadlock");
    for sku in ["x", "y", "z"] {
        let left = stock(&http, &urls[1], sku).await;
        let logged = app::reservation_log(&states[0].db, sku).await.unwrap().1;
        let n = acked.get(sku).copied().unwrap_or(0);
        assert_eq!(
            STOCK - left,
            n,
            "{sku}: taken from the shelf = acknowledged"
        );
        assert_eq!(logged, n, "{sku}: logged = acknowledged");
    }
}

/// Optimistic locking, deterministically: two reservations read the same version
/// (the hook holds both between read and write); the first write wins, the second
/// finds zero rows changed, counts a conflict, reads again and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_reservations_retry_on_a_changed_version() {
    let prefix = testkit::unique_prefix("inventory-optimistic");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = file_db(dir.path()).await;
    let state = instance("a", &prefix, db, |b| b).await.with_hooks(Hooks {
        before_write: Duration::from_millis(300),
        ..Hooks::default()
    });
    let base = serve(app::app(state.clone())).await;
    let http = Http::new();
    create_item(&http, &base, "cup", 5).await;
    let url = format!("{base}/items/cup/reserve-optimistic");
    let body = json!({ "qty": 2 });
    let (a, b) = tokio::join!(http.post(&url, &body), http.post(&url, &body));
    for res in [a.expect("first"), b.expect("second")] {
        assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    }
    assert_eq!(stock(&http, &base, "cup").await, 1);
    let conflicts = state
        .counters
        .version_conflicts
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(conflicts >= 1, "the second writer saw the changed version");
    // Not enough left: a clean 409, nothing written.
    let res = http.post(&url, &json!({ "qty": 2 })).await.expect("third");
    assert_eq!(res.status, StatusCode::CONFLICT, "{}", res.text());
    assert_eq!(stock(&http, &base, "cup").await, 1);
}

/// A restock writes the stock and its log in two statements under the write
/// lock (the hook pauses between them); stock reads under the read lock, from
/// another instance, never see half a restock, and see the restock's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stock_reads_never_see_half_a_restock() {
    let prefix = testkit::unique_prefix("inventory-restock");
    let dir = tempfile::tempdir().expect("tempdir");
    let writer = instance("w", &prefix, file_db(dir.path()).await, |b| b)
        .await
        .with_hooks(Hooks {
            before_write: Duration::from_millis(40),
            ..Hooks::default()
        });
    let reader = instance("r", &prefix, file_db(dir.path()).await, |b| b).await;
    let (w, r) = (serve(app::app(writer)).await, serve(app::app(reader)).await);
    let http = Http::new();
    create_item(&http, &w, "bolt", 10).await;
    let restocks = {
        let (http, w) = (http.clone(), w.clone());
        tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..5 {
                let res = http
                    .post(&format!("{w}/items/bolt/restock"), &json!({ "qty": 3 }))
                    .await
                    .expect("restock");
                assert_eq!(res.status, StatusCode::OK, "{}", res.text());
                tokens.push(res.json()["fencing_token"]["epoch"].as_u64().unwrap());
            }
            tokens
        })
    };
    let mut reads = 0;
    while !restocks.is_finished() && reads < 2_000 {
        let body = http
            .get(&format!("{r}/items/bolt/stock"))
            .await
            .expect("stock")
            .json();
        let (stock, restocked) = (
            body["stock"].as_i64().unwrap(),
            body["restocked"].as_i64().unwrap(),
        );
        assert_eq!(stock, 10 + restocked, "half a restock seen: {body}");
        reads += 1;
    }
    let tokens = restocks.await.expect("restocks");
    assert!(reads > 0);
    assert!(tokens.windows(2).all(|t| t[0] < t[1]), "{tokens:?}");
    let body = http
        .get(&format!("{r}/items/bolt/stock"))
        .await
        .expect("stock")
        .json();
    assert_eq!(body["stock"], 25);
    assert_eq!(
        body["last_restock"]["epoch"].as_u64(),
        tokens.last().copied()
    );
}

/// A tenant over its checkout cap (held by another instance) is answered 429 at
/// once; other tenants are not affected; a freed permit lets it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkouts_are_capped_per_tenant_across_instances() {
    let prefix = testkit::unique_prefix("inventory-tenant");
    let dir = tempfile::tempdir().expect("tempdir");
    let state = instance("a", &prefix, file_db(dir.path()).await, |b| b).await;
    let base = serve(app::app(state)).await;
    let other = Locker::builder(redis_backend(&prefix).await)
        .build()
        .expect("locker");
    let http = Http::new();
    create_item(&http, &base, "nut", 100).await;
    // Another instance holds every permit of tenant "acme".
    let cap = other.semaphore("tenant:acme", app::shapes::TENANT_CHECKOUTS);
    let mut held = Vec::new();
    for _ in 0..app::shapes::TENANT_CHECKOUTS {
        held.push(cap.acquire().await.expect("a permit"));
    }
    let send = |tenant: &'static str| {
        let (http, base) = (http.clone(), base.clone());
        async move { checkout_as(&http, &base, tenant, &[("nut", 1)]).await }
    };
    let res = send("acme").await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS, "{}", res.text());
    assert_eq!(res.error_code().as_deref(), Some("tenant_busy"));
    let res = send("globex").await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    held.pop()
        .unwrap()
        .release()
        .await
        .expect("release a permit");
    let res = send("acme").await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    for p in held {
        p.release().await.expect("release");
    }
}
