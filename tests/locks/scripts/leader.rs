//! `lua/leader_write.lua`, `lua/leader_clear.lua` and `lua/leader_observe.lua`
//! through `RedisBackend`: the record's name and TTL, a smaller term never
//! replacing a greater one, a resignation deleting only its own record; a leader
//! message to every live observer on each change of the record and none on a
//! refresh or a refused write; expired observers pruned; a foreign value at the
//! observers refused before anything is written.

use std::time::Duration;

use futures::StreamExt;
use lockflight::LockKey;
use lockflight::backend::LockBackend;
use testkit::names::{channel, leader, observers};
use testkit::{get_string, pttl, query, shared, zcard};

use super::{assert_foreign, connect, one_instance};

/// A record of the term `epoch.seq` for `identity`, as the election writes it.
fn record(epoch: u64, seq: u64, identity: &str) -> Vec<u8> {
    format!("{epoch:020}{seq:020}:1700000000000:{identity}").into_bytes()
}

#[tokio::test]
async fn a_leader_record_is_never_replaced_by_an_older_term_and_cleared_only_by_its_writer() {
    let (_log, backend, mut con, prefix) = one_instance("leader-record").await;
    let key = LockKey::from("cron");
    let name = format!("{prefix}:{{cron}}:leader");
    let ttl = Duration::from_secs(30);
    assert_eq!(backend.read_leader(&key).await.unwrap(), None);

    let first = record(9, 0, "a");
    assert!(backend.write_leader(&key, &first, ttl).await.unwrap());
    assert_eq!(
        backend.read_leader(&key).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        get_string(&mut con, name.as_bytes()).await.as_deref(),
        Some(std::str::from_utf8(&first).unwrap())
    );
    let left = pttl(&mut con, name.as_bytes()).await;
    assert!(left > 0 && left <= 30_000, "PTTL {left}");

    // An older term (a stale leader's refresh) does not replace it; a handoff's
    // (same epoch, greater sequence) and a newer epoch's do.
    assert!(
        !backend
            .write_leader(&key, &record(8, 5, "old"), ttl)
            .await
            .unwrap()
    );
    assert_eq!(
        backend.read_leader(&key).await.unwrap(),
        Some(first.clone())
    );
    let handed = record(9, 1, "b");
    assert!(backend.write_leader(&key, &handed, ttl).await.unwrap());
    let newer = record(10, 0, "c");
    assert!(backend.write_leader(&key, &newer, ttl).await.unwrap());

    // Only the record's own writer deletes it.
    assert!(!backend.clear_leader(&key, &handed).await.unwrap());
    assert_eq!(
        backend.read_leader(&key).await.unwrap(),
        Some(newer.clone())
    );
    assert!(backend.clear_leader(&key, &newer).await.unwrap());
    assert_eq!(backend.read_leader(&key).await.unwrap(), None);
    assert!(!backend.clear_leader(&key, &newer).await.unwrap());
}

/// The leader message of `key`: tag 0xFA, then the key.
fn leader_message(key: &str) -> Vec<u8> {
    [&[0xFA][..], key.as_bytes()].concat()
}

/// Whether `channel` is registered in the sorted set `observers`.
async fn registered(
    con: &mut redis::aio::MultiplexedConnection,
    observers: &[u8],
    channel: &str,
) -> bool {
    query::<Option<f64>>(con, redis::cmd("ZSCORE").arg(observers).arg(channel))
        .await
        .is_some()
}

#[tokio::test]
async fn a_change_is_published_to_live_observers_and_a_refresh_is_not() {
    let (_log, backend, mut con, prefix) = one_instance("leader-observers").await;
    let key = LockKey::from("cron");
    let set = observers(&prefix, &key);
    let ttl = Duration::from_secs(30);

    // A raw subscriber on the channel the backend registers (its instance's), and
    // on the channels of two observers whose registrations will have expired: one
    // registered through the backend with a 1 ms TTL, one written with an expiry
    // long past. One connection, so its messages arrive in publishing order.
    let ours = channel(&prefix, backend.instance_id());
    let other = connect(&shared().url(), &prefix).await;
    let lapsed = channel(&prefix, other.instance_id());
    let ancient = channel(&prefix, "00000000000a0c1e");
    let mut pubsub = shared().client().get_async_pubsub().await.unwrap();
    for name in [&ours, &lapsed, &ancient] {
        pubsub.subscribe(name).await.unwrap();
    }
    let mut messages = pubsub.into_on_message();

    // Registering twice is one registration; the set lives as long as it.
    backend.observe_leader(&key, ttl).await.unwrap();
    backend.observe_leader(&key, ttl).await.unwrap();
    assert_eq!(zcard(&mut con, &set).await, 1);
    let left = pttl(&mut con, &set).await;
    assert!(left > 0 && left <= 30_000, "PTTL {left}");
    other
        .observe_leader(&key, Duration::from_millis(1))
        .await
        .unwrap();
    query::<()>(&mut con, redis::cmd("ZADD").arg(&set).arg(1).arg(&ancient)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(zcard(&mut con, &set).await, 3);

    // The changes, each published once; the refreshes, the refused write and the
    // deletions that delete nothing, never.
    let first = record(9, 0, "a");
    assert!(backend.write_leader(&key, &first, ttl).await.unwrap()); // change
    assert!(
        !registered(&mut con, &set, &lapsed).await && !registered(&mut con, &set, &ancient).await,
        "the change pruned the expired observers"
    );
    assert!(registered(&mut con, &set, &ours).await);
    assert!(backend.write_leader(&key, &first, ttl).await.unwrap()); // refresh
    assert!(
        !backend
            .write_leader(&key, &record(8, 5, "old"), ttl)
            .await
            .unwrap()
    ); // refused
    let handed = record(9, 1, "b");
    assert!(backend.write_leader(&key, &handed, ttl).await.unwrap()); // change
    assert!(backend.write_leader(&key, &handed, ttl).await.unwrap()); // refresh
    assert!(!backend.clear_leader(&key, &first).await.unwrap()); // not its record
    assert!(backend.clear_leader(&key, &handed).await.unwrap()); // change
    assert!(!backend.clear_leader(&key, &handed).await.unwrap()); // nothing left
    // Written again where none is stored: a change.
    assert!(backend.write_leader(&key, &handed, ttl).await.unwrap());

    // Everything published before this marker has arrived when it does.
    query::<i64>(&mut con, redis::cmd("PUBLISH").arg(&ours).arg("marker")).await;
    let mut seen = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("the marker arrives")
            .expect("the subscription stays open");
        let (name, payload) = (
            message.get_channel_name().to_owned(),
            message.get_payload_bytes().to_vec(),
        );
        if payload == b"marker" {
            break;
        }
        seen.push((name, payload));
    }
    let change = (ours.clone(), leader_message("cron"));
    assert_eq!(
        seen,
        [change.clone(), change.clone(), change.clone(), change],
        "one message per change, to the live observer only"
    );
    assert!(backend.clear_leader(&key, &handed).await.unwrap());
}

/// Reads first: a foreign value at the observers stops a write and a deletion of
/// the record with nothing changed, and the registration too.
#[tokio::test]
async fn a_foreign_value_at_the_observers_is_refused_before_any_write() {
    let (_log, backend, mut con, prefix) = one_instance("leader-observers-foreign").await;
    let key = LockKey::from("cron");
    let ttl = Duration::from_secs(30);
    let set = observers(&prefix, &key);
    let record_name = leader(&prefix, &key);
    query::<()>(&mut con, redis::cmd("RPUSH").arg(&set).arg("x")).await;

    let first = record(9, 0, "a");
    assert_foreign(
        "a write with a foreign value at the observers",
        backend.write_leader(&key, &first, ttl).await,
    );
    assert_eq!(get_string(&mut con, &record_name).await, None);
    assert_foreign(
        "a registration with a foreign value at the observers",
        backend.observe_leader(&key, ttl).await,
    );

    // A record written before the foreign value: its deletion is refused too.
    query::<()>(&mut con, redis::cmd("DEL").arg(&set)).await;
    assert!(backend.write_leader(&key, &first, ttl).await.unwrap());
    query::<()>(&mut con, redis::cmd("RPUSH").arg(&set).arg("x")).await;
    assert_foreign(
        "a deletion with a foreign value at the observers",
        backend.clear_leader(&key, &first).await,
    );
    assert_eq!(
        get_string(&mut con, &record_name).await.as_deref(),
        Some(std::str::from_utf8(&first).unwrap())
    );
    // A refresh reads nothing of the observers: it changes nothing they would hear of.
    assert!(backend.write_leader(&key, &first, ttl).await.unwrap());
    query::<()>(&mut con, redis::cmd("DEL").arg(&set)).await;
    assert!(backend.clear_leader(&key, &first).await.unwrap());
}
