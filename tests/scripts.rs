//! The Redis backend's scripts and connection checks against a real Redis: every
//! reply of every script through `RedisBackend`'s decoding, foreign values refused
//! before anything is written, release reconciliation by tombstone, a refused
//! wake-up `PUBLISH`, the classification of server refusals (`OOM`, `READONLY`),
//! `connect()`'s verification (passwords, ACLs, the minimal ACL line) and the
//! notifier's restart on a new runtime.
//!
//! Tests that only need *a* Redis use [`support::shared`] with their own
//! [`support::unique_prefix`]; tests that change the server's configuration or ACLs
//! start their own [`RedisServer`].

mod support;

use std::time::{Duration, Instant};

use lockflight::backend::{Acquire, Extend, LeaseToken, Released};
use lockflight::{Error, LockKey, Locker, RedisBackend, backend::LockBackend};
use redis::aio::MultiplexedConnection;
use support::{RedisServer, exists, pttl, query, shared, unique_prefix, wait_until};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const TTL: Duration = Duration::from_secs(30);

/// The expiry (ms) of a queue entry that stays live for the whole test.
const LIVE_ENTRY: u64 = 99_999_999_999_999;

async fn connect(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect the backend")
}

/// The Redis name `<lock name><suffix>` of `key` (`:fence`, `:wq`, `:wqx`, `:claim`, `:rel`).
fn name(backend: &RedisBackend, key: &LockKey, suffix: &str) -> Vec<u8> {
    [backend.lock_name(key), suffix.as_bytes().to_vec()].concat()
}

async fn get(con: &mut MultiplexedConnection, name: &[u8]) -> Option<String> {
    query(con, redis::cmd("GET").arg(name)).await
}

async fn hexists(con: &mut MultiplexedConnection, name: &[u8], field: &str) -> bool {
    query::<i64>(con, redis::cmd("HEXISTS").arg(name).arg(field)).await == 1
}

/// Whether `id` has an entry in the waiter queue `queue` (a sorted set).
async fn queued(con: &mut MultiplexedConnection, queue: &[u8], id: &str) -> bool {
    query::<Option<String>>(con, redis::cmd("ZSCORE").arg(queue).arg(id))
        .await
        .is_some()
}

/// Puts `id` into the waiter queue `queue` (and its expiry index `<queue>x`),
/// enqueued at `enqueued_us`, expiring at `expires_ms`.
async fn enqueue(
    con: &mut MultiplexedConnection,
    queue: &[u8],
    id: &str,
    enqueued_us: u64,
    expires_ms: u64,
) {
    let expiry = [queue, b"x"].concat();
    query::<()>(con, redis::cmd("ZADD").arg(queue).arg(enqueued_us).arg(id)).await;
    query::<()>(con, redis::cmd("ZADD").arg(expiry).arg(expires_ms).arg(id)).await;
}

async fn hset(con: &mut MultiplexedConnection, name: &[u8], field: &str, value: &str) {
    query::<()>(con, redis::cmd("HSET").arg(name).arg(field).arg(value)).await
}

/// Puts a value of the wrong type at `<lock name><suffix>`: a list at the queue and
/// its expiry index (sorted sets), a hash elsewhere (strings).
async fn put_foreign(con: &mut MultiplexedConnection, name: &[u8], suffix: &str) {
    if suffix == ":wq" || suffix == ":wqx" {
        query::<()>(con, redis::cmd("RPUSH").arg(name).arg("x")).await
    } else {
        hset(con, name, "f", "v").await
    }
}

async fn type_of(con: &mut MultiplexedConnection, name: &[u8]) -> String {
    query(con, redis::cmd("TYPE").arg(name)).await
}

fn epoch_of(reply: Acquire) -> u64 {
    match reply {
        Acquire::Acquired { epoch, .. } => epoch,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn assert_foreign<T: std::fmt::Debug>(what: &str, result: lockflight::Result<T>) {
    match result {
        Err(Error::ForeignValue { .. }) => {}
        other => panic!("{what}: expected ForeignValue, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Every reply of every script
// ---------------------------------------------------------------------------

/// acquire: acquired / already ours (TTL re-armed, a new and greater epoch) / busy
/// and queued / busy and not queued (try) / another type at the lock key (-1) / a
/// string without a TTL (-2).
#[tokio::test]
async fn acquire_replies() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("acquire-replies");
    let a = connect(&server.url(), &prefix).await;
    let b = connect(&server.url(), &prefix).await;
    let mut con = server.connection().await;
    let key = LockKey::from("k");
    let lock = a.lock_name(&key);
    let (t1, t2) = (LeaseToken::random(), LeaseToken::random());

    // Acquired.
    let e1 = epoch_of(a.acquire(&key, t1, TTL, true).await.unwrap());
    assert!(e1 > 0);
    assert_eq!(get(&mut con, &lock).await, Some(t1.to_hex()));
    assert!((1..=30_000).contains(&pttl(&mut con, &lock).await));

    // Already ours: the TTL is re-armed and a fresh, greater epoch is minted.
    query::<()>(&mut con, redis::cmd("PEXPIRE").arg(&lock).arg(5_000)).await;
    let e2 = epoch_of(a.acquire(&key, t1, TTL, true).await.unwrap());
    assert!(
        e2 > e1,
        "already ours must mint a new epoch: {e2} after {e1}"
    );
    assert!(pttl(&mut con, &lock).await > 10_000, "TTL not re-armed");

    // Busy, queued.
    match b.acquire(&key, t2, TTL, true).await.unwrap() {
        Acquire::Busy { retry_in } => assert!(retry_in <= Duration::from_secs(1), "{retry_in:?}"),
        other => panic!("expected Busy, got {other:?}"),
    }
    let queue = name(&a, &key, ":wq");
    assert!(queued(&mut con, &queue, b.instance_id()).await);
    assert_eq!(
        a.extend(&key, t1, TTL).await.unwrap(),
        Extend::Extended { waiting: 1 }
    );

    // Busy, not queued (try_lock).
    let c = connect(&server.url(), &prefix).await;
    assert!(matches!(
        c.acquire(&key, LeaseToken::random(), TTL, false)
            .await
            .unwrap(),
        Acquire::Busy { .. }
    ));
    assert!(!queued(&mut con, &queue, c.instance_id()).await);

    // Another type at the lock key (-1): reported, left alone.
    let key = LockKey::from("hash");
    let lock = a.lock_name(&key);
    hset(&mut con, &lock, "f", "v").await;
    assert_foreign("acquire on a hash", a.acquire(&key, t1, TTL, true).await);
    assert!(hexists(&mut con, &lock, "f").await);

    // A string without a TTL (-2): reported, left alone.
    let key = LockKey::from("no-ttl");
    let lock = a.lock_name(&key);
    query::<()>(&mut con, redis::cmd("SET").arg(&lock).arg("x")).await;
    assert_foreign(
        "acquire on a string without TTL",
        a.acquire(&key, t1, TTL, true).await,
    );
    assert_eq!(get(&mut con, &lock).await.as_deref(), Some("x"));
    assert_eq!(pttl(&mut con, &lock).await, -1);
}

/// release: released / not ours / already released by an earlier attempt with the
/// same token (the tombstone, which carries a TTL).
#[tokio::test]
async fn release_replies_and_tombstone() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("release-replies");
    let a = RedisBackend::builder(server.url())
        .prefix(&prefix)
        .response_timeout(Duration::from_millis(1_500))
        .connect()
        .await
        .unwrap();
    let mut con = server.connection().await;
    let key = LockKey::from("k");
    let lock = a.lock_name(&key);
    let tombstone = name(&a, &key, ":rel");
    let (t1, t2) = (LeaseToken::random(), LeaseToken::random());

    epoch_of(a.acquire(&key, t1, TTL, true).await.unwrap());
    // Not ours: nothing deleted.
    assert_eq!(
        a.release(&key, t2).await.unwrap(),
        Released {
            released: false,
            waiting: 0
        }
    );
    assert!(exists(&mut con, &lock).await);
    // Released.
    assert!(a.release(&key, t1).await.unwrap().released);
    assert!(!exists(&mut con, &lock).await);
    // The tombstone: max(2 × response timeout, 1 s) = 3 s.
    assert_eq!(get(&mut con, &tombstone).await, Some(t1.to_hex()));
    let ttl = pttl(&mut con, &tombstone).await;
    assert!((1..=3_000).contains(&ttl), "tombstone PTTL {ttl}");
    // A retry of the same release (its reply was lost): released.
    assert!(a.release(&key, t1).await.unwrap().released);
    // Another token: not released.
    assert!(!a.release(&key, t2).await.unwrap().released);

    // The token reused by a new leader: acquiring with it clears its tombstone, so a
    // lease lost afterwards is not reported as released.
    epoch_of(a.acquire(&key, t1, TTL, true).await.unwrap());
    assert!(!exists(&mut con, &tombstone).await);
    query::<()>(
        &mut con,
        redis::cmd("SET")
            .arg(&lock)
            .arg(t2.to_hex())
            .arg("PX")
            .arg(30_000),
    )
    .await;
    assert!(!a.release(&key, t1).await.unwrap().released);
    assert_eq!(get(&mut con, &lock).await, Some(t2.to_hex()));
}

/// extend: extended (TTL re-armed, waiting count) / not the owner (nothing changed).
#[tokio::test]
async fn extend_replies() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("extend-replies");
    let a = connect(&server.url(), &prefix).await;
    let mut con = server.connection().await;
    let key = LockKey::from("k");
    let lock = a.lock_name(&key);
    let t1 = LeaseToken::random();

    epoch_of(
        a.acquire(&key, t1, Duration::from_secs(5), true)
            .await
            .unwrap(),
    );
    enqueue(&mut con, &name(&a, &key, ":wq"), "other", 1, LIVE_ENTRY).await;
    assert_eq!(
        a.extend(&key, t1, TTL).await.unwrap(),
        Extend::Extended { waiting: 1 }
    );
    assert!(pttl(&mut con, &lock).await > 10_000);
    assert_eq!(
        a.extend(&key, LeaseToken::random(), Duration::from_secs(60))
            .await
            .unwrap(),
        Extend::NotOwner
    );
    assert!(pttl(&mut con, &lock).await <= 30_000);
}

/// leave: the normal path removes the entry and passes a claim on; the
/// only-if-claimed path changes nothing when the claim is not this instance's.
#[tokio::test]
async fn leave_replies() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("leave-replies");
    let a = connect(&server.url(), &prefix).await;
    let mut con = server.connection().await;
    let key = LockKey::from("k");
    let (queue, claim) = (name(&a, &key, ":wq"), name(&a, &key, ":claim"));

    // Normal: a queued instance holding the claim leaves; the claim passes on.
    enqueue(&mut con, &queue, a.instance_id(), 0, LIVE_ENTRY).await;
    enqueue(&mut con, &queue, "next", 1, LIVE_ENTRY).await;
    query::<()>(
        &mut con,
        redis::cmd("SET")
            .arg(&claim)
            .arg(a.instance_id())
            .arg("PX")
            .arg(30_000),
    )
    .await;
    a.leave(&key).await.expect("leave");
    assert!(!queued(&mut con, &queue, a.instance_id()).await);
    assert_eq!(get(&mut con, &claim).await.as_deref(), Some("next"));

    // Only if claimed, and the claim is someone else's: nothing changes.
    enqueue(&mut con, &queue, a.instance_id(), 0, LIVE_ENTRY).await;
    assert!(!a.leave_if_claimed(&key).await.expect("leave_if_claimed"));
    assert!(queued(&mut con, &queue, a.instance_id()).await);
    assert_eq!(get(&mut con, &claim).await.as_deref(), Some("next"));

    // Only if claimed, and the claim is ours: left.
    query::<()>(
        &mut con,
        redis::cmd("SET")
            .arg(&claim)
            .arg(a.instance_id())
            .arg("PX")
            .arg(30_000),
    )
    .await;
    assert!(a.leave_if_claimed(&key).await.expect("leave_if_claimed"));
    assert!(!queued(&mut con, &queue, a.instance_id()).await);
    assert_eq!(get(&mut con, &claim).await.as_deref(), Some("next"));
}

// ---------------------------------------------------------------------------
// Reads before writes
// ---------------------------------------------------------------------------

// A value of another type at any of a key's names is refused with `ForeignValue`
// before the script writes anything.

async fn reads_first_setup(name: &str) -> (RedisBackend, MultiplexedConnection) {
    let server = shared();
    let prefix = unique_prefix(name);
    (
        connect(&server.url(), &prefix).await,
        server.connection().await,
    )
}

/// The expiry index `:wqx` is read only when the queue is not empty, and a release
/// reads the claim `:claim` only when someone waits (only then may it write one): for
/// a foreign value there, put another instance into the queue itself.
async fn queue_beside_foreign_index(
    con: &mut MultiplexedConnection,
    backend: &RedisBackend,
    key: &LockKey,
    suffix: &str,
) {
    if suffix == ":wqx" || suffix == ":claim" {
        let queue = name(backend, key, ":wq");
        query::<()>(con, redis::cmd("ZADD").arg(queue).arg(1).arg("other")).await;
    }
}

/// acquire leaves no lock behind.
#[tokio::test]
async fn foreign_values_stop_acquire_before_any_write() {
    let _log = shared().log_on_panic();
    let (a, mut con) = reads_first_setup("reads-first-acquire").await;
    for suffix in [":fence", ":wq", ":wqx", ":claim", ":rel"] {
        let key = LockKey::from(format!("acquire{suffix}"));
        queue_beside_foreign_index(&mut con, &a, &key, suffix).await;
        put_foreign(&mut con, &name(&a, &key, suffix), suffix).await;
        assert_foreign(
            &format!("acquire with a foreign value at {suffix}"),
            a.acquire(&key, LeaseToken::random(), TTL, true).await,
        );
        assert!(
            !exists(&mut con, &a.lock_name(&key)).await,
            "acquire with a foreign value at {suffix} left the lock behind"
        );
        let kind = type_of(&mut con, &name(&a, &key, suffix)).await;
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
    let _log = shared().log_on_panic();
    let (a, mut con) = reads_first_setup("reads-first-release").await;
    for suffix in [":wq", ":wqx", ":claim", ":rel"] {
        let key = LockKey::from(format!("release{suffix}"));
        let token = LeaseToken::random();
        epoch_of(a.acquire(&key, token, TTL, true).await.unwrap());
        queue_beside_foreign_index(&mut con, &a, &key, suffix).await;
        put_foreign(&mut con, &name(&a, &key, suffix), suffix).await;
        assert_foreign(
            &format!("release with a foreign value at {suffix}"),
            a.release(&key, token).await,
        );
        assert_eq!(
            get(&mut con, &a.lock_name(&key)).await,
            Some(token.to_hex()),
            "release with a foreign value at {suffix} deleted the lock"
        );
    }
}

/// extend re-arms nothing.
#[tokio::test]
async fn foreign_values_stop_extend_before_any_write() {
    let _log = shared().log_on_panic();
    let (a, mut con) = reads_first_setup("reads-first-extend").await;
    let key = LockKey::from("extend");
    let token = LeaseToken::random();
    epoch_of(a.acquire(&key, token, TTL, true).await.unwrap());
    put_foreign(&mut con, &name(&a, &key, ":wq"), ":wq").await;
    assert_foreign(
        "extend with a list at :wq",
        a.extend(&key, token, Duration::from_secs(300)).await,
    );
    assert!(
        pttl(&mut con, &a.lock_name(&key)).await <= 30_000,
        "extend re-armed the lock although it failed"
    );
}

/// leave removes nothing.
#[tokio::test]
async fn foreign_values_stop_leave_before_any_write() {
    let _log = shared().log_on_panic();
    let (a, mut con) = reads_first_setup("reads-first-leave").await;
    let key = LockKey::from("leave");
    let queue = name(&a, &key, ":wq");
    enqueue(&mut con, &queue, a.instance_id(), 1, LIVE_ENTRY).await;
    put_foreign(&mut con, &name(&a, &key, ":claim"), ":claim").await;
    assert_foreign("leave with a hash at :claim", a.leave(&key).await);
    assert!(
        queued(&mut con, &queue, a.instance_id()).await,
        "leave removed the queue entry although it failed"
    );
}

// ---------------------------------------------------------------------------
// A refused wake-up PUBLISH
// ---------------------------------------------------------------------------

/// An ACL user that may publish only on its own channel releases a lock another
/// instance waits for: the release is reported as done, and the claim that was set
/// for the instance that could not be told is taken back. Same for leave.
#[tokio::test]
async fn a_refused_wake_up_publish_still_reports_the_release() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let prefix = "lfpub";
    query::<()>(
        &mut admin,
        redis::cmd("ACL").arg(&["SETUSER", "u", "on", ">pw", "~*", "&*", "+@all"]),
    )
    .await;
    let url = format!("redis://u:pw@127.0.0.1:{}/", server.port());
    let u = connect(&url, prefix).await;
    // From now on `u` may publish on its own channel only.
    query::<()>(
        &mut admin,
        redis::cmd("ACL")
            .arg(&["SETUSER", "u", "resetchannels"])
            .arg(format!("&{}", u.channel())),
    )
    .await;
    let key = LockKey::from("k");
    let (lock, queue, claim) = (
        u.lock_name(&key),
        name(&u, &key, ":wq"),
        name(&u, &key, ":claim"),
    );

    // Release.
    let token = LeaseToken::random();
    epoch_of(u.acquire(&key, token, TTL, true).await.unwrap());
    enqueue(&mut admin, &queue, "waiter", 1, LIVE_ENTRY).await;
    assert_eq!(
        u.release(&key, token).await.expect("release"),
        Released {
            released: true,
            waiting: 1
        }
    );
    assert!(!exists(&mut admin, &lock).await);
    assert!(
        !exists(&mut admin, &claim).await,
        "the claim of an instance that was never told is left"
    );

    // Leave, holding the claim: it would pass to "waiter", who cannot be told.
    enqueue(&mut admin, &queue, u.instance_id(), 0, LIVE_ENTRY).await;
    query::<()>(
        &mut admin,
        redis::cmd("SET")
            .arg(&claim)
            .arg(u.instance_id())
            .arg("PX")
            .arg(30_000),
    )
    .await;
    u.leave(&key).await.expect("leave");
    assert!(!queued(&mut admin, &queue, u.instance_id()).await);
    assert!(!exists(&mut admin, &claim).await);

    // The default user may publish anywhere: the claim is given.
    let d = connect(&server.url(), prefix).await;
    let token = LeaseToken::random();
    epoch_of(d.acquire(&key, token, TTL, true).await.unwrap());
    assert!(d.release(&key, token).await.unwrap().released);
    assert_eq!(get(&mut admin, &claim).await.as_deref(), Some("waiter"));
}

// ---------------------------------------------------------------------------
// Server refusals
// ---------------------------------------------------------------------------

/// Out of memory under `noeviction`: acquire answers `Refused { code: "OOM" }` at
/// once, and leaves nothing behind.
#[tokio::test]
async fn out_of_memory_is_refused_at_once() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let a = connect(&server.url(), "lfoom").await;
    query::<()>(
        &mut admin,
        redis::cmd("CONFIG").arg(&["SET", "maxmemory-policy", "noeviction"]),
    )
    .await;
    query::<()>(
        &mut admin,
        redis::cmd("CONFIG").arg(&["SET", "maxmemory", "1"]),
    )
    .await;
    let key = LockKey::from("k");
    let started = Instant::now();
    match a.acquire(&key, LeaseToken::random(), TTL, true).await {
        Err(Error::Refused { code, .. }) => assert_eq!(code, "OOM"),
        other => panic!("expected Refused(OOM), got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(!exists(&mut admin, &a.lock_name(&key)).await);
}

/// A read-only replica: acquire and extend answer `Refused { code: "READONLY" }`.
#[tokio::test]
async fn a_read_only_replica_is_refused() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    // No 5 s wait before the full sync.
    query::<()>(
        &mut primary.connection().await,
        redis::cmd("CONFIG").arg(&["SET", "repl-diskless-sync-delay", "0"]),
    )
    .await;
    let mut admin = replica.connection().await;
    query::<()>(
        &mut admin,
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port()),
    )
    .await;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let mut admin = admin.clone();
            async move {
                let info: String = query(&mut admin, redis::cmd("INFO").arg("replication")).await;
                info.contains("master_link_status:up")
            }
        })
        .await,
        "the replica never synced"
    );
    let p = connect(&primary.url(), "lfro").await;
    let r = connect(&replica.url(), "lfro").await;
    let key = LockKey::from("k");
    let token = LeaseToken::random();

    match r.acquire(&key, LeaseToken::random(), TTL, true).await {
        Err(Error::Refused { code, .. }) => assert_eq!(code, "READONLY"),
        other => panic!("acquire: expected Refused(READONLY), got {other:?}"),
    }

    // A lease taken on the primary and replicated: renewing it on the replica.
    epoch_of(p.acquire(&key, token, TTL, true).await.unwrap());
    assert!(
        wait_until(Duration::from_secs(10), || {
            let mut admin = admin.clone();
            let lock = r.lock_name(&key);
            async move { exists(&mut admin, &lock).await }
        })
        .await,
        "the lock never reached the replica"
    );
    match r.extend(&key, token, TTL).await {
        Err(Error::Refused { code, .. }) => assert_eq!(code, "READONLY"),
        other => panic!("extend: expected Refused(READONLY), got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// connect() verifies
// ---------------------------------------------------------------------------

fn assert_connect_auth_failure(what: &str, result: lockflight::Result<RedisBackend>) {
    match result {
        Err(e @ Error::Connect { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("authentication failed"),
                "{what}: the message does not say authentication failed: {text}"
            );
            assert!(
                !text.contains("secretpw") && !text.contains("wrongpw"),
                "{text}"
            );
        }
        other => panic!("{what}: expected Connect, got {other:?}"),
    }
}

/// Against a `requirepass` server, `connect()` fails at once without the password
/// or with a wrong one, and succeeds with the right one.
#[tokio::test]
async fn connect_checks_the_password() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    query::<()>(
        &mut admin,
        redis::cmd("CONFIG").arg(&["SET", "requirepass", "secretpw"]),
    )
    .await;
    let port = server.port();
    let started = Instant::now();
    assert_connect_auth_failure(
        "no password",
        RedisBackend::connect(&format!("redis://127.0.0.1:{port}/")).await,
    );
    assert_connect_auth_failure(
        "wrong password",
        RedisBackend::connect(&format!("redis://:wrongpw@127.0.0.1:{port}/")).await,
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let b = RedisBackend::connect(&format!("redis://:secretpw@127.0.0.1:{port}/"))
        .await
        .expect("the right password");
    assert!(b.is_subscribed());
}

/// The exact rules of the minimal ACL user documented on `RedisBackend`, for the
/// prefix `lfacl`.
const MINIMAL_RULES: &[&str] = &[
    "~lfacl:*",
    "&lfacl:inst:*",
    "+evalsha",
    "+script|load",
    "+publish",
    "+subscribe",
    "+time",
    "+get",
    "+set",
    "+del",
    "+exists",
    "+pexpire",
    "+pttl",
    "+zcard",
    "+zscore",
    "+zrange",
    "+zrangebyscore",
    "+zremrangebyscore",
    "+zcount",
    "+zadd",
    "+zrem",
];

async fn set_user(admin: &mut MultiplexedConnection, user: &str, rules: &[&str]) {
    query::<()>(
        admin,
        redis::cmd("ACL")
            .arg(&["SETUSER", user, "reset", "on", ">pw"])
            .arg(rules),
    )
    .await;
}

/// Every operation, with a second instance waiting and woken: holder and waiter
/// both use `url`.
async fn exercise(url: &str) -> lockflight::Result<()> {
    let holder = RedisBackend::builder(url).prefix("lfacl").connect().await?;
    let waiter = RedisBackend::builder(url).prefix("lfacl").connect().await?;
    let key = LockKey::from(LeaseToken::random().to_hex());
    let (t1, t2) = (LeaseToken::random(), LeaseToken::random());
    epoch_of(holder.acquire(&key, t1, TTL, true).await?);
    let Acquire::Busy { .. } = waiter.acquire(&key, t2, TTL, true).await? else {
        panic!("the waiter got a held lock")
    };
    let mut woken = waiter.wakeups().watch(&key);
    assert_eq!(
        holder.extend(&key, t1, TTL).await?,
        Extend::Extended { waiting: 1 }
    );
    assert!(holder.release(&key, t1).await?.released);
    tokio::time::timeout(Duration::from_secs(5), woken.woken())
        .await
        .expect("the waiter is woken");
    epoch_of(waiter.acquire(&key, t2, TTL, true).await?);
    assert!(waiter.release(&key, t2).await?.released);
    epoch_of(holder.acquire(&key, t1, TTL, true).await?);
    holder.leave(&key).await?;
    assert!(holder.release(&key, t1).await?.released);

    // The read-write lock's scripts: a reader, a writer waiting and woken.
    let (rw_holder, rw_waiter) = (holder.rw().expect("rw"), waiter.rw().expect("rw"));
    let key = LockKey::from(LeaseToken::random().to_hex());
    let Acquire::Acquired { .. } = rw_holder.acquire_read(&key, t1, TTL, true).await? else {
        panic!("a free read lock was refused")
    };
    let Acquire::Busy { .. } = rw_waiter.acquire_write(&key, t2, TTL, true).await? else {
        panic!("a writer got a read-locked key")
    };
    let mut woken = waiter.wakeups().watch(&key);
    assert!(matches!(
        rw_holder.extend_read(&key, t1, TTL).await?,
        Extend::Extended { .. }
    ));
    assert!(rw_holder.release_read(&key, t1).await?.released);
    tokio::time::timeout(Duration::from_secs(5), woken.woken())
        .await
        .expect("the writer is woken");
    epoch_of(rw_waiter.acquire_write(&key, t2, TTL, true).await?);
    assert!(matches!(
        rw_waiter.extend_write(&key, t2, TTL).await?,
        Extend::Extended { .. }
    ));
    assert!(rw_waiter.release_write(&key, t2).await?.released);
    Ok(())
}

fn assert_no_permission(
    what: &str,
    result: lockflight::Result<impl std::fmt::Debug>,
    needle: &str,
) {
    match result {
        Err(e @ Error::NoPermission { .. }) => {
            let text = e.to_string();
            assert!(
                text.to_lowercase().contains(needle),
                "{what}: the message does not name {needle:?}: {text}"
            );
        }
        other => panic!("{what}: expected NoPermission, got {other:?}"),
    }
}

/// ACL users: without `evalsha`, without the key pattern or without the channel
/// pattern, `connect()` fails with `NoPermission` naming what was refused; the
/// minimal user succeeds and can run every operation; and every rule of the
/// minimal line is needed (without it, connect or some operation is refused).
#[tokio::test]
async fn connect_checks_acl_permissions_and_the_minimal_line_suffices() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let url = format!("redis://app:pw@127.0.0.1:{}/", server.port());
    let without = |rule: &str| -> Vec<&str> {
        MINIMAL_RULES
            .iter()
            .copied()
            .filter(|r| *r != rule)
            .collect()
    };
    let connect = || RedisBackend::builder(url.clone()).prefix("lfacl").connect();

    set_user(&mut admin, "app", &without("+evalsha")).await;
    assert_no_permission("without evalsha", connect().await, "evalsha");

    let mut rules = without("~lfacl:*");
    rules.push("~other:*");
    set_user(&mut admin, "app", &rules).await;
    assert_no_permission("without the key pattern", connect().await, "key");

    let mut rules = without("&lfacl:inst:*");
    rules.push("&other:*");
    set_user(&mut admin, "app", &rules).await;
    assert_no_permission("without the channel pattern", connect().await, "channel");

    set_user(&mut admin, "app", MINIMAL_RULES).await;
    exercise(&url).await.expect("the minimal ACL user");

    for rule in MINIMAL_RULES {
        set_user(&mut admin, "app", &without(rule)).await;
        match exercise(&url).await {
            Err(e @ Error::NoPermission { .. }) => println!("without {rule}: {e}"),
            other => panic!("without {rule}: expected NoPermission, got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// The notifier follows the runtime
// ---------------------------------------------------------------------------

/// A backend connected on a runtime that has ended restarts its notification
/// subscription on the runtime that uses it: a waiter there is woken by a release
/// well before its fallback timer (10 s here).
#[test]
fn the_notifier_restarts_on_a_new_runtime() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("respawn");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let waiter = first
        .block_on(
            RedisBackend::builder(server.url())
                .prefix(&prefix)
                .queue_entry_ttl(Duration::from_secs(30))
                .connect(),
        )
        .unwrap();
    drop(first);

    runtime().block_on(async {
        let holder = connect(&server.url(), &prefix).await;
        let key = LockKey::from("k");
        let token = LeaseToken::random();
        epoch_of(holder.acquire(&key, token, TTL, true).await.unwrap());
        let locker = Locker::builder(waiter.clone())
            .wait_timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let task = tokio::spawn(async move { locker.lock("k").await.map(drop) });
        let con = server.connection().await;
        let queue = name(&holder, &key, ":wq");
        let id = waiter.instance_id().to_owned();
        assert!(
            wait_until(Duration::from_secs(10), || {
                let (mut con, queue, id) = (con.clone(), queue.clone(), id.clone());
                async move { queued(&mut con, &queue, &id).await }
            })
            .await,
            "the waiter never queued"
        );
        let released = Instant::now();
        assert!(holder.release(&key, token).await.unwrap().released);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the waiter is woken well before its fallback timer")
            .unwrap()
            .expect("the waiter's lock");
        println!("woken {:?} after the release", released.elapsed());
    });
}

// ---------------------------------------------------------------------------
// The fast paths
// ---------------------------------------------------------------------------

/// The per-command call counts of `INFO commandstats` (commands run by scripts
/// included), without the admin connection's own `CONFIG` and `INFO`.
async fn command_calls(con: &mut MultiplexedConnection) -> std::collections::BTreeMap<String, u64> {
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
/// server: acquire GET lock, GET claim, GET tombstone, ZCARD queue, TIME, SET fence …
/// GET, SET lock; release GET lock, ZCARD queue, SET tombstone … GET, DEL lock — 11
/// commands and 2 `EVALSHA` per pair, and the fencing epochs still increase.
#[tokio::test]
async fn uncontended_acquire_and_release_run_the_fast_paths() {
    // A private server: commandstats counts every client's commands.
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let a = connect(&server.url(), &unique_prefix("fast-path")).await;
    let key = LockKey::from("fast");
    // The first pair starts the notifier (SUBSCRIBE) and creates the fence.
    let token = LeaseToken::random();
    let mut last = epoch_of(a.acquire(&key, token, TTL, true).await.unwrap());
    a.release(&key, token).await.unwrap();
    let mut admin = server.connection().await;
    query::<()>(&mut admin, redis::cmd("CONFIG").arg("RESETSTAT")).await;
    const PAIRS: u64 = 20;
    for _ in 0..PAIRS {
        let token = LeaseToken::random();
        let epoch = epoch_of(a.acquire(&key, token, TTL, true).await.unwrap());
        assert!(epoch > last, "epoch {epoch} after {last}");
        last = epoch;
        assert!(a.release(&key, token).await.unwrap().released);
    }
    let calls = command_calls(&mut admin).await;
    let expected: std::collections::BTreeMap<String, u64> = [
        ("evalsha", 2),
        ("get", 4),
        ("set", 3),
        ("zcard", 2),
        ("time", 1),
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
    let server = shared();
    let _log = server.log_on_panic();
    let a = connect(&server.url(), &unique_prefix("fence-ahead")).await;
    let mut con = server.connection().await;
    let key = LockKey::from("ahead");
    let (secs, micros): (u64, u64) = query(&mut con, &redis::cmd("TIME")).await;
    let ahead = (secs + 1_000) * 1_000_000 + micros;
    query::<()>(
        &mut con,
        redis::cmd("SET").arg(name(&a, &key, ":fence")).arg(ahead),
    )
    .await;
    for expected in [ahead + 1, ahead + 2] {
        let token = LeaseToken::random();
        assert_eq!(
            epoch_of(a.acquire(&key, token, TTL, true).await.unwrap()),
            expected
        );
        assert_eq!(
            get(&mut con, &name(&a, &key, ":fence")).await,
            Some(expected.to_string())
        );
        assert!(a.release(&key, token).await.unwrap().released);
    }
    // Behind the clock: the epoch is the server time.
    query::<()>(
        &mut con,
        redis::cmd("SET").arg(name(&a, &key, ":fence")).arg(5),
    )
    .await;
    let epoch = epoch_of(
        a.acquire(&key, LeaseToken::random(), TTL, true)
            .await
            .unwrap(),
    );
    assert!(
        epoch >= secs * 1_000_000 && epoch < ahead,
        "epoch {epoch} is not the server time"
    );
}
