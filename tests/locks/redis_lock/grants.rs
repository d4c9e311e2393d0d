//! The grant: a release gives the key to the next waiting instance on the server
//! (`lua/release.lua`), and the waiter takes the lease from the message alone.
//! Each failure of the message has a test: a grant lost on the way, one that
//! lands after its waiter timed out, one that lands after its waiter was
//! cancelled, a second copy of one (the waiter's process killed is
//! `caching::processes::a_waiter_that_crashes_after_revoking_strands_nobody`),
//! and no grant while a restarted server's quarantine lasts.
//!
//! Windows here are long (queue entries of 30 s, leases of 60 s), so a key left to
//! a grant nobody uses would stay locked for tens of seconds: every bound below
//! tells that apart from a key passed on at once with seconds to spare.

use super::*;

/// A queue entry's lifetime long enough that a stranded grant shows.
const ENTRY_TTL: Duration = Duration::from_secs(30);
/// What a test allows for a key passed on at once (a stranded one: 30 s).
const AT_ONCE: Duration = Duration::from_secs(10);

async fn connect(url: &str, prefix: &str) -> RedisBackend {
    connect_with(url, prefix, ENTRY_TTL).await
}

async fn connect_with(url: &str, prefix: &str, entry_ttl: Duration) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .queue_entry_ttl(entry_ttl)
        .connect()
        .await
        .unwrap()
}

fn locker_on(backend: RedisBackend, wait: Duration) -> Locker {
    Locker::builder(backend)
        .lease_ttl(Duration::from_secs(60))
        .wait_timeout(wait)
        .build()
        .unwrap()
}

/// Waits until `n` instances are queued for the mutex `key`.
async fn queued(server: &RedisServer, prefix: &str, key: &LockKey, n: i64) {
    let con = server.connection().await;
    let queue = testkit::names::queue(prefix, key);
    eventually("the waiters queued", || {
        let (mut con, queue) = (con.clone(), queue.clone());
        async move { zcard(&mut con, &queue).await == n }
    })
    .await;
}

/// A grant whose message is lost (the releasing instance may not publish on the
/// waiter's channel, so the script's PUBLISH is refused): the grant stands, and
/// the waiter's next refresh of its queue entry (a third of the entry's 9 s), with
/// the same token, is answered "already yours", well before the grant's window
/// (the entry's 9 s) would have freed the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_is_found_at_the_waiters_next_ask() {
    const ENTRY: Duration = Duration::from_secs(9);
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let prefix = "lfgrant";
    let mut admin = server.connection().await;
    let mut rules: Vec<&str> = testkit::MINIMAL_ACL_RULES.to_vec();
    rules.retain(|r| !r.starts_with('~') && !r.starts_with('&'));
    let all = [format!("~{prefix}:*"), format!("&{prefix}:inst:*")];
    let mut open: Vec<&str> = rules.clone();
    open.extend(all.iter().map(String::as_str));
    testkit::set_acl_user(&mut admin, "releaser", &open).await;
    let url = format!("redis://releaser:pw@127.0.0.1:{}/", server.port());
    let a = connect_with(&url, prefix, ENTRY).await;
    let b = connect_with(&server.url(), prefix, ENTRY).await;
    // From now on A may publish on its own channel only.
    let own = format!("&{prefix}:inst:{}", a.instance_id());
    let mut closed = rules.clone();
    closed.push(&all[0]);
    closed.push(&own);
    let holder = locker_on(a, Duration::from_secs(30));
    let waiter = locker_on(b, Duration::from_secs(30));
    let key = LockKey::from("k");
    let held = holder.lock(&key).await.unwrap();
    testkit::set_acl_user(&mut admin, "releaser", &closed).await;
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.lock(&key).await })
    };
    queued(&server, prefix, &key, 1).await;
    let asked = waiter.stats().acquire_attempts;
    held.release().await.unwrap();
    let guard = within(ENTRY * 2 / 3, "the waiter finds its grant", task)
        .await
        .unwrap()
        .unwrap();
    let stats = waiter.stats();
    assert_eq!(stats.grants, 0, "the message was refused, not delivered");
    assert!(
        stats.acquire_attempts > asked,
        "the lease came from an ask: {stats:?}"
    );
    // The key was the waiter's all along: nobody else could take it meanwhile.
    assert!(guard.fencing_token() > FencingToken::default());
    guard.release().await.unwrap();
}

/// A grant that lands for a waiter's token after the waiter gave up (the raw
/// backend calls of an acquire loop, so the order is the test's): the give-up's
/// release of the token (what an abandoned acquire's cleanup sends) deletes the
/// granted lock and grants it on to the next waiter at once; the given-up token
/// is never granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_its_waiter_gave_up_is_released_and_passed_on() {
    let (server, _log, prefix) = shared_scene("grant-late");
    let (a, b, c) = (
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
    );
    let key = LockKey::from("k");
    let ttl = Duration::from_secs(60);
    let (ta, tb, tc) = (
        LeaseToken::random(),
        LeaseToken::random(),
        LeaseToken::random(),
    );
    assert!(matches!(
        a.acquire(&key, ta, ttl, WhenBusy::Queue).await.unwrap(),
        Acquire::Acquired { .. }
    ));
    assert!(matches!(
        b.acquire(&key, tb, ttl, WhenBusy::Queue).await.unwrap(),
        Acquire::Busy { .. }
    ));
    // B is watched (as a waiting loop would be), so its notifier leaves the grant
    // to it; C queues behind B.
    let _b_waits = b
        .signals()
        .watch(lockflight::backend::LockKind::Mutex, &key);
    assert!(matches!(
        c.acquire(&key, tc, ttl, WhenBusy::Queue).await.unwrap(),
        Acquire::Busy { .. }
    ));
    assert!(a.release(&key, ta).await.unwrap().released);
    let mut con = server.connection().await;
    let lock = testkit::names::lock(&prefix, &key);
    assert_eq!(
        get_string(&mut con, &lock).await.as_deref(),
        Some(&*tb.to_hex())
    );
    // B gave up after the grant: its cleanup's release frees the key for C.
    let released = b.release(&key, tb).await.unwrap();
    assert!(released.released, "the granted lock was B's token's");
    assert_eq!(
        get_string(&mut con, &lock).await.as_deref(),
        Some(&*tc.to_hex())
    );
    // A late copy of B's ask cannot take it back: the token is retired.
    assert!(b.acquire(&key, tb, ttl, WhenBusy::Queue).await.is_err());
    assert!(c.release(&key, tc).await.unwrap().released);
}

/// A waiter that times out while another instance waits behind it: whatever the
/// order of its deadline, its cleanup and the holder's release, the key reaches the
/// next waiter at once (never stranded on the timed-out waiter's token), and the
/// timed-out call counts no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_times_out_strands_no_grant() {
    let (server, _log, prefix) = shared_scene("grant-timeout");
    let holder = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let late = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_millis(300),
    );
    let next = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let key = LockKey::from("k");
    let held = holder.lock(&key).await.unwrap();
    let gave_up = {
        let (late, key) = (late.clone(), key.clone());
        tokio::spawn(async move { late.lock(&key).await })
    };
    queued(server, &prefix, &key, 1).await;
    let waits = {
        let (next, key) = (next.clone(), key.clone());
        tokio::spawn(async move { next.lock(&key).await })
    };
    assert!(matches!(gave_up.await.unwrap(), Err(Error::Timeout { .. })));
    held.release().await.unwrap();
    let guard = within(AT_ONCE, "the next waiter", waits)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(late.stats().acquired, 0);
    guard.release().await.unwrap();
    wait_idle(&[holder, late, next], Duration::from_secs(10)).await;
}

/// A waiter whose call is cancelled (its future dropped) while the holder releases
/// at the same moment: the grant may land for the cancelled waiter's token before
/// its cleanup does; either way the next waiter gets the key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_strands_no_grant() {
    let (server, _log, prefix) = shared_scene("grant-cancel");
    let holder = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let cancelled = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let next = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let key = LockKey::from("k");
    for round in 0..5 {
        let held = holder.lock(&key).await.unwrap();
        let dropped = {
            let (cancelled, key) = (cancelled.clone(), key.clone());
            tokio::spawn(async move { cancelled.lock(&key).await })
        };
        queued(server, &prefix, &key, 1).await;
        let waits = {
            let (next, key) = (next.clone(), key.clone());
            tokio::spawn(async move { next.lock(&key).await })
        };
        queued(server, &prefix, &key, 2).await;
        // The cancel and the release race: the grant goes to whichever the
        // script sees first.
        dropped.abort();
        held.release().await.unwrap();
        let guard = within(AT_ONCE, &format!("round {round}: the next waiter"), waits)
            .await
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
    assert_eq!(
        cancelled.stats().acquired,
        0,
        "a cancelled call took a lease"
    );
    wait_idle(&[holder, cancelled, next], Duration::from_secs(10)).await;
}

/// A grant message delivered twice (a Cluster may deliver one copy through the
/// key's node and one over the cluster bus): the second copy, arriving while the
/// granted lease is held, changes nothing, not even after the grace period in
/// which an unwanted grant is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_of_a_taken_grant_changes_nothing() {
    let (server, _log, prefix) = shared_scene("grant-twice");
    let a = connect(&server.url(), &prefix).await;
    let b = connect(&server.url(), &prefix).await;
    let b_channel = testkit::names::channel(&prefix, b.instance_id());
    let (holder, waiter) = (
        locker_on(a, Duration::from_secs(30)),
        locker_on(b, Duration::from_secs(30)),
    );
    let key = LockKey::from("k");
    let held = holder.lock(&key).await.unwrap();
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.lock(&key).await })
    };
    queued(server, &prefix, &key, 1).await;
    held.release().await.unwrap();
    let guard = within(AT_ONCE, "the grant", task).await.unwrap().unwrap();
    assert_eq!(waiter.stats().grants, 1);
    let mut con = server.connection().await;
    let lock = testkit::names::lock(&prefix, &key);
    let token = get_string(&mut con, &lock).await.expect("the granted lock");
    let copy = [
        &[0xF9][..],
        token.as_bytes(),
        format!("{} 0 3000 - 0 ", guard.fencing_token().epoch).as_bytes(),
        key.as_bytes(),
    ]
    .concat();
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&b_channel)
        .arg(copy)
        .query_async(&mut con)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get_string(&mut con, &lock).await, Some(token));
    guard.release().await.expect("the lease is still held");
}

/// A release during a restart's quarantine (grants wait: `redis/life.rs`) does not
/// grant: the head is woken with a claim, as before, and asks (and is told to wait
/// by its own gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_grant_during_a_restarts_quarantine() {
    let (server, _log, prefix) = shared_scene("grant-quarantine");
    let (a, b) = (
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
    );
    let key = LockKey::from("k");
    let ttl = Duration::from_secs(60);
    let (ta, tb) = (LeaseToken::random(), LeaseToken::random());
    assert!(matches!(
        a.acquire(&key, ta, ttl, WhenBusy::Queue).await.unwrap(),
        Acquire::Acquired { .. }
    ));
    assert!(matches!(
        b.acquire(&key, tb, ttl, WhenBusy::Queue).await.unwrap(),
        Acquire::Busy { .. }
    ));
    let _b_waits = b
        .signals()
        .watch(lockflight::backend::LockKind::Mutex, &key);
    // A quarantine a minute long, as an instance of an earlier life would write.
    let mut con = server.connection().await;
    let life = format!("{prefix}:life").into_bytes();
    let started = get_string(&mut con, &life)
        .await
        .expect("the server's life");
    let started = started.split(' ').next().unwrap().to_owned();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let until = secs * 1000 + micros / 1000 + 60_000;
    let _: () = redis::cmd("SET")
        .arg(&life)
        .arg(format!("{started} {until}"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(a.release(&key, ta).await.unwrap().released);
    let lock = testkit::names::lock(&prefix, &key);
    assert_eq!(
        get_string(&mut con, &lock).await,
        None,
        "granted in quarantine"
    );
    let claim = [&lock[..], b":claim"].concat();
    assert_eq!(
        get_string(&mut con, &claim).await.as_deref(),
        Some(b.instance_id()),
        "the head was given a claim instead"
    );
}
