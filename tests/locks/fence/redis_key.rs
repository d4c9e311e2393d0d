//! `FencedKey` on one Redis server.

use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey, WriteId};
use lockflight::{Error, FencingToken, RedisBackend};
use testkit::{shared, unique_prefix};

use super::{locker, paused_then_successor, stale};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_set_is_stale_and_the_successors_lands() {
    let server = shared();
    let prefix = unique_prefix("fence-set");
    let (a, b, proxy) = paused_then_successor(server, &prefix, "sku:1").await;
    let (ta, tb) = (a.fencing_token(), b.fencing_token());
    let mut data = server.connection().await;
    let stock = FencedKey::new(format!("{prefix}:stock:1")).unwrap();

    assert_eq!(
        stock.set(&mut data, &b, "from B").await.unwrap(),
        Fenced::Applied(())
    );
    // A resumes and writes late: refused, nothing changed.
    assert_eq!(
        stock.set(&mut data, &a, "from A").await.unwrap(),
        stale(ta, tb)
    );
    assert_eq!(
        stock.incr_by(&mut data, &a, 1).await.unwrap(),
        stale(ta, tb).map(|()| 0)
    );
    assert_eq!(stock.delete(&mut data, &a).await.unwrap(), stale(ta, tb));
    let value: String = redis::cmd("GET")
        .arg(stock.name())
        .query_async(&mut data)
        .await
        .unwrap();
    assert_eq!(value, "from B");
    assert_eq!(stock.last_token(&mut data).await.unwrap(), Some(tb));
    // The same critical section may write again.
    assert!(
        stock
            .set(&mut data, &b, "again B")
            .await
            .unwrap()
            .is_applied()
    );

    proxy.blackhole(false);
    assert!(a.release().await.is_err(), "A's lease was lost");
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_guards_and_lock_infos_fence_too() {
    let server = shared();
    let prefix = unique_prefix("fence-kinds");
    let backend = RedisBackend::builder(server.url())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let locker = locker(backend);
    let mut data = server.connection().await;
    let doc = FencedKey::new(format!("{prefix}:doc")).unwrap();

    let first = locker.rwlock("doc").write().await.unwrap();
    let old = first.fencing_token();
    assert!(
        doc.hset(&mut data, &first, [("title", "one")])
            .await
            .unwrap()
            .is_applied()
    );
    first.release().await.unwrap();
    let second = locker.rwlock("doc").write().await.unwrap();
    assert!(
        doc.hset(&mut data, &second, [("title", "two")])
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(
        doc.hset(&mut data, old, [("title", "late")]).await.unwrap(),
        stale(old, second.fencing_token())
    );
    second.release().await.unwrap();

    let counter = FencedKey::new(format!("{prefix}:counter:{{eu}}")).unwrap();
    let mut conn = data.clone();
    let n = locker
        .with_lock("count", |info| async move {
            counter.incr_by(&mut conn, &info, 5).await
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, Fenced::Applied(5));
    let title: String = redis::cmd("HGET")
        .arg(doc.name())
        .arg("title")
        .query_async(&mut data)
        .await
        .unwrap();
    assert_eq!(title, "two");
}

#[tokio::test]
async fn foreign_values_and_bad_input_are_clear_errors_with_nothing_written() {
    let server = shared();
    let prefix = unique_prefix("fence-bad");
    let mut data = server.connection().await;
    let t = FencingToken::new(5, 0);

    let list = FencedKey::new(format!("{prefix}:list")).unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(list.name())
        .arg("x")
        .query_async(&mut data)
        .await
        .unwrap();
    let e = list.incr_by(&mut data, t, 1).await.unwrap_err();
    assert!(matches!(e, Error::ForeignValue { .. }), "{e}");
    assert!(e.to_string().contains(&format!("{prefix}:list")), "{e}");
    assert_eq!(
        list.last_token(&mut data).await.unwrap(),
        None,
        "nothing written"
    );

    let text = FencedKey::new(format!("{prefix}:text")).unwrap();
    assert!(text.set(&mut data, t, "abc").await.unwrap().is_applied());
    let e = text
        .incr_by(&mut data, FencingToken::new(6, 0), 1)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Refused { code, .. } if code == "ERR"),
        "{e}"
    );
    assert_eq!(
        text.last_token(&mut data).await.unwrap(),
        Some(t),
        "nothing written"
    );

    let fence_clobbered = FencedKey::new(format!("{prefix}:f")).unwrap();
    let _: () = redis::cmd("SET")
        .arg(fence_clobbered.fence_name())
        .arg("junk")
        .query_async(&mut data)
        .await
        .unwrap();
    let e = fence_clobbered.set(&mut data, t, "v").await.unwrap_err();
    assert!(matches!(e, Error::ForeignValue { .. }), "{e}");

    let e = FencedKey::new("a}b").unwrap_err();
    assert!(
        matches!(e, Error::InvalidKey { .. }) && e.to_string().contains("hash tag"),
        "{e}"
    );
    let e = text
        .set_with_ttl(&mut data, t, "v", Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    let no_fields: [(&str, &str); 0] = [];
    assert!(text.hset(&mut data, t, no_fields).await.is_err());
}

#[tokio::test]
async fn set_with_ttl_expires_the_value_but_never_the_fence() {
    let server = shared();
    let prefix = unique_prefix("fence-ttl");
    let mut data = server.connection().await;
    let key = FencedKey::new(format!("{prefix}:session")).unwrap();
    let t = FencingToken::new(9, 1);
    assert!(
        key.set_with_ttl(&mut data, t, "v", Duration::from_secs(30))
            .await
            .unwrap()
            .is_applied()
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(key.name())
        .query_async(&mut data)
        .await
        .unwrap();
    let fence_ttl: i64 = redis::cmd("PTTL")
        .arg(key.fence_name())
        .query_async(&mut data)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "{ttl}");
    assert_eq!(fence_ttl, -1, "the fence has no TTL");
    // advance records a newer token only; forget drops the fence.
    let newer = FencingToken::new(10, 0);
    assert!(key.advance(&mut data, newer).await.unwrap().is_applied());
    assert!(!key.set(&mut data, t, "late").await.unwrap().is_applied());
    key.forget(&mut data).await.unwrap();
    assert!(
        key.set(&mut data, t, "after forget")
            .await
            .unwrap()
            .is_applied()
    );
}

#[tokio::test]
async fn incr_by_reports_values_beyond_2_pow_53_exactly() {
    let mut data = shared().connection().await;
    let prefix = unique_prefix("fence-big");
    let counter = FencedKey::new(format!("{prefix}:big")).unwrap();
    let t = FencingToken::new(1, 0);
    let big = (1_i64 << 53) + 1;
    assert_eq!(
        counter.incr_by(&mut data, t, big).await.unwrap(),
        Fenced::Applied(big)
    );
    let once = WriteId::next();
    for _ in 0..2 {
        assert_eq!(
            counter.incr_by_once(&mut data, t, 2, once).await.unwrap(),
            Fenced::Applied(big + 2)
        );
    }
}
