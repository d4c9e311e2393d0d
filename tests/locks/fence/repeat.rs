//! Repeating `FencedKey` writes whose outcome is unknown: with a write id, a write
//! applies at most once per token, and every attempt after the one that applied
//! is answered `Applied` with that attempt's result.

use std::sync::Arc;
use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey, WriteId};
use lockflight::{Error, FencingToken};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use testkit::fault_proxy::{CommandMatcher, FaultProxy};
use testkit::{RedisServer, shared, unique_prefix};

use super::stale;

/// The write `id` (a small number, so that the record's fields read plainly).
fn with_id(id: u64) -> WriteId {
    WriteId::from(id)
}

/// Matches the fenced-write script run on `resource` (its first key).
fn script_on(resource: &[u8]) -> CommandMatcher {
    let resource = resource.to_vec();
    Arc::new(move |args: &[Vec<u8>]| {
        args.len() > 3 && args[0].eq_ignore_ascii_case(b"EVALSHA") && args[3] == resource
    })
}

async fn get<T: redis::FromRedisValue>(con: &mut MultiplexedConnection, name: &[u8]) -> T {
    redis::cmd("GET").arg(name).query_async(con).await.unwrap()
}

/// The write record as (field, value) pairs, sorted.
async fn record(con: &mut MultiplexedConnection, key: &FencedKey) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(key.writes_name())
        .query_async(con)
        .await
        .unwrap();
    fields.sort();
    fields
}

/// `incr_by_once` until it is answered with something other than a transient
/// error (the connection is re-made meanwhile), at most 100 times.
async fn incr_until_answered<C: ConnectionLike + Send>(
    key: &FencedKey,
    conn: &mut C,
    token: FencingToken,
    options: WriteId,
) -> lockflight::Result<Fenced<i64>> {
    for _ in 0..100 {
        match key.incr_by_once(conn, token, 1, options).await {
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(50)).await,
            outcome => return outcome,
        }
    }
    panic!("no answer in 100 attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_incr_by_after_a_lost_reply_applies_once() {
    let server = shared();
    let prefix = unique_prefix("fence-lost-reply");
    let proxy = FaultProxy::start(server).await;
    let counter = FencedKey::new(format!("{prefix}:count")).unwrap();
    let token = FencingToken::new(7, 0);
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut data = redis::aio::ConnectionManager::new(client).await.unwrap();

    // The server applies the write; its reply is lost with the connection.
    let once = WriteId::next();
    proxy.drop_replies(script_on(counter.name()), 1);
    let first = counter.incr_by_once(&mut data, token, 1, once).await;
    assert!(matches!(&first, Err(e) if e.is_transient()), "{first:?}");
    assert_eq!(proxy.dropped(), 1);

    // The same write again: not applied twice, and reported as applied.
    let repeat = incr_until_answered(&counter, &mut data, token, once).await;
    assert_eq!(repeat.unwrap(), Fenced::Applied(1));
    let mut direct = server.connection().await;
    assert_eq!(get::<i64>(&mut direct, counter.name()).await, 1);
    // However often.
    let again = incr_until_answered(&counter, &mut data, token, once).await;
    assert_eq!(again.unwrap(), Fenced::Applied(1));
    assert_eq!(get::<i64>(&mut direct, counter.name()).await, 1);
}

/// The first attempt is still on its way (the server is stopped) when the repeat
/// is sent on another connection: whichever runs first applies, the other finds
/// it applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_sent_while_the_first_attempt_waits_applies_once() {
    let server = RedisServer::start();
    let counter = FencedKey::new("count").unwrap();
    let token = FencingToken::new(3, 1);
    let impatient = server
        .client()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_millis(300))),
        )
        .await
        .unwrap();
    let mut patient = server.connection().await;
    // Load the script, so that both attempts are the write itself.
    let warm = FencedKey::new("warm").unwrap();
    assert!(
        warm.incr_by(&mut patient, token, 1)
            .await
            .unwrap()
            .is_applied()
    );

    let once = WriteId::next();
    server.pause();
    let mut first_conn = impatient.clone();
    let first = counter.incr_by_once(&mut first_conn, token, 1, once).await;
    assert!(matches!(&first, Err(e) if e.is_transient()), "{first:?}");
    let repeat = tokio::spawn({
        let (counter, mut patient) = (counter.clone(), patient.clone());
        async move { counter.incr_by_once(&mut patient, token, 1, once).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.resume();

    assert_eq!(repeat.await.unwrap().unwrap(), Fenced::Applied(1));
    assert_eq!(get::<i64>(&mut patient, counter.name()).await, 1);
}

#[tokio::test]
async fn writes_with_different_ids_in_one_section_both_apply() {
    let mut con = shared().connection().await;
    let prefix = unique_prefix("fence-ids");
    let counter = FencedKey::new(format!("{prefix}:count")).unwrap();
    let t = FencingToken::new(9, 2);

    let (a, b) = (WriteId::next(), WriteId::next());
    assert_eq!(
        counter.incr_by_once(&mut con, t, 1, a).await.unwrap(),
        Fenced::Applied(1)
    );
    assert_eq!(
        counter.incr_by_once(&mut con, t, 5, b).await.unwrap(),
        Fenced::Applied(6)
    );
    // A late repeat of the first is answered as the first was, and adds nothing.
    assert_eq!(
        counter.incr_by_once(&mut con, t, 1, a).await.unwrap(),
        Fenced::Applied(1)
    );
    // A write without an id is a new write, and leaves the record alone.
    assert_eq!(
        counter.incr_by(&mut con, t, 1).await.unwrap(),
        Fenced::Applied(7)
    );
    assert_eq!(
        record(&mut con, &counter).await.len(),
        4,
        "token, mark, a, b"
    );

    // A late copy of an earlier `set` does not undo a later one.
    let doc = FencedKey::new(format!("{prefix}:doc")).unwrap();
    let (first, second) = (with_id(10), with_id(11));
    for (options, value) in [(first, "one"), (second, "two"), (first, "one")] {
        let outcome = doc.set_once(&mut con, t, value, options).await.unwrap();
        assert_eq!(outcome, Fenced::Applied(()));
    }
    assert_eq!(get::<String>(&mut con, doc.name()).await, "two");
    let fields = [("f", "v")];
    assert!(
        doc.delete_once(&mut con, t, with_id(12))
            .await
            .unwrap()
            .is_applied()
    );
    assert!(
        doc.hset_once(&mut con, t, fields, with_id(13))
            .await
            .unwrap()
            .is_applied()
    );
    assert!(
        doc.delete_once(&mut con, t, with_id(12))
            .await
            .unwrap()
            .is_applied()
    );
    let ttl = Duration::from_secs(60);
    let late = doc
        .set_with_ttl_once(&mut con, t, "late", ttl, with_id(11))
        .await;
    assert_eq!(late.unwrap(), Fenced::Applied(()));
    let kind: String = redis::cmd("TYPE")
        .arg(doc.name())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        kind, "hash",
        "neither the repeated DEL nor the repeated SET ran"
    );
}

#[tokio::test]
async fn a_newer_tokens_write_replaces_the_record_and_an_older_token_is_stale() {
    let mut con = shared().connection().await;
    let prefix = unique_prefix("fence-newer");
    let counter = FencedKey::new(format!("{prefix}:count")).unwrap();
    let (t1, t2, t3) = (
        FencingToken::new(5, 0),
        FencingToken::new(5, 1),
        FencingToken::new(6, 0),
    );

    assert!(
        counter
            .incr_by_once(&mut con, t1, 1, with_id(1))
            .await
            .unwrap()
            .is_applied()
    );
    assert!(
        counter
            .incr_by_once(&mut con, t2, 1, with_id(2))
            .await
            .unwrap()
            .is_applied()
    );
    let fields = |token: &str, ids: &[(&str, &str)]| {
        let mut all: Vec<(String, String)> = [("mark", ""), ("token", token)]
            .iter()
            .chain(ids)
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect();
        all.sort();
        all
    };
    assert_eq!(
        record(&mut con, &counter).await,
        fields("5:1", &[("0000000000000002", "2")]),
        "t1's ids are gone"
    );
    // The older token, with its recorded id or a new one: stale, nothing written.
    for id in [1, 3] {
        assert_eq!(
            counter
                .incr_by_once(&mut con, t1, 1, with_id(id))
                .await
                .unwrap(),
            stale(t1, t2).map(|()| 0)
        );
    }
    // A newer token without an id leaves the record (of t2) alone; with an id it
    // starts its own record, where an id of t2 is new.
    assert_eq!(
        counter.incr_by(&mut con, t3, 1).await.unwrap(),
        Fenced::Applied(3)
    );
    assert_eq!(
        record(&mut con, &counter).await,
        fields("5:1", &[("0000000000000002", "2")])
    );
    assert_eq!(
        counter
            .incr_by_once(&mut con, t3, 1, with_id(2))
            .await
            .unwrap(),
        Fenced::Applied(4)
    );
    assert_eq!(
        record(&mut con, &counter).await,
        fields("6:0", &[("0000000000000002", "4")])
    );
    assert_eq!(counter.last_token(&mut con).await.unwrap(), Some(t3));

    // forget drops the record with the fence.
    counter.forget(&mut con).await.unwrap();
    assert!(record(&mut con, &counter).await.is_empty());
}

#[tokio::test]
async fn ids_older_than_the_record_keeps_are_refused_never_applied() {
    let mut con = shared().connection().await;
    let prefix = unique_prefix("fence-window");
    let counter = FencedKey::new(format!("{prefix}:count")).unwrap();
    let t = FencingToken::new(4, 0);
    for id in 1..=97 {
        let outcome = counter.incr_by_once(&mut con, t, 1, with_id(id)).await;
        assert_eq!(outcome.unwrap(), Fenced::Applied(id as i64));
    }
    // 97 ids are more than the record holds: it keeps the 64 newest (34..=97).
    let fields = record(&mut con, &counter).await;
    assert_eq!(fields.len(), 64 + 2);
    assert!(fields.contains(&("mark".into(), format!("{:016x}", 33))));

    // An applied id that was dropped, and an id never seen below the mark: refused.
    for id in [10, 33] {
        let e = counter
            .incr_by_once(&mut con, t, 1, with_id(id))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::Refused { code, .. } if code == "WRITEID"),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("{prefix}:count")), "{e}");
    }
    assert_eq!(
        get::<i64>(&mut con, counter.name()).await,
        97,
        "nothing applied"
    );
    // The kept ones are still answered; newer ones apply.
    assert_eq!(
        counter
            .incr_by_once(&mut con, t, 1, with_id(34))
            .await
            .unwrap(),
        Fenced::Applied(34)
    );
    assert_eq!(
        counter
            .incr_by_once(&mut con, t, 1, with_id(98))
            .await
            .unwrap(),
        Fenced::Applied(98)
    );
}

/// Reads first: a value of another type at the write record stops a write with
/// an id before anything is written; a refused write records no id.
#[tokio::test]
async fn a_foreign_write_record_or_a_refused_write_changes_nothing() {
    let mut con = shared().connection().await;
    let prefix = unique_prefix("fence-record-foreign");
    let t = FencingToken::new(8, 0);

    let key = FencedKey::new(format!("{prefix}:a")).unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(key.writes_name())
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    let e = key
        .set_once(&mut con, t, "v", with_id(1))
        .await
        .unwrap_err();
    assert!(matches!(&e, Error::ForeignValue { .. }), "{e}");
    assert!(e.to_string().contains("write record"), "{e}");
    assert!(e.to_string().contains(&format!("{prefix}:a")), "{e}");
    assert_eq!(get::<Option<String>>(&mut con, key.name()).await, None);
    assert_eq!(key.last_token(&mut con).await.unwrap(), None);
    // A write without an id never touches the record.
    assert!(key.set(&mut con, t, "v").await.unwrap().is_applied());

    // Refused by the resource (not an integer): no token, no id recorded; the
    // same id then applies once the value is fixed.
    let text = FencedKey::new(format!("{prefix}:text")).unwrap();
    let _: () = redis::cmd("SET")
        .arg(text.name())
        .arg("abc")
        .query_async(&mut con)
        .await
        .unwrap();
    let e = text
        .incr_by_once(&mut con, t, 1, with_id(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Refused { code, .. } if code == "ERR"),
        "{e}"
    );
    assert!(record(&mut con, &text).await.is_empty());
    assert_eq!(text.last_token(&mut con).await.unwrap(), None);
    assert!(
        text.set_once(&mut con, t, 41, with_id(2))
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(
        text.incr_by_once(&mut con, t, 1, with_id(1)).await.unwrap(),
        Fenced::Applied(42)
    );

    // A foreign value at the resource: nothing recorded either.
    let list = FencedKey::new(format!("{prefix}:list")).unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(list.name())
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    let e = list
        .incr_by_once(&mut con, t, 1, with_id(1))
        .await
        .unwrap_err();
    assert!(matches!(&e, Error::ForeignValue { .. }), "{e}");
    assert!(record(&mut con, &list).await.is_empty());
}

/// Out of memory: Redis refuses the script at its first write, the resource's,
/// so no token and no id is recorded; a repeat of a write applied before only
/// reads, and is still answered.
#[tokio::test]
async fn out_of_memory_refuses_the_whole_write_and_repeats_are_still_answered() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let t = FencingToken::new(2, 0);
    let counter = FencedKey::new("count").unwrap();
    let applied = with_id(1);
    assert!(
        counter
            .incr_by_once(&mut con, t, 1, applied)
            .await
            .unwrap()
            .is_applied()
    );

    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let fresh = FencedKey::new("fresh").unwrap();
    let e = fresh
        .incr_by_once(&mut con, t, 1, with_id(2))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Refused { code, .. } if code == "OOM"),
        "{e}"
    );
    let e = counter
        .incr_by_once(&mut con, t, 1, with_id(2))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Refused { code, .. } if code == "OOM"),
        "{e}"
    );
    assert_eq!(
        counter.incr_by_once(&mut con, t, 1, applied).await.unwrap(),
        Fenced::Applied(1)
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(record(&mut con, &fresh).await.is_empty());
    assert_eq!(fresh.last_token(&mut con).await.unwrap(), None);
    assert_eq!(
        record(&mut con, &counter).await.len(),
        3,
        "token, mark, id 1"
    );
    assert_eq!(get::<i64>(&mut con, counter.name()).await, 1);
}
