//! Keys come from the router's own path parameters: right under nests and in
//! wildcards, one key per resource however the client spells it, with the layer's
//! prefix.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Extension, Router};
use http::StatusCode;
use lockflight::guard::LockInfo;
use lockflight::layer::{KeyFrom, LockLayer};

use super::support::{redis_locker, serve};

/// The key the request ran under.
async fn key_of(Extension(lock): Extension<LockInfo>) -> String {
    lock.key.to_string()
}

#[tokio::test]
async fn nests_at_any_depth_and_wildcards_lock_the_routers_value() {
    let locker = redis_locker("http-nest", Duration::from_secs(5)).await;
    let accounts = Router::new()
        .route("/accounts/{id}/debit", post(key_of))
        .route_layer(
            LockLayer::new(locker.clone(), KeyFrom::path_param("id"))
                .key_prefix("account:")
                .handle_errors(),
        );
    // A parameter in the nest's own path.
    let tenants = Router::new()
        .route("/orders/{order}", post(key_of))
        .route_layer(LockLayer::new(locker.clone(), KeyFrom::path_param("tenant")).handle_errors());
    let files = Router::new()
        .route("/files/{*path}", post(key_of))
        .route_layer(
            LockLayer::new(locker.clone(), KeyFrom::path_param("path"))
                .key_prefix("file:")
                .handle_errors(),
        );
    let app = Router::new()
        .merge(accounts.clone())
        .nest("/api", accounts.clone())
        .nest("/api", Router::new().nest("/v2", accounts))
        .nest("/tenants/{tenant}", tenants)
        .merge(files);
    let served = serve(app).await;

    for (path, key) in [
        ("/accounts/alice/debit", "account:alice"),
        ("/api/accounts/alice/debit", "account:alice"),
        ("/api/accounts/bob/debit", "account:bob"),
        ("/api/v2/accounts/bob/debit", "account:bob"),
        ("/tenants/acme/orders/7", "acme"),
        ("/files/a/b.txt", "file:a/b.txt"),
        ("/files/a%2Fb.txt", "file:a/b.txt"),
    ] {
        let reply = served.post(path, "{}").await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text());
        assert_eq!(reply.text(), key, "{path}");
    }
}

#[tokio::test]
async fn percent_encoded_and_utf8_spellings_of_one_resource_lock_one_key() {
    let locker = redis_locker("http-alias", Duration::from_secs(5)).await;
    let app = Router::new()
        .route("/accounts/{id}", post(key_of))
        .route_layer(LockLayer::new(locker, KeyFrom::path_param("id")).handle_errors());
    let served = serve(app).await;
    for (path, key) in [
        ("/accounts/alice", "alice"),
        ("/accounts/%61lice", "alice"),
        ("/accounts/%61%6C%69%63%65", "alice"),
        ("/accounts/%61%6c%69%63%65", "alice"),
        ("/accounts/caf%C3%A9", "café"),
        ("/accounts/caf%c3%a9", "café"),
    ] {
        let reply = served.post(path, "{}").await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text());
        assert_eq!(reply.text(), key, "{path}");
    }
    // Not UTF-8 once decoded: the request's fault, refused before any lock.
    let reply = served.post("/accounts/%FF", "{}").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(reply.problem_code(), "invalid_key");
}

/// The lost-update check: a read-modify-write handler, hit concurrently through
/// every spelling of one account, loses no update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_through_aliases_are_serialised() {
    let locker = redis_locker("http-rmw", Duration::from_secs(30)).await;
    let balances: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let handler = {
        let balances = Arc::clone(&balances);
        move |axum::extract::Path(id): axum::extract::Path<String>| {
            let balances = Arc::clone(&balances);
            async move {
                let read = *balances.lock().unwrap().get(&id).unwrap_or(&0);
                // Yield while "computing", so an unserialised request overtakes.
                tokio::time::sleep(Duration::from_millis(5)).await;
                balances.lock().unwrap().insert(id, read + 1);
                "ok"
            }
        }
    };
    let app = Router::new()
        .route("/accounts/{id}/credit", post(handler))
        .route_layer(LockLayer::new(locker, KeyFrom::path_param("id")).handle_errors());
    let served = Arc::new(serve(app).await);
    let spellings = ["alice", "%61lice", "%61%6C%69%63%65", "al%69ce"];
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let served = Arc::clone(&served);
        let path = format!("/accounts/{}/credit", spellings[i % spellings.len()]);
        tasks.spawn(async move { served.post(&path, "{}").await.status });
    }
    let statuses = tasks.join_all().await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert_eq!(balances.lock().unwrap().get("alice"), Some(&40));
}

#[tokio::test]
async fn a_trailing_slash_is_another_route_and_locks_nothing() {
    let locker = redis_locker("http-slash", Duration::from_secs(5)).await;
    let app = Router::new()
        .route("/accounts/{id}", get(key_of))
        .route_layer(LockLayer::new(locker.clone(), KeyFrom::path_param("id")).handle_errors());
    let served = serve(app).await;
    let before = locker.stats();
    assert_eq!(
        served.get("/accounts/alice/").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        (locker.stats() - before).acquire_attempts,
        0,
        "a 404 took a lock"
    );
    let reply = served.get("/accounts/alice").await;
    assert_eq!(reply.text(), "alice");
    assert_eq!((locker.stats() - before).acquire_attempts, 1);
}
