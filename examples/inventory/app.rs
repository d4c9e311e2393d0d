//! The inventory service: its state, the item handlers and the axum router.
//!
//! Shared by the `inventory` and `demo` examples and by `examples/tests/inventory/`
//! through the `inventory` library (`inventory/lib.rs`).
//!
//! Its parts, in `app/`: `db.rs` (the schema and the reservation's fenced or unfenced
//! write), `reserve.rs` (`POST /items/{sku}/reserve`, the critical section under
//! lockflight's lock or, in the `plain` mode, under `plain_lock.rs`'s plain Redis
//! lock), `shapes.rs` (the other lock shapes) and `job.rs` (the job only the
//! leader of the instances runs: releasing expired reservations).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use job::LeaderJob;
use lockflight::layer::{IdempotencyLayer, KeyFrom, LockLayer, PROBLEM_JSON, SharedResponseLayer};
use lockflight::{FencingToken, Locker, guard::LockInfo};
use plain_lock::PlainLock;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::SqlitePool;
use tokio::sync::mpsc;

pub mod db;
pub mod job;
pub mod plain_lock;
mod reserve;
pub mod shapes;
pub use db::{
    WriteOutcome, item_fence, item_fence_columns, open_db, reservation_log,
    reservations_with_token, to_sql,
};
pub use shapes::OPTIMISTIC_ATTEMPTS;

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// The application's own counters.
#[derive(Debug, Default)]
pub struct Counters {
    /// Reservations written.
    pub reservations: AtomicU64,
    /// Reservations refused for lack of stock.
    pub out_of_stock: AtomicU64,
    /// Writes the database refused because their fencing token was stale.
    pub stale_rejected: AtomicU64,
    /// Executions of the `GET /items/{sku}` handler (requests that share a response run it once).
    pub item_reads: AtomicU64,
    /// Optimistic writes that found the row changed since they read it (each one
    /// is retried).
    pub version_conflicts: AtomicU64,
    /// Carts checked out (all lines written).
    pub checkouts: AtomicU64,
}

impl Counters {
    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Test hooks: slow steps and a window into the critical section.
#[derive(Debug, Default)]
pub struct Hooks {
    /// Sleep this long inside the reservation critical section, after the stock
    /// check and before the database write.
    pub before_write: Duration,
    /// Sleep this long in the `GET /items/{sku}` handler (so concurrent reads overlap).
    pub item_read_delay: Duration,
    /// Receives the [`LockInfo`] of every reservation critical section as it starts.
    pub entered: Option<mpsc::UnboundedSender<LockInfo>>,
    /// Counts the reservation critical sections running at once (share one
    /// between instances to see whether their lock excludes them).
    pub occupancy: Option<Arc<Occupancy>>,
}

/// Reservation critical sections running at once, and the most there ever were.
#[derive(Debug, Default)]
pub struct Occupancy {
    now: AtomicU64,
    most: AtomicU64,
}

impl Occupancy {
    /// The most critical sections that ever ran at once.
    pub fn most(&self) -> u64 {
        self.most.load(Ordering::SeqCst)
    }

    /// Counts one section in until the returned value is dropped.
    fn enter(self: &Arc<Self>) -> impl Drop + use<> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        struct Leave(Arc<Occupancy>);
        impl Drop for Leave {
            fn drop(&mut self) {
                self.0.now.fetch_sub(1, Ordering::SeqCst);
            }
        }
        Leave(Arc::clone(self))
    }
}

/// Everything a handler needs; cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The database.
    pub db: SqlitePool,
    /// The locker (one per process).
    pub locker: Locker,
    /// The app's counters.
    pub counters: Arc<Counters>,
    /// Test hooks.
    pub hooks: Arc<Hooks>,
    /// This instance's name (in responses and in `/stats`).
    pub instance: Arc<str>,
    /// What the lock backend is, for `/stats` ("redis", "memory").
    pub backend: Arc<str>,
    /// What locking mode the locker runs, for `/stats`.
    pub locking: Arc<str>,
    /// More of `/stats` (the lock histograms where a recorder is installed).
    pub more_stats: Option<MoreStats>,
    /// The `plain` locking mode: `POST /items/{sku}/reserve` takes this plain
    /// Redis lock instead of lockflight's (and its write is not fenced).
    pub plain: Option<PlainLock>,
    /// The leader-only job (`job.rs`), where this instance runs it.
    pub job: Option<LeaderJob>,
}

/// A source of extra `/stats` fields, under `"histograms"`.
#[derive(Clone)]
pub struct MoreStats(pub Arc<dyn Fn() -> serde_json::Value + Send + Sync>);

impl std::fmt::Debug for MoreStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MoreStats")
    }
}

impl AppState {
    /// State for an instance named `instance`, with no test hooks.
    pub fn new(db: SqlitePool, locker: Locker, instance: &str) -> Self {
        AppState {
            db,
            locker,
            counters: Arc::default(),
            hooks: Arc::default(),
            instance: Arc::from(instance),
            backend: Arc::from("unknown"),
            locking: Arc::from("unknown"),
            more_stats: None,
            plain: None,
            job: None,
        }
    }

    /// Shows the leader-only job (this instance's campaign for it) in `/stats`.
    pub fn with_job(mut self, job: LeaderJob) -> Self {
        self.job = Some(job);
        self
    }

    /// Reservations take `plain` (a plain Redis lock, no fencing token) instead
    /// of lockflight's lock: the `plain` locking mode.
    pub fn with_plain_lock(mut self, plain: PlainLock) -> Self {
        self.plain = Some(plain);
        self
    }

    /// Sets the test hooks.
    pub fn with_hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = Arc::new(hooks);
        self
    }

    /// Describes the backend and locking mode in `/stats`.
    pub fn describe(mut self, backend: &str, locking: &str) -> Self {
        self.backend = Arc::from(backend);
        self.locking = Arc::from(locking);
        self
    }

    /// Writes a reservation fenced by `token` ([`db::fenced_write`]), or without a
    /// fence for `None` (the plain lock has no token: [`db::unfenced_write`]), and
    /// counts the outcome.
    pub async fn write_reservation(
        &self,
        sku: &str,
        qty: i64,
        token: impl Into<Option<FencingToken>>,
    ) -> Result<WriteOutcome, AppError> {
        let outcome = match token.into() {
            Some(token) => db::fenced_write(&self.db, sku, qty, token).await?,
            None => db::unfenced_write(&self.db, sku, qty).await?,
        };
        match outcome {
            WriteOutcome::Reserved { .. } => Counters::bump(&self.counters.reservations),
            WriteOutcome::OutOfStock { .. } => Counters::bump(&self.counters.out_of_stock),
            WriteOutcome::Stale { .. } => Counters::bump(&self.counters.stale_rejected),
            WriteOutcome::NotFound => {}
        }
        Ok(outcome)
    }

    /// `/stats` as JSON.
    pub fn stats_json(&self) -> serde_json::Value {
        let s = self.locker.stats();
        let c = &self.counters;
        // The plain lock's requests: `SET NX` attempts and compare-and-deletes.
        let (plain_set, plain_release) = self.plain.as_ref().map_or((0, 0), PlainLock::requests);
        json!({
            "instance": &*self.instance,
            "backend": &*self.backend,
            "locking": &*self.locking,
            "lockflight": {
                "acquire_attempts": s.acquire_attempts,
                "acquired": s.acquired,
                "local_waits": s.local_waits,
                "handoffs": s.handoffs,
                "releases": s.releases,
                "renewals": s.renewals,
                "leases_lost": s.leases_lost,
                "timeouts": s.timeouts,
            },
            // Requests sent to the lock backend; with Redis each is one round
            // trip: lockflight's EVALSHAs (acquire-or-enqueue, release-and-wake-next,
            // renew, leave) plus, in the plain mode, the plain lock's `SET NX`
            // attempts (acquire) and compare-and-deletes (release).
            "lock_requests": {
                "acquire": s.acquire_attempts + plain_set,
                "release": s.releases + plain_release,
                "renew": s.renew_attempts,
                "leave": s.leaves,
                "total": s.acquire_attempts + s.releases + s.renew_attempts + s.leaves
                    + plain_set + plain_release,
            },
            "plain_lock": self.plain.as_ref().map(PlainLock::stats_json),
            "app": {
                "reservations": Counters::get(&c.reservations),
                "out_of_stock": Counters::get(&c.out_of_stock),
                "stale_rejected": Counters::get(&c.stale_rejected),
                "item_reads": Counters::get(&c.item_reads),
                "version_conflicts": Counters::get(&c.version_conflicts),
                "checkouts": Counters::get(&c.checkouts),
            },
            // Wait and hold times and renewals per lease, for sizing `lease_ttl`
            // and `wait_timeout` from their tails (null without a recorder).
            "histograms": self.more_stats.as_ref().map(|more| (more.0)()),
            // The leader-only job: who leads it, and this instance's part.
            "job": self.job.as_ref().map(LeaderJob::stats_json),
        })
    }
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

/// An item as stored and returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Item {
    /// Stock keeping unit: 1–64 of `A-Z a-z 0-9 - _ . :`.
    pub sku: String,
    /// Display name.
    pub name: String,
    /// Units left.
    pub stock: i64,
}

/// `POST /items/{sku}/reserve` body.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ReserveRequest {
    /// Units to reserve (at least 1).
    pub qty: i64,
}

/// A handler error.
#[derive(Debug)]
pub enum AppError {
    /// The database failed.
    Db(sqlx::Error),
    /// Anything else that should not happen.
    Internal(String),
}

impl From<sqlx::Error> for AppError {
    fn from(e: sqlx::Error) -> Self {
        AppError::Db(e)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Db(e) => write!(f, "database error: {e}"),
            AppError::Internal(e) => write!(f, "internal error: {e}"),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": "internal", "message": self.to_string() }),
        )
    }
}

/// An error response in the service's one error format, the lock layer's: an RFC
/// 9457 problem (`application/problem+json`). `body`'s `error` becomes the stable
/// `code`, its `message` the `detail`; its other members (`sku`, `available`, …)
/// stay as the problem's extension members.
pub fn error_response(status: StatusCode, body: serde_json::Value) -> Response {
    let mut problem = serde_json::Map::new();
    problem.insert("type".into(), json!("about:blank"));
    problem.insert(
        "title".into(),
        json!(status.canonical_reason().unwrap_or("Error")),
    );
    problem.insert("status".into(), json!(status.as_u16()));
    if let serde_json::Value::Object(members) = body {
        for (name, value) in members {
            let name = match name.as_str() {
                "error" => "code".to_owned(),
                "message" => "detail".to_owned(),
                _ => name,
            };
            problem.insert(name, value);
        }
    }
    let mut res = (status, serde_json::Value::Object(problem).to_string()).into_response();
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    res
}

/// Turns the error responses nobody in the service wrote (axum's rejections: a
/// body that is not JSON, a 404 of the router, a 405) into problems too, so that
/// clients see one format.
async fn problems_only(res: Response) -> Response {
    let status = res.status();
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes());
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return res;
    }
    let code = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        s if s.is_client_error() => "invalid_request",
        _ => "internal",
    };
    let text = match axum::body::to_bytes(res.into_body(), 1024).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let mut body = json!({ "error": code });
    if !text.is_empty() {
        body["message"] = json!(text);
    }
    error_response(status, body)
}

/// Whether `sku` is a valid SKU: 1–64 of `A-Z a-z 0-9 - _ . :`. The lock key is
/// the router's percent-decoded `{sku}`, so `%41` and `A` are one SKU and one lock.
pub fn valid_sku(sku: &str) -> bool {
    (1..=64).contains(&sku.len())
        && sku
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// The service: `POST /items`, `GET /items`, `GET /items/{sku}` (a shared response),
/// `POST /items/{sku}/reserve` (locked by SKU, fenced at the database, replayed
/// for a repeated `Idempotency-Key`), `GET /stats`, and the other lock shapes of
/// [`shapes`]: `POST /checkout` (several SKUs under one multi-key lock, a
/// per-tenant semaphore cap),
/// `GET /items/{sku}/stock` and `POST /items/{sku}/restock` (read-write lock),
/// `POST /items/{sku}/reserve-optimistic` (no lock: a version column).
pub fn app(state: AppState) -> Router {
    let locker = state.locker.clone();
    // Locked per SKU, the SKU taken from the router's own `{sku}` parameter, and
    // only once the request is ready: the handler's `Locked<ReserveBody>` extractor
    // reads and validates the body (JSON, qty ≥ 1, a valid SKU) before it takes the
    // lock, so a slow upload holds no lock and a bad request takes none.
    // `handle_errors`: every lockflight error is a problem response (timeout → 503
    // lock_timeout + Retry-After, Redis down → 503 lock_backend_unavailable, lease
    // lost → 503 lease_lost). In the plain mode the handler takes the plain Redis
    // lock itself instead.
    // Outside the lock, a client may send `Idempotency-Key`: a retried reservation
    // with the same key runs once (across instances) and its answer is replayed,
    // marked `idempotent-replayed: true`, without taking the SKU's lock; the same
    // key with another body is 422. A request without the key runs as before.
    let reserve = match state.plain {
        Some(_) => Router::new().route("/items/{sku}/reserve", post(reserve::reserve_plain)),
        None => Router::new()
            .route("/items/{sku}/reserve", post(reserve::reserve))
            .route_layer(
                LockLayer::new(locker.clone(), KeyFrom::path_param("sku"))
                    .lock_in_handler()
                    .handle_errors(),
            )
            .route_layer(IdempotencyLayer::new(locker.clone()).handle_errors()),
    };
    // Concurrent identical reads share one execution (under the SKU's lock, so a
    // read never overlaps a reservation of the same SKU).
    let read_one = Router::new()
        .route("/items/{sku}", get(get_item))
        .route_layer(SharedResponseLayer::new(locker, KeyFrom::path_param("sku")).handle_errors());
    Router::new()
        .route("/items", get(list_items).post(create_item))
        .route("/stats", get(stats))
        .merge(reserve)
        .merge(read_one)
        .merge(shapes::routes(&state))
        .layer(axum::middleware::map_response(problems_only))
        .with_state(state)
}

async fn create_item(State(st): State<AppState>, Json(item): Json<Item>) -> Response {
    if !valid_sku(&item.sku) {
        return error_response(
            StatusCode::BAD_REQUEST,
            json!({ "error": "invalid_sku", "message": "1-64 of A-Z a-z 0-9 - _ . :" }),
        );
    }
    if item.stock < 0 {
        return error_response(
            StatusCode::BAD_REQUEST,
            json!({ "error": "negative_stock" }),
        );
    }
    let inserted = sqlx::query(
        "INSERT INTO items (sku, name, stock) VALUES (?, ?, ?) ON CONFLICT (sku) DO NOTHING",
    )
    .bind(&item.sku)
    .bind(&item.name)
    .bind(item.stock)
    .execute(&st.db)
    .await;
    match inserted {
        Ok(done) if done.rows_affected() == 1 => (StatusCode::CREATED, Json(item)).into_response(),
        Ok(_) => error_response(
            StatusCode::CONFLICT,
            json!({ "error": "exists", "sku": item.sku }),
        ),
        Err(e) => AppError::from(e).into_response(),
    }
}

async fn list_items(State(st): State<AppState>) -> Response {
    let items: Result<Vec<Item>, _> =
        sqlx::query_as("SELECT sku, name, stock FROM items ORDER BY sku")
            .fetch_all(&st.db)
            .await;
    match items {
        Ok(items) => Json(items).into_response(),
        Err(e) => AppError::from(e).into_response(),
    }
}

async fn get_item(State(st): State<AppState>, UrlPath(sku): UrlPath<String>) -> Response {
    Counters::bump(&st.counters.item_reads);
    if !st.hooks.item_read_delay.is_zero() {
        tokio::time::sleep(st.hooks.item_read_delay).await;
    }
    let item: Result<Option<Item>, _> =
        sqlx::query_as("SELECT sku, name, stock FROM items WHERE sku = ?")
            .bind(&sku)
            .fetch_optional(&st.db)
            .await;
    match item {
        Ok(Some(item)) => Json(item).into_response(),
        Ok(None) => not_found(&sku),
        Err(e) => AppError::from(e).into_response(),
    }
}

async fn stats(State(st): State<AppState>) -> Json<serde_json::Value> {
    Json(st.stats_json())
}

/// The row `query` (one `?`, bound to `sku`) returns, or the response to answer:
/// 404 `not_found` without a row, 500 on a database error.
pub async fn read_row<T>(db: &SqlitePool, query: &'static str, sku: &str) -> Result<T, Response>
where
    T: Send + Unpin + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>,
{
    match sqlx::query_as::<_, T>(query)
        .bind(sku)
        .fetch_optional(db)
        .await
    {
        Ok(Some(row)) => Ok(row),
        Ok(None) => Err(not_found(sku)),
        Err(e) => Err(AppError::from(e).into_response()),
    }
}

/// 404 `not_found` for `sku`.
pub fn not_found(sku: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        json!({ "error": "not_found", "sku": sku }),
    )
}

/// The 409 of a reservation larger than the stock.
pub fn out_of_stock(sku: &str, requested: i64, available: i64) -> Response {
    error_response(
        StatusCode::CONFLICT,
        json!({
            "error": "out_of_stock",
            "sku": sku,
            "requested": requested,
            "available": available,
        }),
    )
}
