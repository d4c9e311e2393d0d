//! The fence-column pattern through sqlx: a row carries the last token that wrote
//! it in two `BIGINT` columns, and every write is guarded by them.
//!
//! # Schema
//!
//! Add two columns to the table whose rows you fence (new rows start at token
//! `0.0`, older than every real token), and make the key column unique (it
//! already is if it is the primary key; `ON CONFLICT` needs it):
//!
//! ```sql
//! ALTER TABLE stock ADD COLUMN fence_epoch BIGINT NOT NULL DEFAULT 0;
//! ALTER TABLE stock ADD COLUMN fence_seq BIGINT NOT NULL DEFAULT 0;
//! ```
//!
//! ([`FenceColumns::migration`] prints exactly these statements for your names;
//! they run on PostgreSQL and SQLite alike.)
//!
//! # Statements
//!
//! [`FencedUpdate`] runs
//!
//! ```sql
//! UPDATE stock SET <your SET>, fence_epoch = $e, fence_seq = $s
//!  WHERE sku = $k AND (fence_epoch, fence_seq) <= ($e, $s) [AND <your condition>]
//! ```
//!
//! and [`FencedUpsert`]
//!
//! ```sql
//! INSERT INTO stock AS lockflight_row (sku, <your columns>, fence_epoch, fence_seq)
//! VALUES ($k, <your values>, $e, $s)
//! ON CONFLICT (sku) DO UPDATE SET <your SET, or every column = excluded.column>,
//!   fence_epoch = excluded.fence_epoch, fence_seq = excluded.fence_seq
//!  WHERE (lockflight_row.fence_epoch, lockflight_row.fence_seq) <= (excluded.fence_epoch, excluded.fence_seq)
//! ```
//!
//! When the statement changes no row, one `SELECT` of the fence columns tells a
//! stale token ([`Fenced::Stale`], the row's token is newer) from a row that is
//! missing or failed your own condition (`Fenced::Applied(0)` / `Applied(None)`:
//! not stale, nothing written). The row lock the `UPDATE` takes (PostgreSQL
//! re-evaluates the guard on the newest row version; SQLite serializes writers)
//! makes the check and the write one step; run both in the transaction of your
//! other writes to make them part of it.
//!
//! Which statements are safe to repeat after a lost reply: [`FencedUpdate`]'s
//! "Repeating a statement".

use std::marker::PhantomData;

use sqlx::{Database, Encode, QueryBuilder, Type};

use super::Fenced;
use crate::error::{Error, Result};
use crate::guard::FencingToken;

/// Where a table keeps its rows' fence: the table, its unique key column and the
/// two fence columns (`fence_epoch`, `fence_seq` unless renamed).
///
/// Names are plain SQL identifiers (`[A-Za-z_][A-Za-z0-9_]*`, the table optionally
/// `schema.table`): they are written into the statements unquoted, so anything
/// else is refused rather than escaped.
///
/// ```
/// use lockflight::fence::FenceColumns;
///
/// let columns = FenceColumns::new("items", "sku")?;
/// assert_eq!(columns.migration(), [
///     "ALTER TABLE items ADD COLUMN fence_epoch BIGINT NOT NULL DEFAULT 0",
///     "ALTER TABLE items ADD COLUMN fence_seq BIGINT NOT NULL DEFAULT 0",
/// ]);
/// assert!(FenceColumns::new("items; DROP TABLE items", "sku").is_err());
/// # Ok::<(), lockflight::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FenceColumns {
    table: String,
    key: String,
    epoch: String,
    seq: String,
    once: bool,
}

impl FenceColumns {
    /// The fence of `table`'s rows, found by the unique column `key_column`, in
    /// the columns `fence_epoch` and `fence_seq`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the bad identifier.
    pub fn new(table: &str, key_column: &str) -> Result<FenceColumns> {
        identifier(table, "table", true)?;
        identifier(key_column, "key column", false)?;
        Ok(FenceColumns {
            table: table.to_owned(),
            key: key_column.to_owned(),
            epoch: "fence_epoch".to_owned(),
            seq: "fence_seq".to_owned(),
            once: false,
        })
    }

    /// Other names for the two fence columns.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the bad identifier.
    pub fn with_fence_columns(mut self, epoch: &str, seq: &str) -> Result<FenceColumns> {
        identifier(epoch, "epoch column", false)?;
        identifier(seq, "seq column", false)?;
        self.epoch = epoch.to_owned();
        self.seq = seq.to_owned();
        Ok(self)
    }

    /// Allows each token one write per row: a write whose token *equals* the
    /// row's last one is [`Fenced::Stale`] too (guard `<` instead of `<=`), with
    /// `last == offered`. For a resource where a replayed write must not apply
    /// twice (each critical section writes the row at most once, as the inventory
    /// example's reservations): a write computed from the row is then safe to
    /// repeat after a lost reply, since the repeat of an applied write is refused
    /// with that answer (see [`FencedUpdate`]'s "Repeating a statement").
    pub fn one_write_per_token(mut self) -> FenceColumns {
        self.once = true;
        self
    }

    fn guard(&self) -> &'static str {
        if self.once { "<" } else { "<=" }
    }

    /// The statements that add the fence columns to an existing table (for
    /// PostgreSQL and SQLite; run each once, e.g. in a migration).
    pub fn migration(&self) -> [String; 2] {
        let FenceColumns {
            table, epoch, seq, ..
        } = self;
        [
            format!("ALTER TABLE {table} ADD COLUMN {epoch} BIGINT NOT NULL DEFAULT 0"),
            format!("ALTER TABLE {table} ADD COLUMN {seq} BIGINT NOT NULL DEFAULT 0"),
        ]
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

fn identifier(name: &str, what: &str, qualified: bool) -> Result<()> {
    let part = |p: &str| {
        let mut chars = p.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let ok = match name.split_once('.') {
        Some((schema, table)) if qualified => part(schema) && part(table),
        Some(_) => false,
        None => part(name),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidConfig {
            reason: format!(
                "fenced SQL: the {what} {name:?} is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*{})",
                if qualified {
                    ", optionally schema.table"
                } else {
                    ""
                }
            ),
        })
    }
}

/// A token's two numbers as the `BIGINT`s they are stored as. Epochs are server
/// time in µs (about 2^51 today) and sequences count handoffs: both fit; a value
/// that did not would be refused, never wrapped.
fn bigints(token: FencingToken) -> std::result::Result<(i64, i64), sqlx::Error> {
    match (i64::try_from(token.epoch), i64::try_from(token.seq)) {
        (Ok(e), Ok(s)) => Ok((e, s)),
        _ => Err(sqlx::Error::Protocol(format!(
            "fencing token {token} does not fit two BIGINT columns"
        ))),
    }
}

/// Something that pushes SQL text and binds onto a query.
type Push<'a, DB> = Box<dyn FnOnce(&mut QueryBuilder<DB>) + Send + 'a>;
/// Pushes the key's bind (called once per statement).
type PushKey<'a, DB> = Box<dyn Fn(&mut QueryBuilder<DB>) + Send + Sync + 'a>;

fn key_pusher<'a, DB, K>(key: K) -> PushKey<'a, DB>
where
    DB: Database,
    K: for<'q> Encode<'q, DB> + Type<DB> + Clone + Send + Sync + 'a,
{
    Box::new(move |q| {
        q.push_bind(key.clone());
    })
}

/// A guarded `UPDATE` of one row: applied only if the row's fence is not newer
/// than the token, and then the row records the token. See the
/// [module docs](crate::fence) for the rule and [`FenceColumns`] for the schema.
///
/// `execute` and `fetch_optional` run it on a PostgreSQL connection (feature
/// `sqlx-postgres`) or a SQLite connection (feature `sqlx-sqlite`).
///
/// ```
/// # #[cfg(feature = "sqlx-sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use lockflight::FencingToken;
/// use lockflight::fence::{FenceColumns, Fenced, FencedUpdate};
/// use sqlx::Connection;
///
/// let mut db = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
/// sqlx::query("CREATE TABLE stock (sku TEXT PRIMARY KEY, qty BIGINT NOT NULL)")
///     .execute(&mut db).await?;
/// let columns = FenceColumns::new("stock", "sku")?;
/// for statement in columns.migration() {
///     sqlx::query(sqlx::AssertSqlSafe(statement)).execute(&mut db).await?;
/// }
/// sqlx::query("INSERT INTO stock (sku, qty) VALUES ('a', 10)").execute(&mut db).await?;
///
/// let (old, new) = (FencingToken::new(7, 0), FencingToken::new(8, 0));
/// let take = |token, n: i64| {
///     FencedUpdate::new(&columns, token, "a").set(move |q| {
///         q.push("qty = qty - ").push_bind(n);
///     })
/// };
/// assert_eq!(take(new, 1).execute(&mut db).await?, Fenced::Applied(1));
/// assert_eq!(
///     take(old, 5).execute(&mut db).await?,
///     Fenced::Stale { last: new, offered: old }
/// );
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlx-sqlite"))]
/// # fn main() {}
/// ```
///
/// # Repeating a statement
///
/// A statement whose reply was lost (the connection dropped before the answer to it, or
/// to its transaction's `COMMIT`) may or may not have been applied. Repeated with the
/// same token, an **absolute** write (one that does not read the row: a `set` such as
/// `qty = 5`, an upsert that copies its values) writes the same row again: safe. A write
/// **computed from the row** (`qty = qty - 1`, an `update_set` such as
/// `qty = lockflight_row.qty + excluded.qty`) applies again under the default guard `<=`:
/// fence such rows with [`FenceColumns::one_write_per_token`] (guard `<`), which refuses
/// the repeat of an applied write as [`Fenced::Stale`] with `last == offered`, nothing
/// written, and applies the repeat of one that was not; exact while each critical
/// section writes the row at most once. The same holds for [`FencedUpsert`].
#[must_use = "a statement does nothing until executed"]
pub struct FencedUpdate<'a, DB: Database> {
    columns: &'a FenceColumns,
    token: FencingToken,
    key: PushKey<'a, DB>,
    set: Option<Push<'a, DB>>,
    condition: Option<Push<'a, DB>>,
    _db: PhantomData<fn() -> DB>,
}

impl<'a, DB: Database> FencedUpdate<'a, DB> {
    /// An `UPDATE` of the row whose key column equals `key`, under `token` (a
    /// [`FencingToken`], or a reference to a guard or a [`LockInfo`](crate::guard::LockInfo)).
    /// Without [`set`](Self::set) it only records the token.
    pub fn new<K>(columns: &'a FenceColumns, token: impl Into<FencingToken>, key: K) -> Self
    where
        K: for<'q> Encode<'q, DB> + Type<DB> + Clone + Send + Sync + 'a,
    {
        FencedUpdate {
            columns,
            token: token.into(),
            key: key_pusher(key),
            set: None,
            condition: None,
            _db: PhantomData,
        }
    }

    /// Your `SET` assignments, pushed as SQL text and binds (`qty = qty - ` and a
    /// bind); the fence assignments follow them.
    pub fn set(mut self, set: impl FnOnce(&mut QueryBuilder<DB>) + Send + 'a) -> Self {
        self.set = Some(Box::new(set));
        self
    }

    /// A condition of your own, `AND`ed to the guard (`qty >= ` and a bind). When it
    /// fails the outcome is `Applied` with no row changed.
    pub fn and_where(mut self, condition: impl FnOnce(&mut QueryBuilder<DB>) + Send + 'a) -> Self {
        self.condition = Some(Box::new(condition));
        self
    }

    fn statement(
        self,
        returning: Option<&str>,
    ) -> std::result::Result<Statement<'a, DB>, sqlx::Error>
    where
        DB::Arguments: Default,
        i64: for<'q> Encode<'q, DB> + Type<DB>,
    {
        let (e, s) = bigints(self.token)?;
        let FenceColumns {
            table,
            key,
            epoch,
            seq,
            ..
        } = self.columns;
        let guard = self.columns.guard();
        let mut q = QueryBuilder::<DB>::new(format!("UPDATE {table} SET "));
        if let Some(set) = self.set {
            set(&mut q);
            q.push(", ");
        }
        q.push(format!("{epoch} = ")).push_bind(e);
        q.push(format!(", {seq} = ")).push_bind(s);
        q.push(format!(" WHERE {key} = "));
        (self.key)(&mut q);
        q.push(format!(" AND ({epoch}, {seq}) {guard} ("))
            .push_bind(e)
            .push(", ")
            .push_bind(s)
            .push(")");
        if let Some(condition) = self.condition {
            q.push(" AND (");
            condition(&mut q);
            q.push(")");
        }
        if let Some(returning) = returning {
            q.push(" RETURNING ").push(returning);
        }
        Ok(Statement {
            query: q,
            columns: self.columns,
            token: self.token,
            key: self.key,
        })
    }
}

/// A guarded `INSERT … ON CONFLICT DO UPDATE` of one row: inserted if the key is
/// new, updated only if the existing row's fence is not newer than the token; either
/// way the row then records the token. See [`FenceColumns`] for the schema.
///
/// ```
/// # #[cfg(feature = "sqlx-sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use lockflight::FencingToken;
/// use lockflight::fence::{FenceColumns, Fenced, FencedUpsert};
/// use sqlx::Connection;
///
/// let mut db = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
/// sqlx::query(
///     "CREATE TABLE prices (sku TEXT PRIMARY KEY, cents BIGINT NOT NULL,
///      fence_epoch BIGINT NOT NULL DEFAULT 0, fence_seq BIGINT NOT NULL DEFAULT 0)",
/// )
/// .execute(&mut db)
/// .await?;
/// let columns = FenceColumns::new("prices", "sku")?;
/// let (old, new) = (FencingToken::new(7, 0), FencingToken::new(8, 0));
/// let put = |token, cents: i64| FencedUpsert::new(&columns, token, "a").value("cents", cents);
///
/// assert_eq!(put(new, 100)?.execute(&mut db).await?, Fenced::Applied(1));
/// assert!(!put(old, 1)?.execute(&mut db).await?.is_applied());
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlx-sqlite"))]
/// # fn main() {}
/// ```
#[must_use = "a statement does nothing until executed"]
pub struct FencedUpsert<'a, DB: Database> {
    columns: &'a FenceColumns,
    token: FencingToken,
    key: PushKey<'a, DB>,
    values: Vec<(String, Push<'a, DB>)>,
    update_set: Option<Push<'a, DB>>,
}

impl<'a, DB: Database> FencedUpsert<'a, DB> {
    /// An upsert of the row whose key column equals `key`, under `token`.
    pub fn new<K>(columns: &'a FenceColumns, token: impl Into<FencingToken>, key: K) -> Self
    where
        K: for<'q> Encode<'q, DB> + Type<DB> + Clone + Send + Sync + 'a,
    {
        FencedUpsert {
            columns,
            token: token.into(),
            key: key_pusher(key),
            values: Vec::new(),
            update_set: None,
        }
    }

    /// A column of the inserted row and its value; unless
    /// [`update_set`](Self::update_set) says otherwise, the update on conflict
    /// sets it to the same value (`column = excluded.column`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `column` is not a plain identifier.
    pub fn value<V>(mut self, column: &str, value: V) -> Result<Self>
    where
        V: for<'q> Encode<'q, DB> + Type<DB> + Send + 'a,
    {
        identifier(column, "column", false)?;
        self.values.push((
            column.to_owned(),
            Box::new(move |q| {
                q.push_bind(value);
            }),
        ));
        Ok(self)
    }

    /// The assignments of the update on conflict instead of copying every value
    /// (the existing row is `lockflight_row`, the proposed one `excluded`:
    /// `qty = lockflight_row.qty + excluded.qty`); the fence assignments follow.
    pub fn update_set(mut self, set: impl FnOnce(&mut QueryBuilder<DB>) + Send + 'a) -> Self {
        self.update_set = Some(Box::new(set));
        self
    }

    fn statement(
        self,
        returning: Option<&str>,
    ) -> std::result::Result<Statement<'a, DB>, sqlx::Error>
    where
        DB::Arguments: Default,
        i64: for<'q> Encode<'q, DB> + Type<DB>,
    {
        let (e, s) = bigints(self.token)?;
        let FenceColumns {
            table,
            key,
            epoch,
            seq,
            ..
        } = self.columns;
        let guard = self.columns.guard();
        let names: Vec<String> = self.values.iter().map(|(c, _)| c.clone()).collect();
        let mut q =
            QueryBuilder::<DB>::new(format!("INSERT INTO {table} AS lockflight_row ({key}, "));
        for name in &names {
            q.push(format!("{name}, "));
        }
        q.push(format!("{epoch}, {seq}) VALUES ("));
        (self.key)(&mut q);
        for (_, value) in self.values {
            q.push(", ");
            value(&mut q);
        }
        q.push(", ").push_bind(e).push(", ").push_bind(s);
        q.push(format!(") ON CONFLICT ({key}) DO UPDATE SET "));
        match self.update_set {
            Some(set) => {
                set(&mut q);
                q.push(", ");
            }
            None => {
                for name in &names {
                    q.push(format!("{name} = excluded.{name}, "));
                }
            }
        }
        q.push(format!(
            "{epoch} = excluded.{epoch}, {seq} = excluded.{seq} \
             WHERE (lockflight_row.{epoch}, lockflight_row.{seq}) {guard} (excluded.{epoch}, excluded.{seq})"
        ));
        if let Some(returning) = returning {
            q.push(" RETURNING ").push(returning);
        }
        Ok(Statement {
            query: q,
            columns: self.columns,
            token: self.token,
            key: self.key,
        })
    }
}

/// A built guarded statement, and what reading the fence back needs.
struct Statement<'a, DB: Database> {
    query: QueryBuilder<DB>,
    columns: &'a FenceColumns,
    token: FencingToken,
    key: PushKey<'a, DB>,
}

impl<DB: Database> Statement<'_, DB> {
    /// Runs the statement on `conn`: applied with the rows changed, or (no row
    /// changed) what the row's fence says.
    async fn execute<C>(mut self, conn: &mut C) -> std::result::Result<Fenced<u64>, sqlx::Error>
    where
        C: FenceConnection<Database = DB>,
        DB::Arguments: Default,
        i64: for<'q> Encode<'q, DB> + Type<DB>,
    {
        let changed = conn.run(&mut self.query).await?;
        if changed > 0 {
            return Ok(Fenced::Applied(changed));
        }
        let last = conn.fence(&mut self.select_fence()).await?;
        Ok(self.outcome(last, 0))
    }

    /// The `SELECT` of the row's fence.
    fn select_fence(&self) -> QueryBuilder<DB>
    where
        DB::Arguments: Default,
    {
        let FenceColumns {
            table,
            key,
            epoch,
            seq,
            ..
        } = self.columns;
        let mut q =
            QueryBuilder::<DB>::new(format!("SELECT {epoch}, {seq} FROM {table} WHERE {key} = "));
        (self.key)(&mut q);
        q
    }

    /// What a statement that changed no row means: [`Fenced::Stale`] when the row
    /// carries a newer token, else `not_stale` (the row is missing or failed the
    /// caller's condition).
    fn outcome<T>(&self, last: Option<(i64, i64)>, not_stale: T) -> Fenced<T> {
        match last {
            Some((e, s)) => {
                let last =
                    FencingToken::new(u64::try_from(e).unwrap_or(0), u64::try_from(s).unwrap_or(0));
                if last > self.token || (self.columns.once && last == self.token) {
                    Fenced::Stale {
                        last,
                        offered: self.token,
                    }
                } else {
                    Fenced::Applied(not_stale)
                }
            }
            None => Fenced::Applied(not_stale),
        }
    }
}

impl<DB: Database> FencedUpdate<'_, DB>
where
    DB::Arguments: Default,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    /// Runs the guarded `UPDATE` on `conn`: a PostgreSQL or SQLite connection, a
    /// transaction of one (`&mut tx`: then it is part of the transaction), or a
    /// pooled connection. Applied, it carries the number of rows changed (0 when
    /// the row is missing or your condition failed).
    ///
    /// # Errors
    ///
    /// The database's error, as sqlx reports it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the statement applied or not, as any sqlx
    /// query; inside a transaction that is then rolled back, nothing stays.
    pub async fn execute<C>(self, conn: &mut C) -> std::result::Result<Fenced<u64>, sqlx::Error>
    where
        C: FenceConnection<Database = DB>,
    {
        self.statement(None)?.execute(conn).await
    }

    /// Runs the guarded `UPDATE … RETURNING returning` (SQL text, e.g. `"qty"`);
    /// applied, it carries the returned row, `None` when no row matched (missing,
    /// or your condition failed).
    ///
    /// # Errors
    ///
    /// The database's error, as sqlx reports it.
    ///
    /// # Cancel safety
    ///
    /// As [`execute`](Self::execute).
    pub async fn fetch_optional<O>(
        self,
        conn: &mut impl FenceConnection<Database = DB>,
        returning: &str,
    ) -> std::result::Result<Fenced<Option<O>>, sqlx::Error>
    where
        O: for<'r> sqlx::FromRow<'r, DB::Row> + Send + Unpin,
    {
        let mut statement = self.statement(Some(returning))?;
        let row = conn.fetch::<O>(&mut statement.query).await?;
        if row.is_some() {
            return Ok(Fenced::Applied(row));
        }
        let last = conn.fence(&mut statement.select_fence()).await?;
        Ok(statement.outcome(last, None))
    }
}

impl<DB: Database> FencedUpsert<'_, DB>
where
    DB::Arguments: Default,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    /// Runs the guarded upsert on `conn` (as [`FencedUpdate::execute`]); applied,
    /// it carries the number of rows written (1).
    ///
    /// # Errors
    ///
    /// The database's error, as sqlx reports it.
    ///
    /// # Cancel safety
    ///
    /// As [`FencedUpdate::execute`].
    pub async fn execute<C>(self, conn: &mut C) -> std::result::Result<Fenced<u64>, sqlx::Error>
    where
        C: FenceConnection<Database = DB>,
    {
        self.statement(None)?.execute(conn).await
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A connection that fenced statements run on: a `PgConnection` (feature
/// `sqlx-postgres`) or `SqliteConnection` (feature `sqlx-sqlite`), a
/// `Transaction` or a `PoolConnection` of either. Sealed: the statements are
/// written for these two databases.
pub trait FenceConnection: Send + sealed::Sealed {
    /// The database.
    type Database: Database;

    #[doc(hidden)]
    fn run<'c>(
        &'c mut self,
        query: &'c mut QueryBuilder<Self::Database>,
    ) -> BoxFuture<'c, std::result::Result<u64, sqlx::Error>>;

    #[doc(hidden)]
    fn fetch<'c, O>(
        &'c mut self,
        query: &'c mut QueryBuilder<Self::Database>,
    ) -> BoxFuture<'c, std::result::Result<Option<O>, sqlx::Error>>
    where
        O: for<'r> sqlx::FromRow<'r, <Self::Database as Database>::Row> + Send + Unpin + 'c;

    #[doc(hidden)]
    fn fence<'c>(
        &'c mut self,
        query: &'c mut QueryBuilder<Self::Database>,
    ) -> BoxFuture<'c, std::result::Result<Option<(i64, i64)>, sqlx::Error>>;
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// [`FenceConnection`] for one connection type of one database (`$conn` derefs to
/// the database's connection through `$deref`).
macro_rules! fence_connection {
    ($db:ty, [$($generics:tt)*] $conn:ty, |$c:ident| $deref:expr) => {
        impl<$($generics)*> sealed::Sealed for $conn {}

        impl<$($generics)*> FenceConnection for $conn {
            type Database = $db;

            fn run<'c>(
                &'c mut self,
                query: &'c mut QueryBuilder<$db>,
            ) -> BoxFuture<'c, std::result::Result<u64, sqlx::Error>> {
                Box::pin(async move {
                    let $c = self;
                    let done = query.build().execute($deref).await?;
                    Ok(done.rows_affected())
                })
            }

            fn fetch<'c, O>(
                &'c mut self,
                query: &'c mut QueryBuilder<$db>,
            ) -> BoxFuture<'c, std::result::Result<Option<O>, sqlx::Error>>
            where
                O: for<'r> sqlx::FromRow<'r, <$db as Database>::Row> + Send + Unpin + 'c,
            {
                Box::pin(async move {
                    let $c = self;
                    query.build_query_as::<O>().fetch_optional($deref).await
                })
            }

            fn fence<'c>(
                &'c mut self,
                query: &'c mut QueryBuilder<$db>,
            ) -> BoxFuture<'c, std::result::Result<Option<(i64, i64)>, sqlx::Error>> {
                Box::pin(async move {
                    let $c = self;
                    query
                        .build_query_as::<(i64, i64)>()
                        .fetch_optional($deref)
                        .await
                })
            }
        }
    };
}

#[cfg(feature = "sqlx-postgres")]
fence_connection!(sqlx::Postgres, [] sqlx::PgConnection, |c| c);
#[cfg(feature = "sqlx-postgres")]
fence_connection!(sqlx::Postgres, ['t] sqlx::Transaction<'t, sqlx::Postgres>, |c| &mut **c);
#[cfg(feature = "sqlx-postgres")]
fence_connection!(sqlx::Postgres, [] sqlx::pool::PoolConnection<sqlx::Postgres>, |c| &mut **c);
#[cfg(feature = "sqlx-sqlite")]
fence_connection!(sqlx::Sqlite, [] sqlx::SqliteConnection, |c| c);
#[cfg(feature = "sqlx-sqlite")]
fence_connection!(sqlx::Sqlite, ['t] sqlx::Transaction<'t, sqlx::Sqlite>, |c| &mut **c);
#[cfg(feature = "sqlx-sqlite")]
fence_connection!(sqlx::Sqlite, [] sqlx::pool::PoolConnection<sqlx::Sqlite>, |c| &mut **c);
