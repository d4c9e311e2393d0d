//! The write grant: a release that frees a read-write lock gives its write lease
//! to the earliest waiting writer on the server (`lua/rw_release.lua`), and the
//! writer takes it from the message alone. As for the mutex's grant
//! (`redis_lock::grants`), each failure of the message has a test: a grant lost on
//! the way, one that lands after its writer gave up, a writer that times out, one
//! that is cancelled, a writer whose process is killed while it waits (a child
//! process), a second copy of one, one that arrives after the writer's own ask
//! took the lease; and a released token is never
//! granted, nor is anything granted while a read lease lives or while a
//! restarted server's quarantine lasts.
//!
//! Windows here are long (waiting entries of 30 s, leases of 60 s), so a key left
//! to a grant nobody uses would stay locked for tens of seconds: every bound below
//! tells that apart from a key passed on at once with seconds to spare.

use lockflight::backend::rw::RwBackend;
use lockflight::backend::{Acquire, LeaseToken, LockBackend, LockKind, WhenBusy};
use testkit::{RedisServer, get_string, within};

use super::*;

/// A waiting entry's lifetime long enough that a stranded grant shows.
const ENTRY_TTL: Duration = Duration::from_secs(30);
/// What a test allows for a key passed on at once (a stranded one: 30 s).
const AT_ONCE: Duration = Duration::from_secs(10);
/// The lease TTL of every acquire here.
const TTL: Duration = Duration::from_secs(60);

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
        .lease_ttl(TTL)
        .wait_timeout(wait)
        .build()
        .unwrap()
}

/// Waits until `n` writers wait for the read-write lock `key`.
async fn writers_wait(server: &RedisServer, prefix: &str, key: &LockKey, n: i64) {
    let con = server.connection().await;
    let writers = rw_name(prefix, key, ":ww");
    eventually("the writers waiting", || {
        let (mut con, writers) = (con.clone(), writers.clone());
        async move { zcard(&mut con, &writers).await == n }
    })
    .await;
}

/// The token holding the write lease of `key`, if any.
async fn write_holder(server: &RedisServer, prefix: &str, key: &LockKey) -> Option<String> {
    let mut con = server.connection().await;
    get_string(&mut con, &rw_name(prefix, key, ":wr")).await
}

/// Asks `backend` for the write lease of `key` with `token`, waiting; whether it
/// was granted at once.
async fn ask_write(backend: &RedisBackend, key: &LockKey, token: LeaseToken) -> bool {
    matches!(
        backend
            .acquire_write(key, token, TTL, WhenBusy::Queue)
            .await
            .unwrap(),
        Acquire::Acquired { .. }
    )
}

/// A writer waits behind a write lease, then behind a read lease, of another
/// instance: each release grants it the write lease on the server, and it holds
/// from the message with no request of its own, with a greater fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_write_lease_to_a_waiting_writer() {
    let (server, _log, prefix) = shared_scene("wgrant");
    let holder = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let waiter = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let key = LockKey::from("k");
    // Behind a writer.
    let held = holder.rwlock(key.clone()).write().await.unwrap();
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.rwlock(key).write().await })
    };
    writers_wait(server, &prefix, &key, 1).await;
    let before = waiter.stats();
    let first = held.fencing_token();
    held.release().await.unwrap();
    let guard = within(AT_ONCE, "the grant", task).await.unwrap().unwrap();
    let delta = waiter.stats() - before;
    assert_eq!(
        (delta.grants, delta.acquire_attempts),
        (1, 0),
        "the writer holds from the grant, with no request: {delta:?}"
    );
    assert!(guard.fencing_token() > first);
    let second = guard.fencing_token();
    guard.release().await.unwrap();
    // Behind the last live read lease.
    let read = holder.rwlock(key.clone()).read().await.unwrap();
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.rwlock(key).write().await })
    };
    writers_wait(server, &prefix, &key, 1).await;
    let before = waiter.stats();
    read.release().await.unwrap();
    let guard = within(AT_ONCE, "the grant", task).await.unwrap().unwrap();
    let delta = waiter.stats() - before;
    assert_eq!(
        (delta.grants, delta.acquire_attempts),
        (1, 0),
        "the writer holds from the grant, with no request: {delta:?}"
    );
    assert!(guard.fencing_token() > second);
    guard.release().await.unwrap();
    wait_idle(&[holder, waiter]).await;
}

/// A write grant whose message is lost (the releasing instance may not publish on
/// the writer's channel, so the script's PUBLISH is refused): the grant stands,
/// and the writer's next ask (a third of the entry's 9 s), with the same token, is
/// answered "already yours", well before the grant's window (the entry's 9 s)
/// would have freed the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_write_grant_is_found_at_the_writers_next_ask() {
    const ENTRY: Duration = Duration::from_secs(9);
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let prefix = "lfwgrant";
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
    let held = holder.rwlock(key.clone()).write().await.unwrap();
    testkit::set_acl_user(&mut admin, "releaser", &closed).await;
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.rwlock(key).write().await })
    };
    writers_wait(&server, prefix, &key, 1).await;
    let token = {
        let mut con = server.connection().await;
        let writers = rw_name(prefix, &key, ":ww");
        let tokens: Vec<String> = redis::cmd("ZRANGE")
            .arg(&writers)
            .arg(0)
            .arg(0)
            .query_async(&mut con)
            .await
            .unwrap();
        tokens[0].clone()
    };
    let asked = waiter.stats().acquire_attempts;
    held.release().await.unwrap();
    // Granted on the server, though nobody was told.
    assert_eq!(
        write_holder(&server, prefix, &key).await.as_deref(),
        Some(&*token)
    );
    let guard = within(ENTRY * 2 / 3, "the writer finds its grant", task)
        .await
        .unwrap()
        .unwrap();
    let stats = waiter.stats();
    assert_eq!(stats.grants, 0, "the message was refused, not delivered");
    assert!(
        stats.acquire_attempts > asked,
        "the lease came from an ask: {stats:?}"
    );
    assert!(guard.fencing_token() > FencingToken::default());
    guard.release().await.unwrap();
}

/// A write grant that lands for a writer's token after the writer gave up (the
/// raw backend calls of an acquire loop, so the order is the test's): the
/// give-up's release of the token (what an abandoned acquire's cleanup sends)
/// deletes the granted lease and grants it on to the next writer at once; the
/// given-up token is never granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_grant_after_its_writer_gave_up_is_released_and_passed_on() {
    let (server, _log, prefix) = shared_scene("wgrant-late");
    let (a, b, c) = (
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
    );
    let key = LockKey::from("k");
    let (ta, tb, tc) = (
        LeaseToken::random(),
        LeaseToken::random(),
        LeaseToken::random(),
    );
    assert!(ask_write(&a, &key, ta).await);
    assert!(!ask_write(&b, &key, tb).await);
    // C's entry is later than B's (by the server's ms clock).
    tokio::time::sleep(Duration::from_millis(2)).await;
    // B and C are watched (as waiting loops would be), so their notifiers leave
    // the grants to them; C waits behind B.
    let _b_waits = b.signals().watch(LockKind::ReadWrite, &key);
    let _c_waits = c.signals().watch(LockKind::ReadWrite, &key);
    assert!(!ask_write(&c, &key, tc).await);
    assert!(a.release_write(&key, ta).await.unwrap().released);
    assert_eq!(
        write_holder(server, &prefix, &key).await.as_deref(),
        Some(&*tb.to_hex())
    );
    // B gave up after the grant: its cleanup's release frees the key for C.
    let released = b.release_write(&key, tb).await.unwrap();
    assert!(released.released, "the granted lease was B's token's");
    assert_eq!(
        write_holder(server, &prefix, &key).await.as_deref(),
        Some(&*tc.to_hex())
    );
    // A late copy of B's ask cannot take it back: the token is retired.
    assert!(
        b.acquire_write(&key, tb, TTL, WhenBusy::Queue)
            .await
            .is_err()
    );
    assert!(c.release_write(&key, tc).await.unwrap().released);
    assert_eq!(write_holder(server, &prefix, &key).await, None);
}

/// A writer that times out while another writer waits behind it: whatever the
/// order of its deadline, its cleanup and the holder's release, the next writer
/// takes the key from a grant at once (never stranded on the timed-out writer's
/// token), and the timed-out call counts no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_times_out_strands_no_grant() {
    let (server, _log, prefix) = shared_scene("wgrant-timeout");
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
    let held = holder.rwlock(key.clone()).write().await.unwrap();
    let gave_up = {
        let (late, key) = (late.clone(), key.clone());
        tokio::spawn(async move { late.rwlock(key).write().await })
    };
    writers_wait(server, &prefix, &key, 1).await;
    let waits = {
        let (next, key) = (next.clone(), key.clone());
        tokio::spawn(async move { next.rwlock(key).write().await })
    };
    writers_wait(server, &prefix, &key, 2).await;
    assert!(matches!(gave_up.await.unwrap(), Err(Error::Timeout { .. })));
    held.release().await.unwrap();
    let guard = within(AT_ONCE, "the next writer", waits)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(late.stats().acquired, 0);
    assert_eq!(next.stats().grants, 1, "the next writer took a grant");
    guard.release().await.unwrap();
    wait_idle(&[holder, late, next]).await;
}

/// A writer whose call is cancelled (its future dropped) while the holder releases
/// at the same moment: the grant may land for the cancelled writer's token before
/// its cleanup does; either way the next writer takes the key from a grant at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_writer_strands_no_grant() {
    const ROUNDS: u64 = 5;
    let (server, _log, prefix) = shared_scene("wgrant-cancel");
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
    for round in 0..ROUNDS {
        let held = holder.rwlock(key.clone()).write().await.unwrap();
        let dropped = {
            let (cancelled, key) = (cancelled.clone(), key.clone());
            tokio::spawn(async move { cancelled.rwlock(key).write().await })
        };
        writers_wait(server, &prefix, &key, 1).await;
        let waits = {
            let (next, key) = (next.clone(), key.clone());
            tokio::spawn(async move { next.rwlock(key).write().await })
        };
        writers_wait(server, &prefix, &key, 2).await;
        // The cancel and the release race: the grant goes to whichever the
        // script sees first.
        dropped.abort();
        held.release().await.unwrap();
        let guard = within(AT_ONCE, &format!("round {round}: the next writer"), waits)
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
    assert_eq!(
        next.stats().grants,
        ROUNDS,
        "each round's key came by a grant"
    );
    wait_idle(&[holder, cancelled, next]).await;
}

/// A write grant message delivered twice (a Cluster may deliver one copy through
/// the key's node and one over the cluster bus): the second copy, arriving while
/// the granted lease is held, changes nothing, not even after the grace period in
/// which an unwanted grant is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_of_a_taken_write_grant_changes_nothing() {
    let (server, _log, prefix) = shared_scene("wgrant-twice");
    let a = connect(&server.url(), &prefix).await;
    let b = connect(&server.url(), &prefix).await;
    let b_channel = testkit::names::channel(&prefix, b.instance_id());
    let (holder, waiter) = (
        locker_on(a, Duration::from_secs(30)),
        locker_on(b, Duration::from_secs(30)),
    );
    let key = LockKey::from("k");
    let held = holder.rwlock(key.clone()).write().await.unwrap();
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.rwlock(key).write().await })
    };
    writers_wait(server, &prefix, &key, 1).await;
    held.release().await.unwrap();
    let guard = within(AT_ONCE, "the grant", task).await.unwrap().unwrap();
    assert_eq!(waiter.stats().grants, 1);
    let mut con = server.connection().await;
    let token = write_holder(server, &prefix, &key)
        .await
        .expect("the granted lease");
    let copy = [
        &[0xF8][..],
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
    assert_eq!(write_holder(server, &prefix, &key).await, Some(token));
    guard.release().await.expect("the lease is still held");
}

/// A copy of a write grant's message that reaches the writer's instance after
/// the writer's own ask took the lease ("already yours", as after a lost message)
/// and after the writer stopped waiting (a lease not yet registered, or one whose
/// release is on the wire) changes nothing: the give-back deletes a write lease
/// only while the grant's mark shows that no ask of the token took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_grant_for_a_token_that_asked_since_changes_nothing() {
    let (server, _log, prefix) = shared_scene("wgrant-asked");
    let (a, b) = (
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
    );
    let key = LockKey::from("k");
    let (ta, tb) = (LeaseToken::random(), LeaseToken::random());
    assert!(ask_write(&a, &key, ta).await);
    // B waits (watched, as a waiting loop is, so its notifier keeps the grant).
    let b_waits = b.signals().watch(LockKind::ReadWrite, &key);
    assert!(!ask_write(&b, &key, tb).await);
    assert!(a.release_write(&key, ta).await.unwrap().released);
    assert_eq!(
        write_holder(server, &prefix, &key).await.as_deref(),
        Some(&*tb.to_hex())
    );
    // B's next ask finds the lease its own; then it stops waiting.
    assert!(ask_write(&b, &key, tb).await);
    drop(b_waits);
    let copy = [
        &[0xF8][..],
        tb.to_hex().as_bytes(),
        b"1 0 3000 - 0 ",
        key.as_bytes(),
    ]
    .concat();
    let mut con = server.connection().await;
    let receivers: i64 = redis::cmd("PUBLISH")
        .arg(testkit::names::channel(&prefix, b.instance_id()))
        .arg(copy)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(receivers, 1, "B's notifier reads the copy");
    // Longer than the notifier's grace before it gives an unwanted grant back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        write_holder(server, &prefix, &key).await.as_deref(),
        Some(&*tb.to_hex()),
        "the lease B's ask took is still B's"
    );
    assert!(b.release_write(&key, tb).await.unwrap().released);
}

/// A writer whose token's release landed is never granted: withdrawn, the next
/// writer is granted instead; and were its entries still there (a release of the
/// token that found them left: the script's own record check), it still is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_token_is_never_granted() {
    let (server, _log, prefix) = shared_scene("wgrant-retired");
    let (a, b, c) = (
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
    );
    let mut con = server.connection().await;
    for (phase, name) in ["withdrawn", "entries left"].into_iter().zip(["k1", "k2"]) {
        let key = LockKey::from(name);
        let _b_waits = b.signals().watch(LockKind::ReadWrite, &key);
        let _c_waits = c.signals().watch(LockKind::ReadWrite, &key);
        let (ta, tb, tc) = (
            LeaseToken::random(),
            LeaseToken::random(),
            LeaseToken::random(),
        );
        assert!(ask_write(&a, &key, ta).await);
        assert!(!ask_write(&b, &key, tb).await);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(!ask_write(&c, &key, tc).await);
        let writers = rw_name(&prefix, &key, ":ww");
        let entry = suffixed(
            &rw_name(&prefix, &key, ":wr"),
            &format!(":g:{}", tb.to_hex()),
        );
        let score: i64 = redis::cmd("ZSCORE")
            .arg(&writers)
            .arg(tb.to_hex())
            .query_async(&mut con)
            .await
            .unwrap();
        let value = get_string(&mut con, &entry).await;
        // B gives up before A's release lands.
        assert!(!b.release_write(&key, tb).await.unwrap().released);
        if phase == "entries left" {
            let value = value.expect("B's grant entry");
            let _: () = redis::cmd("ZADD")
                .arg(&writers)
                .arg(score - 1)
                .arg(tb.to_hex())
                .query_async(&mut con)
                .await
                .unwrap();
            let _: () = redis::cmd("SET")
                .arg(&entry)
                .arg(&value)
                .arg("PX")
                .arg(30_000)
                .query_async(&mut con)
                .await
                .unwrap();
        }
        assert!(a.release_write(&key, ta).await.unwrap().released);
        let holder = write_holder(server, &prefix, &key).await;
        assert_ne!(
            holder.as_deref(),
            Some(&*tb.to_hex()),
            "{phase}: B's retired token"
        );
        if phase == "withdrawn" {
            assert_eq!(
                holder.as_deref(),
                Some(&*tc.to_hex()),
                "{phase}: the next writer is granted"
            );
            assert!(c.release_write(&key, tc).await.unwrap().released);
        } else {
            assert_eq!(
                holder, None,
                "{phase}: nobody is granted, the waiters woken"
            );
        }
    }
}

/// No write grant while a read lease lives: the release of one of two read leases
/// leaves the writer waiting; the release of the last one grants it the write
/// lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_write_grant_while_a_read_lease_is_live() {
    let (server, _log, prefix) = shared_scene("wgrant-readers");
    let (a, b, c) = (
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
    );
    let key = LockKey::from("k");
    let (ra, rc, tb) = (
        LeaseToken::random(),
        LeaseToken::random(),
        LeaseToken::random(),
    );
    let read = |backend: &RedisBackend, token| {
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            matches!(
                backend
                    .acquire_read(&key, token, TTL, WhenBusy::Queue)
                    .await
                    .unwrap(),
                Acquire::Acquired { .. }
            )
        }
    };
    assert!(read(&a, ra).await);
    assert!(read(&c, rc).await);
    assert!(!ask_write(&b, &key, tb).await);
    let _b_waits = b.signals().watch(LockKind::ReadWrite, &key);
    assert!(a.release_read(&key, ra).await.unwrap().released);
    assert_eq!(
        write_holder(server, &prefix, &key).await,
        None,
        "granted while a read lease lives"
    );
    assert!(c.release_read(&key, rc).await.unwrap().released);
    assert_eq!(
        write_holder(server, &prefix, &key).await.as_deref(),
        Some(&*tb.to_hex()),
        "the last read lease's release grants"
    );
    assert!(b.release_write(&key, tb).await.unwrap().released);
}

/// A release during a restart's quarantine (grants wait: `redis/life.rs`) does not
/// grant the write lease: the waiting writer's instance is woken, as before, and
/// asks. Once the quarantine is over, a release grants again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_write_grant_during_a_restarts_quarantine() {
    let (server, _log, prefix) = shared_scene("wgrant-quarantine");
    let (a, b) = (
        connect(&server.url(), &prefix).await,
        connect(&server.url(), &prefix).await,
    );
    let mut con = server.connection().await;
    let life = format!("{prefix}:life").into_bytes();
    for (quarantined, name) in [(true, "k1"), (false, "k2")] {
        let key = LockKey::from(name);
        let _b_waits = b.signals().watch(LockKind::ReadWrite, &key);
        let (ta, tb) = (LeaseToken::random(), LeaseToken::random());
        assert!(ask_write(&a, &key, ta).await);
        assert!(!ask_write(&b, &key, tb).await);
        let started = get_string(&mut con, &life)
            .await
            .expect("the server's life");
        let started = started.split(' ').next().unwrap().to_owned();
        if quarantined {
            // A quarantine a minute long, as an instance of an earlier life
            // would write.
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query_async(&mut con).await.unwrap();
            let until = secs * 1000 + micros / 1000 + 60_000;
            let _: () = redis::cmd("SET")
                .arg(&life)
                .arg(format!("{started} {until}"))
                .query_async(&mut con)
                .await
                .unwrap();
        }
        let waiting = rw_name(&prefix, &key, ":rwq");
        assert_eq!(zcard(&mut con, &waiting).await, 1, "B's instance waits");
        assert!(a.release_write(&key, ta).await.unwrap().released);
        let holder = write_holder(server, &prefix, &key).await;
        if quarantined {
            assert_eq!(holder, None, "granted in quarantine");
            assert_eq!(
                zcard(&mut con, &waiting).await,
                0,
                "the waiting instances were woken instead"
            );
            // The quarantine ends.
            let _: () = redis::cmd("SET")
                .arg(&life)
                .arg(&started)
                .query_async(&mut con)
                .await
                .unwrap();
        } else {
            assert_eq!(
                holder.as_deref(),
                Some(&*tb.to_hex()),
                "granted after the quarantine"
            );
            assert!(b.release_write(&key, tb).await.unwrap().released);
        }
    }
}

const DEAD_WRITER_ENV: &str = "LOCKFLIGHT_WRITE_GRANT_DEAD_WRITER";
/// The dead writer's waiting-entry lifetime: the window of a grant made to it.
const DEAD_ENTRY_TTL: Duration = Duration::from_secs(15);

/// Not a test: the child process of
/// [`a_writer_killed_while_its_grant_is_made_holds_the_key_for_its_window_only`].
/// It names its instance and waits as a writer until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of a_writer_killed_while_its_grant_is_made_holds_the_key_for_its_window_only"]
async fn dead_writer_child() {
    if std::env::var_os(DEAD_WRITER_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let backend = RedisBackend::builder(var("LOCKFLIGHT_CHILD_URL"))
        .prefix(var("LOCKFLIGHT_CHILD_PREFIX"))
        .queue_entry_ttl(DEAD_ENTRY_TTL)
        .connect()
        .await
        .expect("child: connect");
    testkit::tell_parent(&format!("LFCHILD ID {}", backend.instance_id()));
    let locker = locker_on(backend, Duration::from_secs(120));
    let _never = locker.rwlock(var("LOCKFLIGHT_CHILD_KEY")).write().await;
    panic!("child: got the write lease it should have been killed waiting for");
}

/// A writer whose process is killed while it waits, at the head of the writers:
/// the release grants it the write lease (its entry is fresh), nobody takes the
/// grant, and the key is held for the grant's window only (the dead writer's
/// entry lifetime, 15 s), not for the lease TTL (60 s): the next writer gets it
/// when the window ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_while_its_grant_is_made_holds_the_key_for_its_window_only() {
    let (server, _log, prefix) = shared_scene("wgrant-dead");
    let holder = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let key = LockKey::from("k");
    let held = holder.rwlock(key.clone()).write().await.unwrap();
    let (mut child, mut lines) = testkit::spawn_holder_child(
        &testkit::test_path(module_path!(), "dead_writer_child"),
        DEAD_WRITER_ENV,
        server.url(),
        &prefix,
        "k",
    );
    testkit::child_line(&mut lines, "LFCHILD ID").await;
    writers_wait(server, &prefix, &key, 1).await;
    let mut con = server.connection().await;
    let dead: Vec<String> = redis::cmd("ZRANGE")
        .arg(rw_name(&prefix, &key, ":ww"))
        .arg(0)
        .arg(0)
        .query_async(&mut con)
        .await
        .unwrap();
    // B waits behind it (its entry, of 30 s, expires later: it is not the head).
    let waiter = locker_on(
        connect(&server.url(), &prefix).await,
        Duration::from_secs(60),
    );
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let guard = waiter.rwlock(key).write().await;
            (guard, tokio::time::Instant::now())
        })
    };
    writers_wait(server, &prefix, &key, 2).await;
    child.kill().await.unwrap();
    held.release().await.unwrap();
    let released = tokio::time::Instant::now();
    assert_eq!(
        write_holder(server, &prefix, &key).await.as_deref(),
        Some(&*dead[0]),
        "the release granted the write lease to the dead writer"
    );
    let (guard, at) = within(Duration::from_secs(50), "B's write lease", task)
        .await
        .unwrap();
    let guard = guard.unwrap();
    let waited = at - released;
    assert!(
        waited < Duration::from_secs(40),
        "B waited {waited:?}: the dead writer's grant outlived its window (15 s)"
    );
    guard.release().await.unwrap();
}
