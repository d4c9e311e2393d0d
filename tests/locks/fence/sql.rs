//! `FencedUpdate` and `FencedUpsert` on a real PostgreSQL (started by the test) and
//! on a SQLite file, with the tokens of a paused holder and its successor.

use lockflight::FencingToken;
use lockflight::fence::{FenceColumns, Fenced};
use testkit::{shared, unique_prefix};

use super::{paused_then_successor, stale};

/// The tokens of a paused holder A and its successor B (both leases released).
async fn tokens(name: &str) -> (FencingToken, FencingToken) {
    let prefix = unique_prefix(name);
    let (a, b, proxy) = paused_then_successor(shared(), &prefix, "row").await;
    let tokens = (a.fencing_token(), b.fencing_token());
    proxy.blackhole(false);
    let _ = a.release().await;
    b.release().await.expect("B releases");
    tokens
}

/// A table name of this test alone.
fn table(name: &str) -> String {
    unique_prefix(name).replace(['-', ':'], "_")
}

#[cfg(feature = "sqlx-postgres")]
mod postgres {
    use lockflight::fence::{FencedUpdate, FencedUpsert};
    use sqlx::{AssertSqlSafe, Connection, PgConnection};
    use testkit::shared_postgres;

    use super::*;

    async fn connect() -> PgConnection {
        PgConnection::connect(&shared_postgres().url())
            .await
            .expect("connect to the test's PostgreSQL")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_holders_late_update_is_stale_and_the_successors_lands() {
        let (ta, tb) = tokens("pg-update").await;
        let mut db = connect().await;
        let t = table("pg_update");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {t} (sku TEXT PRIMARY KEY, qty BIGINT NOT NULL)"
        )))
        .execute(&mut db)
        .await
        .unwrap();
        let columns = FenceColumns::new(&t, "sku").unwrap();
        for statement in columns.migration() {
            sqlx::query(AssertSqlSafe(statement))
                .execute(&mut db)
                .await
                .unwrap();
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (sku, qty) VALUES ('a', 10)"
        )))
        .execute(&mut db)
        .await
        .unwrap();
        let take = |token: FencingToken, n: i64| {
            FencedUpdate::new(&columns, token, "a")
                .set(move |q| {
                    q.push("qty = qty - ").push_bind(n);
                })
                .and_where(move |q| {
                    q.push("qty >= ").push_bind(n);
                })
        };

        // B lands, returning the new quantity.
        let left = take(tb, 3)
            .fetch_optional::<(i64,)>(&mut db, "qty")
            .await
            .unwrap();
        assert_eq!(left, Fenced::Applied(Some((7,))));
        // A, late: stale, nothing changed.
        assert_eq!(
            take(ta, 1).execute(&mut db).await.unwrap(),
            stale(ta, tb).map(|()| 0)
        );
        // B again (same critical section), failing its own condition: not stale, no row.
        assert_eq!(
            take(tb, 100).execute(&mut db).await.unwrap(),
            Fenced::Applied(0)
        );
        // A missing row is not stale either.
        let missing = FencedUpdate::new(&columns, tb, "zz")
            .execute(&mut db)
            .await
            .unwrap();
        assert_eq!(missing, Fenced::Applied(0));
        let (qty, e, s): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT qty, fence_epoch, fence_seq FROM {t} WHERE sku = 'a'"
        )))
        .fetch_one(&mut db)
        .await
        .unwrap();
        assert_eq!((qty, e as u64, s as u64), (7, tb.epoch, tb.seq));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_holders_late_upsert_is_stale_inside_a_transaction() {
        let (ta, tb) = tokens("pg-upsert").await;
        let mut db = connect().await;
        let t = table("pg_upsert");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {t} (sku TEXT PRIMARY KEY, cents BIGINT NOT NULL, epoch BIGINT NOT NULL DEFAULT 0, seq BIGINT NOT NULL DEFAULT 0)"
        )))
        .execute(&mut db)
        .await
        .unwrap();
        let columns = FenceColumns::new(&t, "sku")
            .unwrap()
            .with_fence_columns("epoch", "seq")
            .unwrap();
        let put = |token: FencingToken, cents: i64| {
            FencedUpsert::new(&columns, token, "p".to_owned())
                .value("cents", cents)
                .unwrap()
        };
        // A's first write (before its pause) inserts the row.
        assert_eq!(
            put(ta, 100).execute(&mut db).await.unwrap(),
            Fenced::Applied(1)
        );
        let mut tx = db.begin().await.unwrap();
        assert_eq!(
            put(tb, 200).execute(&mut tx).await.unwrap(),
            Fenced::Applied(1)
        );
        tx.commit().await.unwrap();
        let mut tx = db.begin().await.unwrap();
        assert_eq!(
            put(ta, 300).execute(&mut tx).await.unwrap(),
            stale(ta, tb).map(|()| 0)
        );
        tx.rollback().await.unwrap();
        let cents: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT cents FROM {t} WHERE sku = 'p'"
        )))
        .fetch_one(&mut db)
        .await
        .unwrap();
        assert_eq!(cents, 200);
        // update_set: add instead of replace.
        let add = FencedUpsert::new(&columns, tb, "p")
            .value("cents", 5_i64)
            .unwrap()
            .update_set(|q| {
                q.push("cents = lockflight_row.cents + excluded.cents");
            });
        assert!(add.execute(&mut db).await.unwrap().is_applied());
        let cents: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT cents FROM {t} WHERE sku = 'p'"
        )))
        .fetch_one(&mut db)
        .await
        .unwrap();
        assert_eq!(cents, 205);
    }
}

#[cfg(feature = "sqlx-sqlite")]
mod sqlite {
    use lockflight::fence::{FencedUpdate, FencedUpsert};
    use sqlx::{AssertSqlSafe, Connection, SqliteConnection};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_holders_late_writes_to_a_sqlite_file_are_stale() {
        let (ta, tb) = tokens("sqlite").await;
        let path = std::env::temp_dir().join(format!("{}.db", table("lockflight_fence")));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let mut db = SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("CREATE TABLE items (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)")
            .execute(&mut db)
            .await
            .unwrap();
        let columns = FenceColumns::new("items", "sku").unwrap();
        for statement in columns.migration() {
            sqlx::query(AssertSqlSafe(statement))
                .execute(&mut db)
                .await
                .unwrap();
        }
        let put = |token: FencingToken, stock: i64| {
            FencedUpsert::new(&columns, token, "s")
                .value("stock", stock)
                .unwrap()
        };
        assert_eq!(
            put(tb, 10).execute(&mut db).await.unwrap(),
            Fenced::Applied(1)
        );
        assert_eq!(
            put(ta, 99).execute(&mut db).await.unwrap(),
            stale(ta, tb).map(|()| 0)
        );
        let take = |token: FencingToken| {
            FencedUpdate::new(&columns, token, "s").set(|q| {
                q.push("stock = stock - 1");
            })
        };
        assert_eq!(
            take(ta).execute(&mut db).await.unwrap(),
            stale(ta, tb).map(|()| 0)
        );
        let mut tx = db.begin().await.unwrap();
        assert_eq!(take(tb).execute(&mut tx).await.unwrap(), Fenced::Applied(1));
        tx.commit().await.unwrap();
        let stock: i64 = sqlx::query_scalar("SELECT stock FROM items WHERE sku = 's'")
            .fetch_one(&mut db)
            .await
            .unwrap();
        assert_eq!(stock, 9);
        // One write per token: the same token again is stale too, so a repeat of a
        // write computed from the row (its first attempt applied) subtracts nothing.
        let once = FenceColumns::new("items", "sku")
            .unwrap()
            .one_write_per_token();
        let again = FencedUpdate::new(&once, tb, "s").set(|q| {
            q.push("stock = stock - 1");
        });
        assert_eq!(
            again.execute(&mut db).await.unwrap(),
            stale(tb, tb).map(|()| 0)
        );
        let stock: i64 = sqlx::query_scalar("SELECT stock FROM items WHERE sku = 's'")
            .fetch_one(&mut db)
            .await
            .unwrap();
        assert_eq!(stock, 9);
        db.close().await.unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
