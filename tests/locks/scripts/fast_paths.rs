//! The fast paths: what an uncontended acquire and release run at the server, and
//! the epoch they mint.

use std::collections::BTreeMap;

use super::*;

/// The per-command call counts of `INFO commandstats` (commands run by scripts
/// included), without the admin connection's own `CONFIG` and `INFO`.
async fn command_calls(con: &mut MultiplexedConnection) -> BTreeMap<String, u64> {
    let stats: String = query(con, redis::cmd("INFO").arg("commandstats")).await;
    stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!name.starts_with("config") && name != "info").then(|| (name.to_string(), calls))
        })
        .collect()
}

/// An uncontended acquire and release run exactly the documented fast paths at the
/// server: acquire TIME and GET life (the life gate), EXISTS release record, GET lock,
/// GET claim, ZCARD queue, SET fence … GET, SET lock; release GET lock, ZCARD queue, DEL
/// lock, SET release record — 12 commands and 2 `EVALSHA` per pair, and the fencing
/// epochs still increase.
#[tokio::test]
async fn uncontended_acquire_and_release_run_the_fast_paths() {
    // A private server: commandstats counts every client's commands.
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let a = connect(&server.url(), "fast-path").await;
    let key = LockKey::from("fast");
    // The first pair starts the notifier (SUBSCRIBE) and creates the fence.
    let token = LeaseToken::random();
    let mut last = epoch_of(a.acquire(&key, token, TTL, WhenBusy::Queue).await.unwrap());
    a.release(&key, token).await.unwrap();
    let mut admin = server.connection().await;
    query::<()>(&mut admin, redis::cmd("CONFIG").arg("RESETSTAT")).await;
    const PAIRS: u64 = 20;
    for _ in 0..PAIRS {
        let token = LeaseToken::random();
        let epoch = epoch_of(a.acquire(&key, token, TTL, WhenBusy::Queue).await.unwrap());
        assert!(epoch > last, "epoch {epoch} after {last}");
        last = epoch;
        assert!(a.release(&key, token).await.unwrap().released);
    }
    let calls = command_calls(&mut admin).await;
    let expected: BTreeMap<String, u64> = [
        ("evalsha", 2),
        ("get", 4),
        ("set", 3),
        ("zcard", 2),
        ("time", 1),
        ("exists", 1),
        ("del", 1),
    ]
    .into_iter()
    .map(|(name, per_pair)| (name.to_string(), per_pair * PAIRS))
    .collect();
    assert_eq!(
        calls, expected,
        "server commands for {PAIRS} uncontended pairs"
    );
}

/// The epoch is `max(last + 1, server TIME µs)`: a fence ahead of the server clock (a
/// clock stepped back) is continued from, a fence behind it jumps to the clock.
#[tokio::test]
async fn the_epoch_continues_a_fence_ahead_of_the_clock() {
    let (_log, a, mut con, prefix) = one_instance("fence-ahead").await;
    let key = LockKey::from("ahead");
    let fence = name(&prefix, &key, ":fence");
    let (secs, micros): (u64, u64) = query(&mut con, &redis::cmd("TIME")).await;
    let ahead = (secs + 1_000) * 1_000_000 + micros;
    query::<()>(&mut con, redis::cmd("SET").arg(&fence).arg(ahead)).await;
    for expected in [ahead + 1, ahead + 2] {
        let token = LeaseToken::random();
        assert_eq!(
            epoch_of(a.acquire(&key, token, TTL, WhenBusy::Queue).await.unwrap()),
            expected
        );
        assert_eq!(
            get_string(&mut con, &fence).await,
            Some(expected.to_string())
        );
        assert!(a.release(&key, token).await.unwrap().released);
    }
    // Behind the clock: the epoch is the server time.
    query::<()>(&mut con, redis::cmd("SET").arg(&fence).arg(5)).await;
    let epoch = epoch_of(
        a.acquire(&key, LeaseToken::random(), TTL, WhenBusy::Queue)
            .await
            .unwrap(),
    );
    assert!(
        epoch >= secs * 1_000_000 && epoch < ahead,
        "epoch {epoch} is not the server time"
    );
}
