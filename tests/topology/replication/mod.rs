//! Replica acknowledgement (`RedisBackendBuilder::replica_ack`) against a real
//! primary with one replica ([`Replicated`]), started once for this test binary;
//! the tests run one at a time (`SERIAL`) because they stop the replica (`SIGSTOP`:
//! it stays connected and acknowledges nothing).
//!
//! * `<kind>_is_acknowledged_or_lost_and_refused`, one body for every kind of lease
//!   (mutex, fair mutex, read lease, write lease, permit): with `replica_ack(1,
//!   50 ms)` a lease is granted while the replica runs; once it stops, the held
//!   lease is lost within about one validity window (its renewals are refused
//!   `NOREPLICAS`), a new acquisition fails with `Refused { code: "NOREPLICAS" }`
//!   (or `Timeout`) when its wait ends and leaves nothing held on the primary; one whose wait
//!   the replica's return falls in is granted; once the replica is back, it is
//!   granted again.
//! * `waiting_for_replicas_stalls_nothing_else`: with `replica_ack(1, 2 s)` and the
//!   replica stopped, two acquires wait for it side by side (not one after the
//!   other) while a release and a busy `try_lock` of the same backend answer at
//!   once.
//! * `a_pooled_connection_the_server_closed_is_replaced`: after `CLIENT KILL`, a
//!   single permit attempt (which the semaphore does not retry) is still granted
//!   and acknowledged.
//! * `sentinel::acknowledged_writes_follow_a_failover` (feature `sentinel`, a
//!   Sentinel topology of its own): after `SENTINEL FAILOVER`, acknowledged writes
//!   run on the new primary.

#[cfg(feature = "sentinel")]
mod sentinel;

use std::time::{Duration, Instant};

use lockflight::{Contention, Error, LockKey, Locker, RedisBackend};
use testkit::replication::Replicated;
use testkit::{Held, backend_at, unique_prefix, wait_until, within};
use tokio::sync::OnceCell;

static TOPOLOGY: OnceCell<Replicated> = OnceCell::const_new();
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The lease TTL of the loss tests: the loss is expected within about this long.
const TTL: Duration = Duration::from_secs(1);

async fn topology() -> &'static Replicated {
    TOPOLOGY.get_or_init(Replicated::start).await
}

/// Continues the replica when dropped (a failing test must not leave it stopped
/// for the next one).
struct ResumeOnDrop(&'static Replicated);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        self.0.replica.resume();
    }
}

/// Takes the topology for this test: one at a time, the replica in sync.
async fn exclusive() -> (tokio::sync::MutexGuard<'static, ()>, &'static Replicated) {
    let serial = SERIAL.lock().await;
    let t = topology().await;
    t.replica.resume();
    t.wait_in_sync(Duration::from_secs(30)).await;
    (serial, t)
}

/// A backend on the primary that waits for 1 replica, at most `wait`.
async fn acked_backend(t: &Replicated, prefix: &str, wait: Duration) -> RedisBackend {
    RedisBackend::builder(t.primary.url())
        .prefix(prefix)
        .replica_ack(1, wait)
        .connect()
        .await
        .expect("connect with replica_ack")
}

/// Whether `name` exists on the primary.
async fn exists(t: &Replicated, name: &[u8]) -> bool {
    let name = String::from_utf8(name.to_vec()).expect("an ASCII name");
    t.primary
        .cmd::<bool>(&["EXISTS", &name])
        .await
        .expect("EXISTS on the primary")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Mutex,
    FairMutex,
    Read,
    Write,
    Permit,
}

impl Kind {
    fn locker(self, backend: RedisBackend) -> Locker {
        Locker::builder(backend)
            .lease_ttl(TTL)
            .wait_timeout(Duration::from_secs(5))
            .contention(if self == Kind::FairMutex {
                Contention::Fair
            } else {
                Contention::Coalesced
            })
            .build()
            .expect("locker")
    }

    async fn acquire(self, locker: &Locker, key: &str) -> lockflight::Result<Held> {
        match self {
            Kind::Mutex | Kind::FairMutex => locker.lock(key).await.map(Held::Lock),
            Kind::Read => locker.rwlock(key).read().await.map(Held::Read),
            Kind::Write => locker.rwlock(key).write().await.map(Held::Write),
            Kind::Permit => locker.semaphore(key, 2).acquire().await.map(Held::Permit),
        }
    }

    /// The Redis name that holds this kind's lease of `key` under `prefix`.
    fn lease_name(self, prefix: &str, key: &str) -> Vec<u8> {
        let key = LockKey::from(key);
        let lock = testkit::names::lock(prefix, &key);
        match self {
            Kind::Mutex | Kind::FairMutex => lock,
            Kind::Read => [&lock[..], b":rd"].concat(),
            Kind::Write => [&lock[..], b":wr"].concat(),
            Kind::Permit => testkit::names::permits(prefix, &key),
        }
    }
}

/// The body of the per-kind tests (see the module docs).
async fn acknowledged_or_lost_and_refused(kind: Kind) {
    let (_serial, t) = exclusive().await;
    let prefix = unique_prefix(&format!("ack-{kind:?}"));
    let backend = acked_backend(t, &prefix, Duration::from_millis(50)).await;
    let locker = kind.locker(backend.clone());

    // Acknowledged: granted, and renewed.
    let held = within(
        Duration::from_secs(10),
        "an acquire the replica acknowledges",
        kind.acquire(&locker, "held"),
    )
    .await
    .unwrap_or_else(|e| panic!("{kind:?}: not granted with the replica running: {e}"));
    assert!(exists(t, &kind.lease_name(&prefix, "held")).await);

    // The replica stops acknowledging: the held lease is lost within about one
    // validity window (its renewals are refused), and not later than that.
    t.stop_replica();
    let _resume = ResumeOnDrop(t);
    let stopped = Instant::now();
    within(
        TTL * 4,
        &format!("{kind:?}: the loss of a lease whose renewals no replica acknowledges"),
        held.lost(),
    )
    .await;
    eprintln!(
        "{kind:?}: lost {:?} after the replica stopped",
        stopped.elapsed()
    );

    // A new acquisition is refused, and the lease it wrote does not stay held.
    match within(
        Duration::from_secs(10),
        "an acquire no replica acknowledges",
        kind.acquire(&locker, "new"),
    )
    .await
    {
        // Asked again within its wait: the last refusal, or the wait's end.
        Err(Error::Refused { code, .. }) => assert_eq!(code, "NOREPLICAS", "{kind:?}"),
        Err(Error::Timeout { .. }) => {}
        Err(e) => panic!("{kind:?}: expected Refused(NOREPLICAS) or Timeout, got {e:?}"),
        Ok(_) => panic!("{kind:?}: granted although no replica acknowledged it"),
    }
    let name = kind.lease_name(&prefix, "new");
    assert!(
        wait_until(Duration::from_secs(5), || async { !exists(t, &name).await }).await,
        "{kind:?}: the unacknowledged grant was not released"
    );
    drop(held);

    // A waiting acquire refused for want of acknowledgements asks again within
    // its wait: the replica comes back during it, and it is granted.
    let waiting = tokio::spawn({
        let locker = locker.clone();
        async move { kind.acquire(&locker, "waits").await }
    });
    let name = kind.lease_name(&prefix, "waits");
    assert!(
        wait_until(Duration::from_secs(5), || async { exists(t, &name).await }).await,
        "{kind:?}: the waiting acquire never wrote its grant"
    );
    t.resume_replica().await;
    let granted = within(Duration::from_secs(10), "the waiting acquire", waiting)
        .await
        .expect("the acquire task")
        .unwrap_or_else(|e| panic!("{kind:?}: a waiting acquire gave up at a refusal: {e}"));
    granted.release().await.expect("release");

    // The replica is back: granted again.
    let again = within(
        Duration::from_secs(10),
        "an acquire once the replica is back",
        kind.acquire(&locker, "new"),
    )
    .await
    .unwrap_or_else(|e| panic!("{kind:?}: not granted once the replica is back: {e}"));
    again.release().await.expect("release");
}

macro_rules! per_kind {
    ($($name:ident => $kind:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            acknowledged_or_lost_and_refused($kind).await;
        }
    )*};
}

per_kind! {
    mutex_is_acknowledged_or_lost_and_refused => Kind::Mutex;
    fair_mutex_is_acknowledged_or_lost_and_refused => Kind::FairMutex;
    read_lease_is_acknowledged_or_lost_and_refused => Kind::Read;
    write_lease_is_acknowledged_or_lost_and_refused => Kind::Write;
    permit_is_acknowledged_or_lost_and_refused => Kind::Permit;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_server_closed_is_replaced() {
    let (_serial, t) = exclusive().await;
    let prefix = unique_prefix("ack-killed");
    let backend = acked_backend(t, &prefix, Duration::from_millis(500)).await;
    let locker = Kind::Permit.locker(backend);
    let semaphore = locker.semaphore("s", 1);
    // An acknowledged grant leaves its connection idle in the pool.
    let permit = semaphore
        .try_acquire()
        .await
        .unwrap()
        .expect("a free permit");
    permit.release().await.unwrap();
    // The server closes every normal client connection (not the replica's link).
    let killed: i64 = t
        .primary
        .cmd(&["CLIENT", "KILL", "TYPE", "normal"])
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "no connection was killed");
    // A single attempt, which the semaphore does not retry, still gets its permit.
    let permit = within(
        Duration::from_secs(5),
        "try_acquire after CLIENT KILL",
        semaphore.try_acquire(),
    )
    .await
    .expect("an acknowledged grant on a pooled connection the server closed")
    .expect("a free permit");
    drop(permit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_replicas_stalls_nothing_else() {
    const WAIT: Duration = Duration::from_secs(4);
    let (_serial, t) = exclusive().await;
    let prefix = unique_prefix("ack-stall");
    let backend = acked_backend(t, &prefix, WAIT).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // Another instance, without acknowledgement, holds "busy".
    let other = Locker::builder(backend_at(&t.primary.url(), &prefix).await)
        .build()
        .unwrap();
    let busy = other.lock("busy").await.unwrap();
    // Taken (acknowledged) while the replica runs.
    let before = locker.lock("before").await.unwrap();

    t.stop_replica();
    let _resume = ResumeOnDrop(t);
    // Two acquires that wait for the replica. Had one queued behind the other's
    // WAIT, its lock would be written no earlier than `WAIT` after they started:
    // both must be written before `written_by`.
    let written_by = Instant::now() + WAIT - Duration::from_millis(250);
    let stuck: Vec<_> = ["stuck-1", "stuck-2"]
        .into_iter()
        .map(|key| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let outcome = locker.lock(key).await;
                (outcome.map(drop), start.elapsed())
            })
        })
        .collect();
    let names: Vec<Vec<u8>> = ["stuck-1", "stuck-2"]
        .into_iter()
        .map(|key| testkit::names::lock(&prefix, &LockKey::from(key)))
        .collect();
    assert!(
        wait_until(
            written_by.saturating_duration_since(Instant::now()),
            || async { exists(t, &names[0]).await || exists(t, &names[1]).await }
        )
        .await,
        "neither acquire wrote its lock"
    );

    // Meanwhile the same backend's other commands answer at once.
    let start = Instant::now();
    let released = before.release().await;
    let release = start.elapsed();
    let start = Instant::now();
    let found_busy = locker.try_lock("busy").await;
    let try_lock = start.elapsed();
    eprintln!(
        "while two acquires wait for the replica: release {release:?}, busy try_lock {try_lock:?}"
    );
    assert!(
        release < Duration::from_secs(1),
        "a release waited {release:?} behind a WAIT of {WAIT:?}: {released:?}"
    );
    assert!(
        try_lock < Duration::from_secs(1),
        "a busy try_lock waited {try_lock:?} behind a WAIT of {WAIT:?}: {:?}",
        found_busy.as_ref().map(Option::is_some)
    );
    released.expect("release");
    assert!(
        found_busy.expect("try_lock").is_none(),
        "the other instance holds it"
    );
    // Both acquires wrote their lock: neither queued behind the other's WAIT.
    let both = wait_until(
        written_by.saturating_duration_since(Instant::now()),
        || async { exists(t, &names[0]).await && exists(t, &names[1]).await },
    )
    .await;
    for name in &names {
        assert!(
            both || exists(t, name).await,
            "{}: not written yet, queued behind the other acquire's WAIT",
            String::from_utf8_lossy(name)
        );
    }

    // Each waiting acquire waited for the replica side by side, asking again
    // within its wait, and was refused when its wait ended.
    for task in stuck {
        let (outcome, took) = task.await.expect("the acquire task");
        match outcome {
            Err(Error::Refused { code, .. }) => assert_eq!(code, "NOREPLICAS"),
            Err(Error::Timeout { .. }) => {}
            other => panic!("expected Refused(NOREPLICAS) or Timeout, got {other:?}"),
        }
        assert!(
            took >= WAIT - Duration::from_millis(100),
            "an acquire took {took:?} with a WAIT of {WAIT:?}"
        );
    }
    busy.release().await.unwrap();
}
