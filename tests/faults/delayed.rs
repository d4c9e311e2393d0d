//! Row 8: a request **delayed on the wire past later ones** ([`FaultProxy::delay_requests`]:
//! the client's connection ends at once, so the request is indeterminate and what
//! follows goes on a new connection, while the request itself reaches Redis
//! seconds later). The two shapes the lease protocol must survive (the model in
//! `src/lease/model/` explores them exhaustively; these run them on a real
//! server, plain and with `replica_ack`, where grants travel on pooled
//! connections):
//!
//! * **A release lands after a later request of the same instance.** A's release
//!   fails three times (each copy delayed) while a local task waits: the next local
//!   leader must not be granted a lease that the late release copies delete.
//! * **An acquire lands after its lease was released.** A's first acquire copy is
//!   delayed, the re-sent copy is granted, A works and releases; the late copy must
//!   not take the free key for a token nobody holds (every kind).
//!
//! Instance A talks to Redis through the proxy, instance B directly.

use std::time::Duration;

use lockflight::{Handoff, LockKey, Locker, RedisBackend};
use testkit::fault_proxy::{CommandMatcher, FaultProxy, evalsha_on};
use testkit::replication::Replicated;
use testkit::{RedisServer, unique_prefix, wait_until};

use crate::lost_reply::learn_scripts;
use crate::{serial, within};

/// Long enough that nothing expires or is renewed during a test: whatever frees
/// a key here is a release.
const LONG_TTL: Duration = Duration::from_secs(30);
/// How long the proxy holds a delayed request back.
const DELAY: Duration = Duration::from_secs(2);
const KEY: &str = "k";

/// Where the tests' Redis runs: one server, or a primary with one replica whose
/// acknowledgement every grant waits for.
enum Target {
    Plain(RedisServer),
    Acked(Box<Replicated>),
}

struct Setup {
    target: Target,
    proxy: FaultProxy,
    prefix: String,
}

impl Setup {
    async fn new(name: &str, acked: bool) -> Setup {
        let target = if acked {
            Target::Acked(Box::new(Replicated::start().await))
        } else {
            Target::Plain(RedisServer::start())
        };
        let proxy = FaultProxy::start_to(target.addr()).await;
        Setup {
            target,
            proxy,
            prefix: unique_prefix(name),
        }
    }

    async fn backend(&self, url: &str) -> RedisBackend {
        let mut builder = RedisBackend::builder(url).prefix(&self.prefix);
        if matches!(self.target, Target::Acked(_)) {
            builder = builder.replica_ack(1, Duration::from_secs(2));
        }
        builder.connect().await.expect("connect the backend")
    }

    /// Instance A, through the proxy; without handoff, so that a release goes to
    /// Redis even while a local task waits.
    async fn a(&self) -> Locker {
        Locker::builder(self.backend(&self.proxy.url()).await)
            .lease_ttl(LONG_TTL)
            .wait_timeout(Duration::from_secs(20))
            .handoff(Handoff::disabled())
            .build()
            .unwrap()
    }

    /// Instance B, straight to Redis.
    async fn b(&self) -> Locker {
        Locker::builder(self.backend(&self.target.url()).await)
            .lease_ttl(LONG_TTL)
            .build()
            .unwrap()
    }

    /// The Redis name of `KEY`'s lock, plus `suffix`.
    async fn name(&self, suffix: &str) -> Vec<u8> {
        let lock = testkit::names::lock(&self.prefix, &LockKey::from(KEY));
        [&lock[..], suffix.as_bytes()].concat()
    }

    /// Waits until `n` delayed requests were answered by Redis.
    async fn delayed_landed(&self, n: u64) {
        let landed = wait_until(DELAY * 10, || async { self.proxy.delayed_applied() >= n }).await;
        assert!(
            landed,
            "{} of {n} delayed requests reached Redis",
            self.proxy.delayed_applied()
        );
    }
}

impl Target {
    fn addr(&self) -> std::net::SocketAddr {
        match self {
            Target::Plain(s) => s.addr(),
            Target::Acked(t) => std::net::SocketAddr::from(([127, 0, 0, 1], t.primary.port())),
        }
    }

    fn url(&self) -> String {
        match self {
            Target::Plain(s) => s.url(),
            Target::Acked(t) => t.primary.url(),
        }
    }
}

/// The first script run with `first_key` as its first key (armed right before the
/// one request it is meant for).
fn first_script_on(first_key: Vec<u8>) -> CommandMatcher {
    std::sync::Arc::new(move |args: &[Vec<u8>]| {
        args.len() > 3 && evalsha_on(&args[1], &first_key)(args)
    })
}

/// A's release fails three times (every copy delayed) while a second task of A
/// waits. The next leader of A must hold a lease the late copies cannot delete:
/// once they land, B is still refused and A's holder keeps its lease. (Before: the
/// next leader re-acquired with the released token, the late copies deleted its
/// lock, and B took the key while A believed it held it.)
async fn a_delayed_release_cannot_delete_the_next_local_lease(acked: bool) {
    let _serial = serial().await;
    let s = Setup::new("delayed-release", acked).await;
    let scripts = learn_scripts(&s.proxy, &s.prefix).await;
    let (a, b) = (s.a().await, s.b().await);
    let first = a.lock(KEY).await.unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.lock(KEY).await }
    });
    let waiting = wait_until(Duration::from_secs(10), || async {
        a.stats().local_waits >= 1
    })
    .await;
    assert!(waiting, "the second task never waited");

    let lock = s.name("").await;
    s.proxy
        .delay_requests(evalsha_on(&scripts.release, &lock), 3, DELAY);
    let released = within(
        Duration::from_secs(15),
        "the first release",
        first.release(),
    )
    .await;
    assert!(
        released.is_err(),
        "a release whose copies are all delayed: {released:?}"
    );
    let second = within(Duration::from_secs(20), "the waiter", waiter)
        .await
        .unwrap()
        .expect("the waiter gets the lock");
    s.delayed_landed(3).await;

    let b_try = b.try_lock(KEY).await.unwrap();
    assert!(
        b_try.is_none() && !second.is_lost(),
        "after the delayed releases landed, B holds the key: {} while A's holder believes \
         it holds it (lost: {})",
        b_try.is_some(),
        second.is_lost()
    );
    second
        .release()
        .await
        .expect("A's holder still held its lease");
    let b_now = b.try_lock(KEY).await.unwrap();
    assert!(b_now.is_some(), "the key is free after A's release");
    b_now.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_release_cannot_delete_the_next_local_lease_plain() {
    a_delayed_release_cannot_delete_the_next_local_lease(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_release_cannot_delete_the_next_local_lease_acked() {
    a_delayed_release_cannot_delete_the_next_local_lease(true).await;
}

/// The lock kinds whose acquire a test delays.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Mutex,
    Read,
    Write,
    Permit,
}

/// A's first acquire copy of `kind` is delayed; the re-sent copy is granted, A
/// releases, then the late copy lands on the free key. B must get the key at once
/// (before: the late copy held it for a token nobody had, until its TTL).
async fn a_late_acquire_copy_cannot_hold_a_released_key(kind: Kind, acked: bool) {
    let _serial = serial().await;
    let s = Setup::new(&format!("late-acquire-{kind:?}"), acked).await;
    let (a, b) = (s.a().await, s.b().await);
    let first_key = match kind {
        Kind::Mutex => s.name("").await,
        Kind::Read | Kind::Write => s.name(":rd").await,
        Kind::Permit => s.name(":sem").await,
    };
    s.proxy.delay_requests(first_script_on(first_key), 1, DELAY);
    let what = format!("A's {kind:?} acquire");
    match kind {
        Kind::Mutex => {
            within(Duration::from_secs(15), &what, a.lock(KEY))
                .await
                .unwrap()
                .release()
                .await
        }
        Kind::Read => {
            within(Duration::from_secs(15), &what, a.rwlock(KEY).read())
                .await
                .unwrap()
                .release()
                .await
        }
        Kind::Write => {
            within(Duration::from_secs(15), &what, a.rwlock(KEY).write())
                .await
                .unwrap()
                .release()
                .await
        }
        Kind::Permit => {
            let sem = a.semaphore(KEY, 1);
            within(Duration::from_secs(15), &what, sem.acquire())
                .await
                .unwrap()
                .release()
                .await
        }
    }
    .expect("A's release");
    s.delayed_landed(1).await;

    assert!(
        free_for(&b, kind, KEY).await,
        "{kind:?}: the late acquire copy holds the released key"
    );
}

/// Whether B takes `key` at once for `kind` (and gives it back). A late read
/// lease would not block B's reader: for the read-write lock B asks for the write
/// lease.
async fn free_for(b: &Locker, kind: Kind, key: &str) -> bool {
    match kind {
        Kind::Mutex => b.try_lock(key).await.unwrap().map(drop).is_some(),
        Kind::Read | Kind::Write => b.rwlock(key).try_write().await.unwrap().map(drop).is_some(),
        Kind::Permit => b
            .semaphore(key, 1)
            .try_acquire()
            .await
            .unwrap()
            .map(drop)
            .is_some(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_acquire_copy_cannot_hold_a_released_key_every_kind_plain() {
    for kind in [Kind::Mutex, Kind::Read, Kind::Write, Kind::Permit] {
        a_late_acquire_copy_cannot_hold_a_released_key(kind, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_acquire_copy_cannot_hold_a_released_key_every_kind_acked() {
    for kind in [Kind::Mutex, Kind::Read, Kind::Write, Kind::Permit] {
        a_late_acquire_copy_cannot_hold_a_released_key(kind, true).await;
    }
}

/// A's first acquire copy of each kind is delayed for twice the lifetime of a
/// release record; the re-sent copy is granted, A releases, and the record has
/// expired when the late copy lands. The gate refuses a grant that arrives later
/// than a record's lifetime after it was sent (by the server's clock), so the
/// late copy takes nothing: B gets every key at once. (Before: the record was
/// the only guard, and the late copy held the key for a token nobody had, until
/// its TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_delayed_past_its_release_record_takes_nothing_every_kind() {
    let _serial = serial().await;
    let s = Setup::new("late-past-record", false).await;
    // Short request timeouts make a short record lifetime:
    // 5 s + (2 × 200 ms + 200 ms) + 1 s (`release_record_ttl`).
    let (response, connection) = (Duration::from_millis(200), Duration::from_millis(200));
    let record = Duration::from_secs(6) + response * 2 + connection;
    let a = Locker::builder(
        RedisBackend::builder(s.proxy.url())
            .prefix(&s.prefix)
            .response_timeout(response)
            .connection_timeout(connection)
            .connect()
            .await
            .expect("connect A"),
    )
    .lease_ttl(LONG_TTL)
    .wait_timeout(Duration::from_secs(20))
    .handoff(Handoff::disabled())
    .build()
    .unwrap();
    let b = s.b().await;
    let kinds = [Kind::Mutex, Kind::Read, Kind::Write, Kind::Permit];
    let key = |kind: Kind| format!("late-{kind:?}");
    for kind in kinds {
        let lock = testkit::names::lock(&s.prefix, &LockKey::from(key(kind)));
        let first_key = match kind {
            Kind::Mutex => lock,
            Kind::Read | Kind::Write => [&lock[..], b":rd"].concat(),
            Kind::Permit => [&lock[..], b":sem"].concat(),
        };
        s.proxy
            .delay_requests(first_script_on(first_key), 1, record * 2);
    }
    let mut runs = tokio::task::JoinSet::new();
    for kind in kinds {
        let (a, key) = (a.clone(), key(kind));
        runs.spawn(async move {
            let released = match kind {
                Kind::Mutex => a.lock(&key).await.unwrap().release().await,
                Kind::Read => a.rwlock(&key).read().await.unwrap().release().await,
                Kind::Write => a.rwlock(&key).write().await.unwrap().release().await,
                Kind::Permit => {
                    a.semaphore(&key, 1)
                        .acquire()
                        .await
                        .unwrap()
                        .release()
                        .await
                }
            };
            released.unwrap_or_else(|e| panic!("A's {kind:?} release: {e}"));
        });
    }
    within(Duration::from_secs(60), "A's sections", async {
        while let Some(run) = runs.join_next().await {
            run.unwrap();
        }
    })
    .await;
    let landed = wait_until(record * 6, || async { s.proxy.delayed_applied() >= 4 }).await;
    assert!(
        landed,
        "{} of 4 delayed requests reached Redis",
        s.proxy.delayed_applied()
    );

    for kind in kinds {
        assert!(
            free_for(&b, kind, &key(kind)).await,
            "{kind:?}: the copy delayed past its record holds the released key"
        );
    }
}
