//! Bad input.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_keys_are_rejected() {
    let (server, _log, prefix) = shared_scene("bad-key");
    let locker = plain_locker(&server.url(), &prefix).await;

    let check = |what: &str, result: Result<(), Error>, needle: &str| match result {
        Err(e @ Error::InvalidKey { .. }) => {
            assert!(e.to_string().contains(needle), "{what}: {e}");
        }
        other => panic!("{what}: expected InvalidKey, got {other:?}"),
    };
    check("lock(\"\")", locker.lock("").await.map(drop), "empty");
    check(
        "try_lock(\"\")",
        locker.try_lock("").await.map(drop),
        "empty",
    );
    check(
        "with_lock(\"\")",
        locker.with_lock("", |_| async {}).await,
        "empty",
    );
    check(
        "coalesce(\"\")",
        locker.singleflight("", || async { 1u8 }).await.map(drop),
        "empty",
    );
    let long = vec![b'x'; LockKey::MAX_LEN + 1];
    check(
        "lock(oversized)",
        locker.lock(long.clone()).await.map(drop),
        "limit",
    );
    check(
        "try_lock(oversized)",
        locker.try_lock(long).await.map(drop),
        "limit",
    );
    // The longest allowed key, and a binary one, work.
    locker
        .lock(vec![b'x'; LockKey::MAX_LEN])
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locker
        .lock(&b"\x00\xff{}%"[..])
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    wait_idle(&[locker], IDLE).await;
}

#[tokio::test]
async fn invalid_settings_are_rejected() {
    let config_error = |what: &str, result: lockflight::Result<Locker>, needle: &str| match result {
        Err(e @ Error::InvalidConfig { .. }) => {
            assert!(e.to_string().contains(needle), "{what}: {e}");
        }
        other => panic!("{what}: expected InvalidConfig, got {other:?}"),
    };
    let builder = || Locker::builder(MemoryBackend::new());
    config_error(
        "zero lease_ttl",
        builder().lease_ttl(Duration::ZERO).build(),
        "lease_ttl",
    );
    config_error(
        "tiny lease_ttl",
        builder().lease_ttl(Duration::from_millis(99)).build(),
        "lease_ttl",
    );
    config_error(
        "zero wait_timeout",
        builder().wait_timeout(Duration::ZERO).build(),
        "wait_timeout",
    );
    config_error(
        "renew_every >= ttl",
        builder()
            .lease_ttl(Duration::from_secs(1))
            .renew_every(Duration::from_secs(1))
            .build(),
        "renew_every",
    );
    config_error(
        "zero renew_every",
        builder().renew_every(Duration::ZERO).build(),
        "renew_every",
    );
    config_error(
        "zero max_waiters",
        builder().max_waiters(0).build(),
        "max_waiters",
    );
    config_error(
        "zero handoff budget",
        builder()
            .handoff(Handoff::enabled().max_consecutive(0))
            .build(),
        "handoff",
    );
    builder()
        .lease_ttl(LockerBuilder::MIN_LEASE_TTL)
        .build()
        .expect("the minimum TTL is allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_prefixes_and_unreachable_servers_fail_cleanly() {
    let connect_error =
        |what: &str, result: lockflight::Result<RedisBackend>, needle: &str| match result {
            Err(e @ Error::InvalidConfig { .. }) => {
                assert!(e.to_string().contains(needle), "{what}: {e}")
            }
            other => panic!("{what}: expected InvalidConfig, got {other:?}"),
        };
    let limit = Duration::from_secs(10);
    connect_error(
        "malformed url",
        within(limit, "connect", RedisBackend::connect("not a url at all")).await,
        "redis url",
    );
    connect_error(
        "wrong scheme",
        within(
            limit,
            "connect",
            RedisBackend::connect("http://127.0.0.1:6379"),
        )
        .await,
        "redis url",
    );
    let url = shared().url();
    for prefix in ["", "a{b", "a}b"] {
        connect_error(
            &format!("prefix {prefix:?}"),
            within(
                limit,
                "connect",
                RedisBackend::builder(&url).prefix(prefix).connect(),
            )
            .await,
            "prefix",
        );
    }

    let started = Instant::now();
    let result = within(
        limit,
        "connect to a closed port",
        RedisBackend::connect("redis://127.0.0.1:1"),
    )
    .await;
    match result {
        Err(Error::Connect { target, .. }) => assert!(target.contains("127.0.0.1"), "{target}"),
        other => panic!("unreachable server: expected Connect, got {other:?}"),
    }
    println!("unreachable server reported after {:?}", started.elapsed());
}

/// A lock key holding a value lockflight did not write is reported as
/// `ForeignValue` at once (not a timeout), and never overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_at_the_lock_key_are_reported() {
    let (server, _log, prefix) = shared_scene("foreign-value");
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut con = server.connection().await;

    let expect_foreign = |what: &str, result: Result<(), Error>, started: Instant| {
        match result {
            Err(Error::ForeignValue { phase, .. }) => assert_eq!(phase, Phase::Acquiring),
            other => panic!("{what}: expected ForeignValue, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{what}: took {:?}",
            started.elapsed()
        );
    };

    // A list at the lock key.
    let key = LockKey::from("list");
    let name = testkit::names::lock(&prefix, &key);
    redis::cmd("LPUSH")
        .arg(&name)
        .arg("item")
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let started = Instant::now();
    expect_foreign("lock on a list", locker.lock(&key).await.map(drop), started);
    let started = Instant::now();
    expect_foreign(
        "try_lock on a list",
        locker.try_lock(&key).await.map(drop),
        started,
    );
    let len: i64 = redis::cmd("LLEN")
        .arg(&name)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(len, 1, "the list was modified");

    // A string without a TTL.
    let key = LockKey::from("no-ttl");
    let name = testkit::names::lock(&prefix, &key);
    redis::cmd("SET")
        .arg(&name)
        .arg("mine")
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let started = Instant::now();
    expect_foreign(
        "lock on a string without TTL",
        locker.lock(&key).await.map(drop),
        started,
    );
    let value = get_string(&mut con, &name).await;
    assert_eq!(value.as_deref(), Some("mine"));
    assert_eq!(pttl(&mut con, &name).await, -1, "a TTL was added");

    // Also for `with_lock`, and no slot is left behind.
    let started = Instant::now();
    expect_foreign(
        "with_lock on a string without TTL",
        locker.with_lock(&key, |_| async {}).await,
        started,
    );
    assert_eq!(locker.stats().timeouts, 0);
    wait_idle(&[locker], IDLE).await;
}
