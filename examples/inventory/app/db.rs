//! The inventory's database: the schema (items, the reservation log and its
//! trigger, restocks, the leader-only job's tables), opening it, and the reservation's write — fenced by a
//! lockflight fencing token, or unfenced under the plain mode's lock, which has
//! none.

use std::path::Path;
use std::time::Duration;

use lockflight::FencingToken;
use lockflight::fence::{FenceColumns, Fenced, FencedUpdate};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteSynchronous};

use super::AppError;

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
    fence_seq   INTEGER NOT NULL,
    -- When it was made (Unix ms, this machine's clock): the leader-only job
    -- (job.rs) releases it once it is older than the hold period.
    reserved_at_ms INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
);
CREATE INDEX IF NOT EXISTS reservations_by_sku ON reservations (sku);
CREATE INDEX IF NOT EXISTS reservations_by_age ON reservations (reserved_at_ms);
-- Restocks, each under the SKU's write lock (POST /items/{sku}/restock).
CREATE TABLE IF NOT EXISTS restocks (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    sku         TEXT NOT NULL REFERENCES items (sku),
    qty         INTEGER NOT NULL,
    fence_epoch INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS reservations_by_token ON reservations (fence_epoch, fence_seq);
-- The leader-only job (job.rs). Its row, fenced by the leader's term (the
-- election's fencing token): every sweep writes it first, in the sweep's
-- transaction, so a leader whose term is older than the last sweep's is refused.
CREATE TABLE IF NOT EXISTS jobs (
    name        TEXT PRIMARY KEY NOT NULL,
    leader      TEXT NOT NULL,
    sweeps      INTEGER NOT NULL,
    released    INTEGER NOT NULL,
    swept_at_ms INTEGER NOT NULL,
    fence_epoch INTEGER NOT NULL DEFAULT 0,
    fence_seq   INTEGER NOT NULL DEFAULT 0
);
-- Every sweep applied, with the term and leader that made it.
CREATE TABLE IF NOT EXISTS job_sweeps (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job         TEXT NOT NULL REFERENCES jobs (name),
    leader      TEXT NOT NULL,
    released    INTEGER NOT NULL,
    swept_at_ms INTEGER NOT NULL,
    fence_epoch INTEGER NOT NULL,
    fence_seq   INTEGER NOT NULL
);
-- Reservations the job released (their units went back to stock): each once.
CREATE TABLE IF NOT EXISTS released_reservations (
    reservation_id INTEGER PRIMARY KEY NOT NULL REFERENCES reservations (id),
    sku            TEXT NOT NULL,
    qty            INTEGER NOT NULL,
    released_at_ms INTEGER NOT NULL,
    fence_epoch    INTEGER NOT NULL,
    fence_seq      INTEGER NOT NULL
);
-- Every accepted decrement is logged by the same statement that makes it.
CREATE TRIGGER IF NOT EXISTS log_reservation
AFTER UPDATE OF stock ON items
WHEN NEW.stock < OLD.stock
BEGIN
    INSERT INTO reservations (sku, qty, remaining, fence_epoch, fence_seq)
    VALUES (NEW.sku, OLD.stock - NEW.stock, NEW.stock, NEW.fence_epoch, NEW.fence_seq);
END;
";

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
pub async fn open_db(path: Option<&Path>) -> Result<SqlitePool, sqlx::Error> {
    let pool = match path {
        Some(path) => {
            // No `journal_mode` here: switching a new file to WAL takes a lock that
            // SQLite does not wait for (`busy_timeout` does not apply), so
            // instances starting together on a new file would fail with "database
            // is locked". `into_wal` switches it with retries instead.
            let options = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await?;
            into_wal(&pool).await?;
            pool
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

/// Switches the database file to WAL mode (a no-op once it is), retrying while
/// another instance holds the lock the switch needs: at most 200 attempts, 5 to
/// 50 ms apart (about 10 s, the `busy_timeout`).
async fn into_wal(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    let mut pause = Duration::from_millis(5);
    for attempt in 1.. {
        match sqlx::query_scalar::<_, String>("PRAGMA journal_mode = WAL")
            .fetch_one(pool)
            .await
        {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(sqlx::Error::Protocol(format!(
                    "the database stays in journal mode {mode}, not WAL"
                )));
            }
            Err(e) if attempt < 200 && is_busy(&e) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns by its 200th attempt")
}

/// Whether `e` is SQLite's "database is locked" (`SQLITE_BUSY`, code 5).
fn is_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("5"))
}

/// What the database made of a fenced reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
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

/// Where the items keep their fence: `fence_epoch`, `fence_seq`, one write per
/// token (a replayed reservation must not apply twice).
pub fn item_fence_columns() -> Result<FenceColumns, AppError> {
    FenceColumns::new("items", "sku")
        .map(FenceColumns::one_write_per_token)
        .map_err(|e| AppError::Internal(e.to_string()))
}

/// Decrements `sku`'s stock by `qty`, only if `token` is newer than the item's last
/// accepted token and enough stock is left: one statement built by lockflight's
/// fence helper ([`FencedUpdate`]), which also logs the reservation (trigger
/// `log_reservation`), so SQLite's write lock is held for one statement only.
///
/// A stale token is told by the helper; any other refusal is explained from the
/// row as read right after it.
pub async fn fenced_write(
    db: &SqlitePool,
    sku: &str,
    qty: i64,
    token: FencingToken,
) -> Result<WriteOutcome, AppError> {
    let columns = item_fence_columns()?;
    // The pool has one connection: give it back before `explain` reads.
    let mut conn = db.acquire().await?;
    let outcome = FencedUpdate::new(&columns, token, sku)
        .set(move |q| {
            q.push("stock = stock - ").push_bind(qty);
        })
        .and_where(move |q| {
            q.push("stock >= ").push_bind(qty);
        })
        .fetch_optional::<(i64,)>(&mut conn, "stock")
        .await?;
    drop(conn);
    match outcome {
        Fenced::Applied(remaining) => explain(db, sku, remaining.map(|(r,)| r), None).await,
        Fenced::Stale { last, .. } => Ok(WriteOutcome::Stale { current: last }),
    }
}

/// The decrement of the plain mode: no fence (a plain lock has no token, so the
/// database cannot tell a stale holder; only the lock protects the stock), and
/// only while enough stock is left. Binds: qty, sku, qty.
const UNFENCED_DECREMENT: &str =
    "UPDATE items SET stock = stock - ? WHERE sku = ? AND stock >= ? RETURNING stock";

/// Decrements `sku`'s stock by `qty` if enough is left, without a fencing check:
/// the write of the plain mode. Logged like [`fenced_write`]'s (with the item's
/// unchanged fence columns).
pub async fn unfenced_write(
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
            current: FencingToken::new(from_sql(fe), from_sql(fs)),
        },
        (Some((stock, ..)), _) => WriteOutcome::OutOfStock { available: stock },
    })
}

/// A fencing value as SQLite's integer (an error past `i64::MAX`).
pub fn to_sql(v: u64) -> Result<i64, AppError> {
    i64::try_from(v).map_err(|_| AppError::Internal(format!("fencing value {v} exceeds i64")))
}

fn from_sql(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The last accepted fencing token of `sku`, if the item exists.
pub async fn item_fence(db: &SqlitePool, sku: &str) -> Result<Option<FencingToken>, sqlx::Error> {
    let row: Option<(i64, i64)> =
        sqlx::query_as("SELECT fence_epoch, fence_seq FROM items WHERE sku = ?")
            .bind(sku)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|(e, s)| FencingToken::new(from_sql(e), from_sql(s))))
}

/// Reservations logged with exactly this fencing token.
pub async fn reservations_with_token(
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
pub async fn reservation_log(db: &SqlitePool, sku: &str) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as("SELECT count(*), coalesce(sum(qty), 0) FROM reservations WHERE sku = ?")
        .bind(sku)
        .fetch_one(db)
        .await
}
