//! Reads before writes: a value of another type at any of a key's names is
//! refused with `ForeignValue` before anything is written.

use super::*;

/// The expiry index `:wqx` is read only when the queue is not empty, and a release
/// reads the claim `:claim` only when someone waits (only then may it write one): for
/// a foreign value there, put another instance into the queue itself.
async fn queue_beside_foreign_index(
    con: &mut MultiplexedConnection,
    prefix: &str,
    key: &LockKey,
    suffix: &str,
) {
    if suffix == ":wqx" || suffix == ":claim" {
        let queue = name(prefix, key, ":wq");
        query::<()>(con, redis::cmd("ZADD").arg(queue).arg(1).arg("other")).await;
    }
}

/// acquire leaves no lock behind.
#[tokio::test]
async fn foreign_values_stop_acquire_before_any_write() {
    let (_log, a, mut con, prefix) = one_instance("reads-first-acquire").await;
    // (The release record `:rel:<token>` is never read by an acquire: it is only
    // deleted, which no value can refuse.)
    for suffix in [":fence", ":wq", ":wqx", ":claim"] {
        let key = LockKey::from(format!("acquire{suffix}"));
        queue_beside_foreign_index(&mut con, &prefix, &key, suffix).await;
        put_foreign(&mut con, &name(&prefix, &key, suffix), suffix).await;
        assert_foreign(
            &format!("acquire with a foreign value at {suffix}"),
            a.acquire(&key, LeaseToken::random(), TTL, WhenBusy::Queue)
                .await,
        );
        assert!(
            !exists(&mut con, &testkit::names::lock(&prefix, &key)).await,
            "acquire with a foreign value at {suffix} left the lock behind"
        );
        let kind = type_of(&mut con, &name(&prefix, &key, suffix)).await;
        assert_eq!(
            kind,
            if suffix.starts_with(":wq") {
                "list"
            } else {
                "hash"
            }
        );
    }
}

/// release deletes nothing.
#[tokio::test]
async fn foreign_values_stop_release_before_any_write() {
    let (_log, a, mut con, prefix) = one_instance("reads-first-release").await;
    // (A release of a held lock does not read its record: it overwrites it. The
    // record is read only when the lock is not ours; see `release_replies_and_records`.)
    for suffix in [":wq", ":wqx", ":claim"] {
        let key = LockKey::from(format!("release{suffix}"));
        let token = LeaseToken::random();
        epoch_of(a.acquire(&key, token, TTL, WhenBusy::Queue).await.unwrap());
        queue_beside_foreign_index(&mut con, &prefix, &key, suffix).await;
        put_foreign(&mut con, &name(&prefix, &key, suffix), suffix).await;
        assert_foreign(
            &format!("release with a foreign value at {suffix}"),
            a.release(&key, token).await,
        );
        assert_eq!(
            get_string(&mut con, &testkit::names::lock(&prefix, &key)).await,
            Some(token.to_hex()),
            "release with a foreign value at {suffix} deleted the lock"
        );
    }
}

/// renew re-arms nothing.
#[tokio::test]
async fn foreign_values_stop_renewal_before_any_write() {
    let (_log, a, mut con, prefix) = one_instance("reads-first-renew").await;
    let key = LockKey::from("renew");
    let token = LeaseToken::random();
    epoch_of(a.acquire(&key, token, TTL, WhenBusy::Queue).await.unwrap());
    put_foreign(&mut con, &name(&prefix, &key, ":wq"), ":wq").await;
    assert_foreign(
        "renew with a list at :wq",
        a.renew(&key, token, Duration::from_secs(300)).await,
    );
    assert!(
        pttl(&mut con, &testkit::names::lock(&prefix, &key)).await <= 30_000,
        "renew re-armed the lock although it failed"
    );
}

/// leave removes nothing.
#[tokio::test]
async fn foreign_values_stop_leave_before_any_write() {
    let (_log, a, mut con, prefix) = one_instance("reads-first-leave").await;
    let key = LockKey::from("leave");
    let queue = name(&prefix, &key, ":wq");
    enqueue(&mut con, &queue, a.instance_id(), 1, LIVE_ENTRY).await;
    put_foreign(&mut con, &name(&prefix, &key, ":claim"), ":claim").await;
    assert_foreign("leave with a hash at :claim", a.leave(&key).await);
    assert!(
        queued(&mut con, &queue, a.instance_id()).await,
        "leave removed the queue entry although it failed"
    );
}

/// An idempotency record that is not lockflight's (`lua/record.lua`): a value of
/// another type, or a fence that is no token, is refused by every step with
/// nothing changed.
#[tokio::test]
async fn foreign_values_stop_the_idempotency_record_before_any_write() {
    let (_log, a, mut con, prefix) = one_instance("reads-first-record").await;
    let day = Duration::from_secs(86_400);
    let key = LockKey::from("record-string");
    let record = name(&prefix, &key, ":idem");
    query::<()>(&mut con, redis::cmd("SET").arg(&record).arg("x")).await;
    assert_foreign("fence", a.fence_record(&key, (1, 0), day).await);
    assert_foreign("store", a.store_record(&key, (1, 0), b"r", day).await);
    assert_foreign("read", a.read_record(&key).await);
    assert_eq!(type_of(&mut con, &record).await, "string");
    let key = LockKey::from("record-fence");
    let record = name(&prefix, &key, ":idem");
    hset(&mut con, &record, "fence", "not a token").await;
    assert_foreign("fence", a.fence_record(&key, (1, 0), day).await);
    assert_foreign("store", a.store_record(&key, (1, 0), b"r", day).await);
    assert!(
        !hexists(&mut con, &record, "response").await,
        "nothing stored"
    );
    let ttl: i64 = query(&mut con, redis::cmd("PTTL").arg(&record)).await;
    assert_eq!(ttl, -1, "no expiry set");
}
