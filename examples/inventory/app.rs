//! The inventory service: state, schema, handlers and the axum router.
//!
//! Shared by the `inventory` and `demo` examples and by `examples/tests/inventory/`
//! (which includes this file with `#[path]`), so it only uses `crate::`-free paths.
//!
//! # The reservation critical section
//!
//! `POST /items/{sku}/reserve` runs behind [`LockLayer`], keyed by the SKU: the
//! handler reads the stock, checks it and writes the decrement while holding the
//! SKU's lock, and it receives the lock's [`FencingToken`] in a [`LockInfo`]
//! request extension. The write is **fenced** at the database:
//!
//! ```sql
//! UPDATE items SET stock = stock - ?, fence_epoch = ?, fence_seq = ?
//!  WHERE sku = ? AND stock >= ? AND (fence_epoch, fence_seq) < (?, ?)
//! ```
//!
//! so a writer whose lease was lost (paused process, network partition) and whose
//! token is no longer the newest is rejected by the database even if it reaches it
//! after another holder wrote (counted, 503 `stale_fencing_token`). If the lease is
//! lost while the handler is still running, the lock layer drops the handler future
//! before it can write (503). A trigger logs every accepted decrement, with its
//! token, in `reservations`, within the same statement.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lockflight::layer::{LockLayer, MissingKey, PathParam, SharedResponseLayer, handle_error};
use lockflight::{FencingToken, Locker, guard::LockInfo};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::mpsc;
use tower::ServiceBuilder;

// Relative to this file, wherever it is included from.
#[path = "shapes.rs"]
pub(crate) mod shapes;
#[allow(unused_imports)] // used by the demo
pub(crate) use shapes::OPTIMISTIC_ATTEMPTS;

/// The schema, created on start (`IF NOT EXISTS`, so several instances sharing one
/// database file may all run it, concurrently too).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS items (
    sku         TEXT PRIMARY KEY NOT NULL,
    name        TEXT NOT NULL,
    stock       INTEGER NOT NULL CHECK (stock >= 0),
    fence_epoch INTEGER NOT NULL DEFAULT 0,
    fence_seq   INTEGER NOT NULL DEFAULT 0,
    -- Bumped by every optimistic write (POST /items/{sku}/reserve-optimistic).
    version     INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS reservations (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    sku         TEXT NOT NULL REFERENCES items (sku),
    qty         INTEGER NOT NULL,
    remaining   INTEGER NOT NULL,
    fence_epoch INTEGER NOT NULL,
    fence_seq   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS reservations_by_sku ON reservations (sku);
-- Restocks, each under the SKU's write lock (POST /items/{sku}/restock).
CREATE TABLE IF NOT EXISTS restocks (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    sku         TEXT NOT NULL REFERENCES items (sku),
    qty         INTEGER NOT NULL,
    fence_epoch INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS reservations_by_token ON reservations (fence_epoch, fence_seq);
-- Every accepted decrement is logged by the same statement that makes it.
CREATE TRIGGER IF NOT EXISTS log_reservation
AFTER UPDATE OF stock ON items
WHEN NEW.stock < OLD.stock
BEGIN
    INSERT INTO reservations (sku, qty, remaining, fence_epoch, fence_seq)
    VALUES (NEW.sku, OLD.stock - NEW.stock, NEW.stock, NEW.fence_epoch, NEW.fence_seq);
END;
";

/// The fenced decrement: only a writer with a newer token than the last accepted
/// one, and only while enough stock is left. Binds: qty, epoch, seq, sku, qty,
/// epoch, seq.
pub(crate) const FENCED_DECREMENT: &str = "UPDATE items SET stock = stock - ?, fence_epoch = ?, fence_seq = ? \
     WHERE sku = ? AND stock >= ? AND (fence_epoch, fence_seq) < (?, ?) RETURNING stock";

/// Opens (creating if needed) the database and its schema.
///
/// `Some(path)`: a file database in WAL mode, shareable by several instances
/// (processes or pools); `None`: a private in-memory database.
///
/// Either way the pool has **one** connection. For `sqlite::memory:` that is a
/// must (each connection would be its own database). For a file it keeps this
/// process's writers in the pool's fair, asynchronous queue: SQLite's own lock
/// between connections is taken by polling with sleeps of up to 100 ms, which
/// would stall whichever SKU's critical section loses the race.
pub(crate) async fn open_db(path: Option<&Path>) -> Result<SqlitePool, sqlx::Error> {
    let pool = match path {
        Some(path) => {
            let options = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true);
            SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await?
        }
        None => {
            let options = SqliteConnectOptions::new()
                .in_memory(true)
                .foreign_keys(true);
            SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await?
        }
    };
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;
    Ok(pool)
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// The application's own counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Reservations written.
    pub(crate) reservations: AtomicU64,
    /// Reservations refused for lack of stock.
    pub(crate) out_of_stock: AtomicU64,
    /// Writes the database refused because their fencing token was stale.
    pub(crate) stale_rejected: AtomicU64,
    /// Executions of the `GET /items/{sku}` handler (requests that share a response run it once).
    pub(crate) item_reads: AtomicU64,
    /// Optimistic writes that found the row changed since they read it (each one
    /// is retried).
    pub(crate) version_conflicts: AtomicU64,
    /// Carts checked out (all lines written).
    pub(crate) checkouts: AtomicU64,
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
pub(crate) struct Hooks {
    /// Sleep this long inside the reservation critical section, after the stock
    /// check and before the database write.
    pub(crate) before_write: Duration,
    /// Sleep this long in the `GET /items/{sku}` handler (so concurrent reads overlap).
    pub(crate) item_read_delay: Duration,
    /// Receives the [`LockInfo`] of every reservation critical section as it starts.
    pub(crate) entered: Option<mpsc::UnboundedSender<LockInfo>>,
}

/// Everything a handler needs; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct AppState {
    /// The database.
    pub(crate) db: SqlitePool,
    /// The locker (one per process).
    pub(crate) locker: Locker,
    /// The app's counters.
    pub(crate) counters: Arc<Counters>,
    /// Test hooks.
    pub(crate) hooks: Arc<Hooks>,
    /// This instance's name (in responses and in `/stats`).
    pub(crate) instance: Arc<str>,
    /// What the lock backend is, for `/stats` ("redis", "memory").
    pub(crate) backend: Arc<str>,
    /// What locking mode the locker runs, for `/stats`.
    pub(crate) locking: Arc<str>,
    /// More of `/stats` (the lock histograms where a recorder is installed).
    pub(crate) more_stats: Option<MoreStats>,
}

/// A source of extra `/stats` fields, under `"histograms"`.
#[derive(Clone)]
pub(crate) struct MoreStats(pub(crate) Arc<dyn Fn() -> serde_json::Value + Send + Sync>);

impl std::fmt::Debug for MoreStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MoreStats")
    }
}

impl AppState {
    /// State for an instance named `instance`, with no test hooks.
    pub(crate) fn new(db: SqlitePool, locker: Locker, instance: &str) -> Self {
        AppState {
            db,
            locker,
            counters: Arc::default(),
            hooks: Arc::default(),
            instance: Arc::from(instance),
            backend: Arc::from("unknown"),
            locking: Arc::from("unknown"),
            more_stats: None,
        }
    }

    /// Sets the test hooks.
    #[allow(dead_code)] // used by examples/tests/inventory/
    pub(crate) fn with_hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = Arc::new(hooks);
        self
    }

    /// Describes the backend and locking mode in `/stats`.
    pub(crate) fn describe(mut self, backend: &str, locking: &str) -> Self {
        self.backend = Arc::from(backend);
        self.locking = Arc::from(locking);
        self
    }

    /// Writes a reservation fenced by `token` and counts the outcome; see
    /// [`fenced_write`].
    pub(crate) async fn write_reservation(
        &self,
        sku: &str,
        qty: i64,
        token: FencingToken,
    ) -> Result<WriteOutcome, AppError> {
        let outcome = fenced_write(&self.db, sku, qty, token).await?;
        match outcome {
            WriteOutcome::Reserved { .. } => Counters::bump(&self.counters.reservations),
            WriteOutcome::OutOfStock { .. } => Counters::bump(&self.counters.out_of_stock),
            WriteOutcome::Stale { .. } => Counters::bump(&self.counters.stale_rejected),
            WriteOutcome::NotFound => {}
        }
        Ok(outcome)
    }

    /// `/stats` as JSON.
    pub(crate) fn stats_json(&self) -> serde_json::Value {
        let s = self.locker.stats();
        let c = &self.counters;
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
            // Requests sent to the lock backend; with Redis each is one EVALSHA
            // round trip (acquire-or-enqueue, release-and-wake-next, extend, leave).
            "lock_requests": {
                "acquire": s.acquire_attempts,
                "release": s.releases,
                "extend": s.renew_attempts,
                "leave": s.leaves,
                "total": s.acquire_attempts + s.releases + s.renew_attempts + s.leaves,
            },
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
        })
    }
}

// ---------------------------------------------------------------------------
// The fenced write
// ---------------------------------------------------------------------------

/// What the database made of a fenced reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteOutcome {
    /// Written; `remaining` units are left.
    Reserved {
        /// Stock after the reservation.
        remaining: i64,
    },
    /// Not enough stock.
    OutOfStock {
        /// Stock at the time of the attempt.
        available: i64,
    },
    /// The token was not newer than the last accepted one: a stale writer.
    Stale {
        /// The token of the last accepted write.
        current: FencingToken,
    },
    /// No such SKU.
    NotFound,
}

/// Decrements `sku`'s stock by `qty`, only if `token` is newer than the item's last
/// accepted token and enough stock is left: one statement, which also logs the
/// reservation (trigger `log_reservation`), so SQLite's write lock is held for one
/// statement only.
///
/// A refusal is explained from the row as read right after it.
pub(crate) async fn fenced_write(
    db: &SqlitePool,
    sku: &str,
    qty: i64,
    token: FencingToken,
) -> Result<WriteOutcome, AppError> {
    let epoch = to_sql(token.epoch)?;
    let seq = to_sql(token.seq)?;
    let remaining: Option<i64> = sqlx::query_scalar(FENCED_DECREMENT)
        .bind(qty)
        .bind(epoch)
        .bind(seq)
        .bind(sku)
        .bind(qty)
        .bind(epoch)
        .bind(seq)
        .fetch_optional(db)
        .await?;
    if let Some(remaining) = remaining {
        return Ok(WriteOutcome::Reserved { remaining });
    }
    let row: Option<(i64, i64, i64)> =
        sqlx::query_as("SELECT stock, fence_epoch, fence_seq FROM items WHERE sku = ?")
            .bind(sku)
            .fetch_optional(db)
            .await?;
    Ok(match row {
        None => WriteOutcome::NotFound,
        Some((_, fe, fs)) if (fe, fs) >= (epoch, seq) => WriteOutcome::Stale {
            current: FencingToken {
                epoch: from_sql(fe),
                seq: from_sql(fs),
            },
        },
        Some((stock, ..)) => WriteOutcome::OutOfStock { available: stock },
    })
}

pub(crate) fn to_sql(v: u64) -> Result<i64, AppError> {
    i64::try_from(v).map_err(|_| AppError::Internal(format!("fencing value {v} exceeds i64")))
}

fn from_sql(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The last accepted fencing token of `sku`, if the item exists.
#[allow(dead_code)] // used by examples/tests/inventory/
pub(crate) async fn item_fence(
    db: &SqlitePool,
    sku: &str,
) -> Result<Option<FencingToken>, sqlx::Error> {
    let row: Option<(i64, i64)> =
        sqlx::query_as("SELECT fence_epoch, fence_seq FROM items WHERE sku = ?")
            .bind(sku)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|(e, s)| FencingToken {
        epoch: from_sql(e),
        seq: from_sql(s),
    }))
}

/// Reservations logged with exactly this fencing token.
#[allow(dead_code)] // used by examples/tests/inventory/
pub(crate) async fn reservations_with_token(
    db: &SqlitePool,
    token: FencingToken,
) -> Result<i64, AppError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM reservations WHERE fence_epoch = ? AND fence_seq = ?",
    )
    .bind(to_sql(token.epoch)?)
    .bind(to_sql(token.seq)?)
    .fetch_one(db)
    .await?)
}

/// `(rows, units)` of the reservation log for `sku`.
pub(crate) async fn reservation_log(db: &SqlitePool, sku: &str) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as("SELECT count(*), coalesce(sum(qty), 0) FROM reservations WHERE sku = ?")
        .bind(sku)
        .fetch_one(db)
        .await
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

/// An item as stored and returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub(crate) struct Item {
    /// Stock keeping unit: 1–64 of `A-Z a-z 0-9 - _ . :`.
    pub(crate) sku: String,
    /// Display name.
    pub(crate) name: String,
    /// Units left.
    pub(crate) stock: i64,
}

/// `POST /items/{sku}/reserve` body.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct ReserveRequest {
    /// Units to reserve (at least 1).
    pub(crate) qty: i64,
}

/// A handler error.
#[derive(Debug)]
pub(crate) enum AppError {
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

pub(crate) fn error_response(status: StatusCode, body: serde_json::Value) -> Response {
    (status, Json(body)).into_response()
}

/// Whether `sku` is a valid SKU. Only URL-safe characters, so the lock key taken
/// from the raw path equals the SKU (no two spellings of one SKU).
pub(crate) fn valid_sku(sku: &str) -> bool {
    (1..=64).contains(&sku.len())
        && sku
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// The service: `POST /items`, `GET /items`, `GET /items/{sku}` (a shared response),
/// `POST /items/{sku}/reserve` (locked by SKU, fenced at the database),
/// `GET /stats`, and the other lock shapes of [`shapes`]: `POST /checkout`
/// (several SKUs under one multi-key lock, a per-tenant semaphore cap),
/// `GET /items/{sku}/stock` and `POST /items/{sku}/restock` (read-write lock),
/// `POST /items/{sku}/reserve-optimistic` (no lock: a version column).
pub(crate) fn app(state: AppState) -> Router {
    let locker = state.locker.clone();
    // Locked per SKU. `route_layer`: only matched routes lock, and `PathParam` sees
    // the matched route. `handle_error` maps lockflight's errors to responses
    // (timeout → 503 + Retry-After, lease lost → 503, invalid key → 400).
    let reserve = Router::new()
        .route("/items/{sku}/reserve", post(reserve))
        .route_layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(handle_error))
                .layer(
                    // The route always has a SKU; reject rather than run unlocked
                    // should that ever change.
                    LockLayer::new(locker.clone(), PathParam::new("sku"))
                        .missing_key(MissingKey::Reject),
                ),
        );
    // Concurrent identical reads share one execution (under the SKU's lock, so a
    // read never overlaps a reservation of the same SKU).
    let read_one = Router::new()
        .route("/items/{sku}", get(get_item))
        .route_layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(handle_error))
                .layer(SharedResponseLayer::new(locker, PathParam::new("sku"))),
        );
    Router::new()
        .route("/items", get(list_items).post(create_item))
        .route("/stats", get(stats))
        .merge(reserve)
        .merge(read_one)
        .merge(shapes::routes(&state))
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
        Ok(None) => error_response(
            StatusCode::NOT_FOUND,
            json!({ "error": "not_found", "sku": sku }),
        ),
        Err(e) => AppError::from(e).into_response(),
    }
}

async fn stats(State(st): State<AppState>) -> Json<serde_json::Value> {
    Json(st.stats_json())
}

/// The critical section. Runs while this instance holds the SKU's lock; if the
/// lease is lost, the lock layer drops this future at its next `.await` and
/// answers 503.
async fn reserve(
    State(st): State<AppState>,
    Extension(info): Extension<LockInfo>,
    UrlPath(sku): UrlPath<String>,
    Json(req): Json<ReserveRequest>,
) -> Response {
    let token = info.fencing_token;
    if info.key.as_str() != Some(sku.as_str()) || !valid_sku(&sku) {
        return error_response(
            StatusCode::BAD_REQUEST,
            json!({ "error": "invalid_sku", "sku": sku }),
        );
    }
    if req.qty < 1 {
        return error_response(
            StatusCode::BAD_REQUEST,
            json!({ "error": "invalid_qty", "message": "qty must be at least 1" }),
        );
    }
    if let Some(entered) = &st.hooks.entered {
        let _ = entered.send(info.clone());
    }
    // Read and check under the lock ...
    let stock: Option<i64> = match sqlx::query_scalar("SELECT stock FROM items WHERE sku = ?")
        .bind(&sku)
        .fetch_optional(&st.db)
        .await
    {
        Ok(stock) => stock,
        Err(e) => return AppError::from(e).into_response(),
    };
    let Some(stock) = stock else {
        return error_response(
            StatusCode::NOT_FOUND,
            json!({ "error": "not_found", "sku": sku }),
        );
    };
    if stock < req.qty {
        Counters::bump(&st.counters.out_of_stock);
        return out_of_stock(&sku, req.qty, stock);
    }
    if !st.hooks.before_write.is_zero() {
        tokio::time::sleep(st.hooks.before_write).await;
    }
    // ... and write, with the fencing token as the database's safety net.
    match st.write_reservation(&sku, req.qty, token).await {
        Ok(WriteOutcome::Reserved { remaining }) => Json(json!({
            "sku": sku,
            "reserved": req.qty,
            "remaining": remaining,
            "fencing_token": { "epoch": token.epoch, "seq": token.seq },
            "instance": &*st.instance,
        }))
        .into_response(),
        Ok(WriteOutcome::OutOfStock { available }) => out_of_stock(&sku, req.qty, available),
        Ok(WriteOutcome::Stale { current }) => {
            let mut res = error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({
                    "error": "stale_fencing_token",
                    "message": "the database accepted a newer lock holder's write; \
                                this lock was lost, nothing was written; retry",
                    "sku": sku,
                    "fencing_token": { "epoch": token.epoch, "seq": token.seq },
                    "current": { "epoch": current.epoch, "seq": current.seq },
                }),
            );
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            res
        }
        Ok(WriteOutcome::NotFound) => error_response(
            StatusCode::NOT_FOUND,
            json!({ "error": "not_found", "sku": sku }),
        ),
        Err(e) => e.into_response(),
    }
}

pub(crate) fn out_of_stock(sku: &str, requested: i64, available: i64) -> Response {
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
