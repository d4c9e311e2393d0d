//! `lua/leader_write.lua` and `lua/leader_clear.lua` through `RedisBackend`: the
//! record's name and TTL, a smaller term never replacing a greater one, and a
//! resignation deleting only its own record.

use std::time::Duration;

use lockflight::LockKey;
use lockflight::backend::LockBackend;
use testkit::{get_string, pttl};

use crate::one_instance;

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
