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
use plain_lock::PlainLock;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::mpsc;
use tower::ServiceBuilder;

// Relative to this file, wherever it is included from.
#[path = "plain_lock.rs"]
pub(crate) mod plain_lock;
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
    /// Counts the reservation critical sections running at once (share one
    /// between instances to see whether their lock excludes them).
    pub(crate) occupancy: Option<Arc<Occupancy>>,
}

/// Reservation critical sections running at once, and the most there ever were.
#[derive(Debug, Default)]
pub(crate) struct Occupancy {
    now: AtomicU64,
    most: AtomicU64,
}

impl Occupancy {
    /// The most critical sections that ever ran at once.
    #[allow(dead_code)] // used by examples/tests/inventory/
    pub(crate) fn most(&self) -> u64 {
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
    /// The `plain` locking mode: `POST /items/{sku}/reserve` takes this plain
    /// Redis lock instead of lockflight's (and its write is not fenced).
    pub(crate) plain: Option<PlainLock>,
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
            plain: None,
        }
    }

    /// Reservations take `plain` (a plain Redis lock, no fencing token) instead
    /// of lockflight's lock: the `plain` locking mode.
    pub(crate) fn with_plain_lock(mut self, plain: PlainLock) -> Self {
        self.plain = Some(plain);
        self
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

    /// Writes a reservation fenced by `token` ([`fenced_write`]), or without a
    /// fence for `None` (the plain lock has no token: [`unfenced_write`]), and
    /// counts the outcome.
    pub(crate) async fn write_reservation(
        &self,
        sku: &str,
        qty: i64,
        token: impl Into<Option<FencingToken>>,
    ) -> Result<WriteOutcome, AppError> {
        let outcome = match token.into() {
            Some(token) => fenced_write(&self.db, sku, qty, token).await?,
            None => unfenced_write(&self.db, sku, qty).await?,
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
    pub(crate) fn stats_json(&self) -> serde_json::Value {
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
            // extend, leave) plus, in the plain mode, the plain lock's `SET NX`
            // attempts (acquire) and compare-and-deletes (release).
            "lock_requests": {
                "acquire": s.acquire_attempts + plain_set,
                "release": s.releases + plain_release,
                "extend": s.renew_attempts,
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
    explain(db, sku, remaining, Some((epoch, seq))).await
}

/// The decrement of the plain mode: no fence (a plain lock has no token, so the
/// database cannot tell a stale holder; only the lock protects the stock), and
/// only while enough stock is left. Binds: qty, sku, qty.
const UNFENCED_DECREMENT: &str =
    "UPDATE items SET stock = stock - ? WHERE sku = ? AND stock >= ? RETURNING stock";

/// Decrements `sku`'s stock by `qty` if enough is left, without a fencing check:
/// the write of the plain mode. Logged like [`fenced_write`]'s (with the item's
/// unchanged fence columns).
pub(crate) async fn unfenced_write(
    db: &SqlitePool,
    sku: &str,
    qty: i64,
) -> Result<WriteOutcome, AppError> {
    let remaining: Option<i64> = sqlx::query_scalar(UNFENCED_DECREMENT)
        .bind(qty)
        .bind(sku)
        .bind(qty)
        .fetch_optional(db)
        .await?;
    explain(db, sku, remaining, None).await
}

/// The outcome of a decrement that returned `remaining`: written, or a refusal
/// explained from the row as read right after it (stale only where the write
/// carried the token `fence`).
async fn explain(
    db: &SqlitePool,
    sku: &str,
    remaining: Option<i64>,
    fence: Option<(i64, i64)>,
) -> Result<WriteOutcome, AppError> {
    if let Some(remaining) = remaining {
        return Ok(WriteOutcome::Reserved { remaining });
    }
    let row: Option<(i64, i64, i64)> =
        sqlx::query_as("SELECT stock, fence_epoch, fence_seq FROM items WHERE sku = ?")
            .bind(sku)
            .fetch_optional(db)
            .await?;
    Ok(match (row, fence) {
        (None, _) => WriteOutcome::NotFound,
        (Some((_, fe, fs)), Some(token)) if (fe, fs) >= token => WriteOutcome::Stale {
            current: FencingToken {
                epoch: from_sql(fe),
                seq: from_sql(fs),
            },
        },
        (Some((stock, ..)), _) => WriteOutcome::OutOfStock { available: stock },
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
    // In the plain mode the handler takes the plain Redis lock itself instead.
    let reserve = match state.plain {
        Some(_) => Router::new().route("/items/{sku}/reserve", post(reserve_plain)),
        None => Router::new()
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
            ),
    };
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
        Ok(None) => not_found(&sku),
        Err(e) => AppError::from(e).into_response(),
    }
}

async fn stats(State(st): State<AppState>) -> Json<serde_json::Value> {
    Json(st.stats_json())
}

/// `POST /items/{sku}/reserve` under lockflight's lock. Runs while this instance
/// holds the SKU's lock; if the lease is lost, the lock layer drops this future
/// at its next `.await` and answers 503. The write is fenced by the lock's token.
async fn reserve(
    State(st): State<AppState>,
    Extension(info): Extension<LockInfo>,
    UrlPath(sku): UrlPath<String>,
    Json(req): Json<ReserveRequest>,
) -> Response {
    if info.key.as_str() != Some(sku.as_str()) {
        return invalid_sku(&sku);
    }
    if let Some(res) = invalid_reserve(&sku, req) {
        return res;
    }
    if let Some(entered) = &st.hooks.entered {
        let _ = entered.send(info.clone());
    }
    critical_section(&st, &sku, req, Some(info.fencing_token)).await
}

/// `POST /items/{sku}/reserve` in the plain mode: the same critical section under
/// a plain Redis lock ([`PlainLock`]). A plain lock has no fencing token, so the
/// write is not fenced and a holder that outlived the lock's TTL cannot be
/// refused; nothing drops the handler when the lock expires either.
async fn reserve_plain(
    State(st): State<AppState>,
    UrlPath(sku): UrlPath<String>,
    Json(req): Json<ReserveRequest>,
) -> Response {
    let Some(plain) = &st.plain else {
        return AppError::Internal("the plain route without a plain lock".into()).into_response();
    };
    if let Some(res) = invalid_reserve(&sku, req) {
        return res;
    }
    let guard = match plain.lock(&sku).await {
        Ok(guard) => guard,
        Err(e) => return e.into_response(),
    };
    let res = critical_section(&st, &sku, req, None).await;
    // Written or not, the section is over: release (a lock that expired meanwhile
    // is counted in `/stats`, `plain_lock.expired_before_release`).
    if let Err(e) = guard.release().await {
        return plain_lock::PlainLockError::Redis(e).into_response();
    }
    res
}

/// The 400 to answer for an invalid SKU (the lock key) or quantity, if any.
fn invalid_reserve(sku: &str, req: ReserveRequest) -> Option<Response> {
    if !valid_sku(sku) {
        return Some(invalid_sku(sku));
    }
    (req.qty < 1).then(|| {
        error_response(
            StatusCode::BAD_REQUEST,
            json!({ "error": "invalid_qty", "message": "qty must be at least 1" }),
        )
    })
}

fn invalid_sku(sku: &str) -> Response {
    error_response(
        StatusCode::BAD_REQUEST,
        json!({ "error": "invalid_sku", "sku": sku }),
    )
}

/// The reservation's critical section, run while the SKU's lock is held: read
/// the stock, check it, write the decrement — fenced by `token` under lockflight,
/// unfenced (`None`) under the plain lock.
async fn critical_section(
    st: &AppState,
    sku: &str,
    req: ReserveRequest,
    token: Option<FencingToken>,
) -> Response {
    let _inside = st.hooks.occupancy.as_ref().map(Occupancy::enter);
    // Read and check under the lock ...
    let stock = match read_row::<(i64,)>(&st.db, "SELECT stock FROM items WHERE sku = ?", sku).await
    {
        Ok((stock,)) => stock,
        Err(res) => return res,
    };
    if stock < req.qty {
        Counters::bump(&st.counters.out_of_stock);
        return out_of_stock(sku, req.qty, stock);
    }
    if !st.hooks.before_write.is_zero() {
        tokio::time::sleep(st.hooks.before_write).await;
    }
    // ... and write, with the fencing token (where there is one) as the
    // database's safety net.
    let token_json = |t: FencingToken| json!({ "epoch": t.epoch, "seq": t.seq });
    match st.write_reservation(sku, req.qty, token).await {
        Ok(WriteOutcome::Reserved { remaining }) => Json(json!({
            "sku": sku,
            "reserved": req.qty,
            "remaining": remaining,
            // null in the plain mode: a plain lock has no fencing token.
            "fencing_token": token.map(token_json),
            "instance": &*st.instance,
        }))
        .into_response(),
        Ok(WriteOutcome::OutOfStock { available }) => out_of_stock(sku, req.qty, available),
        Ok(WriteOutcome::Stale { current }) => {
            let mut res = error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({
                    "error": "stale_fencing_token",
                    "message": "the database accepted a newer lock holder's write; \
                                this lock was lost, nothing was written; retry",
                    "sku": sku,
                    "fencing_token": token.map(token_json),
                    "current": token_json(current),
                }),
            );
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            res
        }
        Ok(WriteOutcome::NotFound) => not_found(sku),
        Err(e) => e.into_response(),
    }
}

/// The row `query` (one `?`, bound to `sku`) returns, or the response to answer:
/// 404 `not_found` without a row, 500 on a database error.
pub(crate) async fn read_row<T>(
    db: &SqlitePool,
    query: &'static str,
    sku: &str,
) -> Result<T, Response>
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
pub(crate) fn not_found(sku: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        json!({ "error": "not_found", "sku": sku }),
    )
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
