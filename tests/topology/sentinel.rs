//! lockflight through Sentinel: one primary, two replicas, three sentinels, started
//! once for this test binary ([`testkit::sentinel::Sentinels`]); the tests run one
//! at a time (`SERIAL`) because they fail the primary over.
//!
//! * `follows_sentinel_failover_during_hot_key_workload`: `SENTINEL FAILOVER` under
//!   a hot-key workload; the backends follow the new primary within a bound (printed:
//!   the failover-follow time), the workload goes on, tokens never go back.
//! * `follows_a_killed_primary_during_hot_key_workload`: the same with the primary
//!   killed (`SIGKILL`); it comes back as a replica.
//! * `replica_ack_never_grants_a_write_no_replica_has`: with `replica_ack(1, …)` and
//!   the replicas paused, an acquire fails with `Refused { code: "NOREPLICAS" }` and
//!   leaves no lock behind; once they resume, it is granted.
//! * `a_release_lost_in_a_failover_is_repeated_on_the_new_primary`: a mutex, a
//!   write lease and a permit (default 30 s TTL) released on the old primary
//!   after the promotion, before the backend follows: another instance gets each
//!   within 10 s of the release (issue 20).
//! * `a_password_protected_primary_is_reached_with_primary_connection_info`: a
//!   second set of its own ([`Sentinels::start_with_auth`]: an ACL user on the data
//!   nodes, a password on the sentinels). Without `primary_connection_info`,
//!   `connect` fails promptly naming authentication; with it, a mutex, a write lease
//!   and a permit (with `replica_ack`) work, in the database it names, and after
//!   `SENTINEL FAILOVER` the backends follow the new primary with the same
//!   credentials (commands, acknowledged writes, the notification subscription).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockflight::{Error, FencingToken, LockKey, Locker, RedisBackend};
use testkit::sentinel::{Auth, MASTER, Sentinels};
use testkit::{AllThree, join_all, names, takes_all_three_after, unique_prefix, wait_until};
use tokio::sync::OnceCell;
use tokio::task::JoinSet;

static TOPOLOGY: OnceCell<Sentinels> = OnceCell::const_new();
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn topology() -> &'static Sentinels {
    TOPOLOGY.get_or_init(Sentinels::start).await
}

async fn backend(prefix: &str, ack: bool) -> RedisBackend {
    let t = topology().await;
    let mut builder = RedisBackend::sentinel(t.sentinel_urls(), MASTER).prefix(prefix);
    if ack {
        builder = builder.replica_ack(1, Duration::from_millis(100));
    }
    builder
        .connect()
        .await
        .expect("connect through the sentinels")
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    SentinelFailover,
    KillPrimary,
}

/// 2 instances × 8 tasks run critical sections on one hot key while the primary
/// fails over. Returns (failover time, follow time, longest stall).
async fn failover_under_load(fault: Fault) -> (Duration, Duration, Duration) {
    let t = topology().await;
    t.wait_settled(Duration::from_secs(60)).await;
    let prefix = unique_prefix(&format!("{fault:?}"));
    let backends = [backend(&prefix, false).await, backend(&prefix, false).await];
    let old = t.primary_addr().await;
    for b in &backends {
        assert_eq!(b.server(), old);
    }
    let lockers: Vec<Locker> = backends
        .iter()
        .map(|b| {
            Locker::builder(b.clone())
                .lease_ttl(Duration::from_secs(3))
                .wait_timeout(Duration::from_secs(60))
                .build()
                .unwrap()
        })
        .collect();
    let key = LockKey::from("hot");
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let completions = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let tokens = Arc::new(Mutex::new(Vec::<FencingToken>::new()));
    let mut tasks = JoinSet::new();
    for l in &lockers {
        for _ in 0..8 {
            let (l, key, stop, inside, overlaps, done, completions, tokens) = (
                l.clone(),
                key.clone(),
                stop.clone(),
                inside.clone(),
                overlaps.clone(),
                done.clone(),
                completions.clone(),
                tokens.clone(),
            );
            tasks.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let g = l.lock(&key).await.expect("lock across the failover");
                    tokens.lock().unwrap().push(g.fencing_token());
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let _ = g.release().await;
                    done.fetch_add(1, Ordering::SeqCst);
                    completions.lock().unwrap().push(Instant::now());
                }
            });
        }
    }
    assert!(
        wait_until(Duration::from_secs(20), || {
            let n = done.load(Ordering::SeqCst);
            async move { n >= 100 }
        })
        .await
    );
    let started = Instant::now();
    match fault {
        Fault::SentinelFailover => t.failover().await,
        Fault::KillPrimary => t.by_addr(&old).kill(),
    }
    let new = t.wait_primary_change(&old, Duration::from_secs(30)).await;
    let switched = Instant::now();
    // Every backend follows the new primary.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let all = backends.iter().all(|b| b.server() == new);
            async move { all }
        })
        .await,
        "the backends did not follow the new primary {new}: {:?}",
        backends
            .iter()
            .map(RedisBackend::server)
            .collect::<Vec<_>>()
    );
    let followed = Instant::now();
    // The workload goes on on the new primary.
    let at_follow = done.load(Ordering::SeqCst);
    assert!(
        wait_until(Duration::from_secs(20), || {
            let n = done.load(Ordering::SeqCst);
            async move { n >= at_follow + 100 }
        })
        .await,
        "the workload stalled after the failover"
    );
    let resumed = {
        let c = completions.lock().unwrap();
        c.iter().copied().find(|&i| i > switched).unwrap()
    };
    stop.store(true, Ordering::SeqCst);
    join_all(tasks).await;
    let stall = {
        let c = completions.lock().unwrap();
        c.windows(2)
            .map(|w| w[1].saturating_duration_since(w[0]))
            .max()
            .unwrap()
    };
    let tokens = tokens.lock().unwrap().clone();
    let backwards = tokens.windows(2).filter(|w| w[0] >= w[1]).count();
    let lost: u64 = lockers.iter().map(|l| l.stats().leases_lost).sum();
    let failover = switched - started;
    let follow = followed.saturating_duration_since(switched);
    println!(
        "{fault:?}: sentinels named {new} {failover:?} after the fault; backends followed \
         {follow:?} later; first critical section after the switch {:?} after it; longest \
         stall {stall:?}; {} sections; {} overlaps; {lost} leases lost; {backwards} token \
         inversions",
        resumed.saturating_duration_since(switched),
        done.load(Ordering::SeqCst),
        overlaps.load(Ordering::SeqCst),
    );
    assert!(
        follow <= Duration::from_secs(2),
        "following the new primary took {follow:?}"
    );
    assert_eq!(backwards, 0, "fencing tokens went back across the failover");
    if matches!(fault, Fault::KillPrimary) {
        t.by_addr(&old).restart();
        let _: () = t
            .by_addr(&old)
            .cmd(&[
                "REPLICAOF",
                new.split(':').next().unwrap(),
                new.split(':').nth(1).unwrap(),
            ])
            .await
            .unwrap();
    }
    t.wait_settled(Duration::from_secs(60)).await;
    (failover, follow, stall)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_sentinel_failover_during_hot_key_workload() {
    let _serial = SERIAL.lock().await;
    failover_under_load(Fault::SentinelFailover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_killed_primary_during_hot_key_workload() {
    let _serial = SERIAL.lock().await;
    failover_under_load(Fault::KillPrimary).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_ack_never_grants_a_write_no_replica_has() {
    let _serial = SERIAL.lock().await;
    let t = topology().await;
    t.wait_settled(Duration::from_secs(60)).await;
    let prefix = unique_prefix("ack");
    let b = backend(&prefix, true).await;
    let locker = Locker::builder(b.clone())
        .wait_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let key = LockKey::from("k");
    // Acknowledged: granted.
    locker.lock(&key).await.unwrap().release().await.unwrap();

    let primary = t.primary_addr().await;
    let replicas: Vec<_> = t
        .data
        .iter()
        .filter(|n| n.is_running() && n.hostport() != primary)
        .collect();
    for r in &replicas {
        r.pause();
    }
    let outcome = locker.try_lock(&key).await;
    let lock_name = String::from_utf8(testkit::names::lock(&prefix, &key)).unwrap();
    let pnode = t.by_addr(&primary);
    let left_behind = !wait_until(Duration::from_secs(5), || async {
        !pnode
            .cmd::<bool>(&["EXISTS", &lock_name])
            .await
            .unwrap_or(true)
    })
    .await;
    for r in &replicas {
        r.resume();
    }
    match outcome {
        Err(Error::Refused { code, .. }) => assert_eq!(code, "NOREPLICAS"),
        other => panic!("expected Refused(NOREPLICAS) with the replicas paused, got {other:?}"),
    }
    assert!(!left_behind, "the unacknowledged lock was not released");
    // Acknowledged again once the replicas are back.
    t.wait_settled(Duration::from_secs(30)).await;
    let g = locker
        .lock(&key)
        .await
        .expect("granted once replicas acknowledge");
    g.release().await.unwrap();
}

/// Issue 20: a release that lands on the old primary after the promotion and
/// before the backend follows is lost with the failover; the backend repeats it on
/// the new primary, so the key is free again within about the failover time, not
/// one lease TTL. With the default 30 s TTL, one instance holds a mutex, a write
/// lease and a semaphore's only permit; `SENTINEL FAILOVER` runs, and as soon as a
/// replica answers `ROLE` as master (the old primary still accepts writes, and the
/// backend has not heard `+switch-master` yet) the holder releases all three. Once
/// both backends follow the new primary, another instance must get each of them
/// within 10 s of the release (without the replay it waits ~30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_in_a_failover_is_repeated_on_the_new_primary() {
    let _serial = SERIAL.lock().await;
    let t = topology().await;
    t.wait_settled(Duration::from_secs(60)).await;
    let prefix = unique_prefix("replay");
    let (a, b) = (backend(&prefix, false).await, backend(&prefix, false).await);
    let old = t.primary_addr().await;
    assert_eq!(a.server(), old);
    // The default lease TTL (30 s).
    let holder = Locker::builder(a.clone()).build().unwrap();
    let other = Locker::builder(b.clone()).build().unwrap();
    let (mutex, rw, sem) = (
        LockKey::from("m"),
        LockKey::from("rw"),
        LockKey::from("sem"),
    );
    let held = AllThree::take(&holder, &prefix, (&mutex, &rw, &sem)).await;
    // Every replica has the three leases, so whichever is promoted holds them.
    let replicas: Vec<_> = t
        .data
        .iter()
        .filter(|n| n.is_running() && n.hostport() != old)
        .collect();
    for r in &replicas {
        for name in &held.names {
            assert!(
                wait_until(Duration::from_secs(5), || async {
                    r.cmd::<bool>(&["EXISTS", name]).await.unwrap_or(false)
                })
                .await,
                "{name} did not reach the replica {}",
                r.hostport()
            );
        }
    }

    t.failover().await;
    // The moment a replica is promoted: the old primary still takes writes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let new = 'promoted: loop {
        for r in &replicas {
            let role: Result<Vec<redis::Value>, _> = r.cmd(&["ROLE"]).await;
            if let Ok(role) = role
                && matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master")
            {
                break 'promoted r.hostport();
            }
        }
        assert!(Instant::now() < deadline, "no replica was promoted");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let before = a.server();
    let released_at = Instant::now();
    let released = held.release().await;
    let after = a.server();
    for outcome in released {
        outcome.expect("the holder's release");
    }
    assert!(
        before == old && after == old,
        "the holder followed the new primary before its releases ran ({before} → {after}); \
         the window this test needs was missed"
    );
    println!(
        "released on the old primary {old} {:?} after {new} was promoted",
        released_at.elapsed()
    );

    // Both backends follow the new primary.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let all = a.server() == new && b.server() == new;
            async move { all }
        })
        .await,
        "the backends did not follow {new}: {} {}",
        a.server(),
        b.server()
    );
    // The other instance gets all three soon after the release, not a TTL later.
    let names = (&mutex, &rw, &sem);
    takes_all_three_after(&other, names, released_at, Duration::from_secs(10)).await;
    t.wait_settled(Duration::from_secs(60)).await;
}

/// A Sentinel-managed primary that refuses unauthenticated clients: the
/// sentinels name only its address, so its credentials come from
/// `primary_connection_info`, on every connection, before and after a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_protected_primary_is_reached_with_primary_connection_info() {
    let _serial = SERIAL.lock().await;
    let auth = Auth::default();
    let bounded = tokio::time::timeout(Duration::from_secs(120), async {
        let t = Sentinels::start_with_auth(&auth).await;
        password_protected_primary(&t, &auth).await;
    });
    bounded
        .await
        .expect("the password-protected Sentinel test took more than 120 s");
}

async fn password_protected_primary(t: &Sentinels, auth: &Auth) {
    let sentinels = t.sentinel_urls();
    assert!(
        sentinels
            .iter()
            .all(|u| u.contains(&auth.sentinel_password))
    );
    let fails_naming_auth = |builder: lockflight::backend::RedisBackendBuilder| async move {
        let started = Instant::now();
        let outcome = tokio::time::timeout(
            Duration::from_secs(10),
            builder.connection_timeout(Duration::from_secs(1)).connect(),
        )
        .await
        .expect("connect hung instead of failing");
        let e = outcome.expect_err("connected without the credentials");
        let text = format!("{e} {e:?}");
        assert!(matches!(e, Error::Connect { .. }), "{e:?}");
        assert!(text.contains("authentication failed"), "{text}");
        assert!(
            !text.contains(&auth.password) && !text.contains(&auth.sentinel_password),
            "{text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    };
    // The primary's credentials missing: the ROLE check on the named primary is
    // answered NOAUTH.
    fails_naming_auth(RedisBackend::sentinel(sentinels.clone(), MASTER)).await;
    // The sentinels' own password missing from their URLs: they answer NOAUTH.
    let bare: Vec<String> = t
        .sentinels
        .iter()
        .map(|n| format!("redis://{}/", n.hostport()))
        .collect();
    let info = redis::RedisConnectionInfo::default()
        .set_username(&auth.username)
        .set_password(&auth.password)
        .set_db(3);
    fails_naming_auth(RedisBackend::sentinel(bare, MASTER).primary_connection_info(info.clone()))
        .await;

    // With them: every kind of lease, with replica acknowledgement (its own
    // connections) on the holder.
    let prefix = unique_prefix("auth");
    let connect = |ack: bool| {
        let mut builder = RedisBackend::sentinel(sentinels.clone(), MASTER)
            .primary_connection_info(info.clone())
            .prefix(&prefix);
        if ack {
            builder = builder.replica_ack(1, Duration::from_millis(500));
        }
        async move {
            builder
                .connect()
                .await
                .expect("connect with the primary's credentials")
        }
    };
    // The replicas authenticate (masteruser) and are in sync.
    t.wait_settled(Duration::from_secs(30)).await;
    let (a, b) = (connect(true).await, connect(false).await);
    let old = t.primary_addr().await;
    assert_eq!(a.server(), old);
    let holder = Locker::builder(a.clone())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let other = Locker::builder(b.clone())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let keys = (
        LockKey::from("m"),
        LockKey::from("rw"),
        LockKey::from("sem"),
    );
    let keys = (&keys.0, &keys.1, &keys.2);
    every_kind(t, (&holder, &prefix), &other, keys, "before the failover").await;

    // SENTINEL FAILOVER: both backends follow with the same credentials.
    t.failover().await;
    let new = t.wait_primary_change(&old, Duration::from_secs(30)).await;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let all = a.server() == new && b.server() == new;
            async move { all }
        })
        .await,
        "the backends did not follow {new}: {} {}",
        a.server(),
        b.server()
    );
    // The old primary keeps its pub/sub clients when demoted: drop them, so the
    // subscriptions are made again, on the new primary (where none were before).
    let _: redis::Value = t
        .by_addr(&old)
        .cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .await
        .unwrap();
    let channels = [a.instance_id(), b.instance_id()].map(|id| names::channel(&prefix, id));
    let new_node = t.by_addr(&new);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            let listed: Vec<String> = new_node
                .cmd(&["PUBSUB", "CHANNELS", &format!("{prefix}:inst:*")])
                .await
                .unwrap_or_default();
            channels.iter().all(|c| listed.contains(c))
        })
        .await,
        "the notification subscriptions did not move to the new primary {new}"
    );
    t.wait_settled(Duration::from_secs(60)).await;
    every_kind(t, (&holder, &prefix), &other, keys, "after the failover").await;
}

/// `holder` (over a backend under `prefix`) takes a mutex, a write lease and a permit, each in
/// database 3 of the current primary; `other` gets each at once after the release.
async fn every_kind(
    t: &Sentinels,
    (holder, prefix): (&Locker, &str),
    other: &Locker,
    keys: (&LockKey, &LockKey, &LockKey),
    when: &str,
) {
    let held = AllThree::take(holder, prefix, keys).await;
    let primary = t.primary().await;
    let client = redis::Client::open(format!("{}3", primary.url())).unwrap();
    let mut db3 = client.get_multiplexed_async_connection().await.unwrap();
    for name in &held.names {
        let there: bool = redis::cmd("EXISTS")
            .arg(name)
            .query_async(&mut db3)
            .await
            .unwrap();
        assert!(there, "{when}: {name} is not in database 3 of the primary");
    }
    let released_at = Instant::now();
    for outcome in held.release().await {
        outcome.unwrap_or_else(|e| panic!("{when}: release: {e}"));
    }
    takes_all_three_after(other, keys, released_at, Duration::from_secs(5)).await;
}
