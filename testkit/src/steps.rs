//! Small steps every test binary needs: bounded waits, joining test tasks,
//! lockflight-side checks (a channel's subscribers, a free key, idle lockers,
//! increasing fencing tokens) and reading lock keys in Redis.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockflight::rwlock::{ReadGuard, WriteGuard};
use lockflight::semaphore::Permit;
use lockflight::{FencingToken, LockGuard, LockKey, Locker, RedisBackend, Result};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

use super::wait_until;

/// Bounds a test step, so that a bug shows up as a clear failure, never a hang.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

/// Waits until `counter` reaches `n` (a [`Counting`](crate::Counting) count, or a
/// test's own); put it [`within`] a bound.
pub async fn count_reaches(counter: &AtomicU64, n: u64) {
    while counter.load(Ordering::SeqCst) < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long [`eventually`] waits: generous, so that a busy machine cannot break a
/// test that waits for an event (the wait ends as soon as the event is seen).
pub const EVENTUALLY: Duration = Duration::from_secs(30);

/// Waits until `cond` holds, checking it every few ms up to [`EVENTUALLY`]; panics
/// naming `what` (the event that never happened) otherwise. For events that only
/// polling can see (a counter, a queue's length, a task's state); where the code
/// offers a signal (a guard's `lost()`, a channel, an idle wait), wait for that.
pub async fn eventually<F, Fut>(what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        wait_until(EVENTUALLY, cond).await,
        "{what}: did not happen within {EVENTUALLY:?}"
    );
}

/// `fut`, counting into `polled` once its first poll has returned: whatever a
/// future does synchronously before its first await (joining a singleflight,
/// entering a local queue) is done once `polled` shows it, so a test waits for
/// that count instead of guessing how long the step takes.
pub async fn count_first_poll<F: Future>(polled: &AtomicU64, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut first = true;
    std::future::poll_fn(|cx| {
        let out = fut.as_mut().poll(cx);
        if std::mem::take(&mut first) {
            polled.fetch_add(1, Ordering::SeqCst);
        }
        out
    })
    .await
}

/// Joins every task; re-raises the first panic.
pub async fn join_all<T: 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(v) => out.push(v),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a test task was cancelled: {e}"),
        }
    }
    out
}

/// Waits until `channel` has at least `at_least` subscribers on the server behind
/// `con`, as `PUBSUB NUMSUB` counts them: that server's own clients only (on a
/// Cluster, ask each node the backend subscribes on). `limit` only guards against a
/// hang; `false` if the count did not come within it.
///
/// `RedisBackend::connect` returns once its first subscription is up; this observes
/// a subscription made again (after `CLIENT KILL`, a restart or a failover). A
/// backend's channel is [`names::channel`](crate::names::channel).
pub async fn channel_subscribed<C>(con: &C, channel: &str, at_least: i64, limit: Duration) -> bool
where
    C: redis::aio::ConnectionLike + Clone,
{
    wait_until(limit, || {
        let mut con = con.clone();
        async move { numsub(&mut con, channel).await >= at_least }
    })
    .await
}

/// The subscribers of `channel` on the server behind `con` (`PUBSUB NUMSUB`); 0 if
/// the command fails (a server restarting).
pub async fn numsub<C: redis::aio::ConnectionLike>(con: &mut C, channel: &str) -> i64 {
    let reply: redis::RedisResult<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(con)
        .await;
    reply.map_or(0, |(_, n)| n)
}

/// Whether `key` is free for `locker` right now (taken and released at once if so).
pub async fn is_free(locker: &Locker, key: &str) -> bool {
    match locker.try_lock(key).await.unwrap() {
        Some(g) => {
            g.release().await.unwrap();
            true
        }
        None => false,
    }
}

/// A backend on `url` under `prefix`; its notification subscription is up (connect
/// waits for it), so no wake-up published by a test is lost to a subscription still
/// starting.
pub async fn backend_at(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect the backend")
}

/// The keys `locker` has local state for, of every kind ([`Stats::keys_in_use`](lockflight::stats::Stats::keys_in_use)).
pub fn keys_in_use(locker: &Locker) -> usize {
    locker.stats().keys_in_use as usize
}

/// Waits (up to `limit`) until none of `lockers` has local activity left.
pub async fn wait_idle(lockers: &[Locker], limit: Duration) {
    wait_zero(
        lockers,
        limit,
        keys_in_use,
        "per-key state left behind: keys_in_use per locker",
    )
    .await;
}

/// Waits (up to `limit`) until `count` is 0 for every one of `lockers` (e.g.
/// [`keys_in_use`]); panics with `what` and the counts otherwise.
pub async fn wait_zero(
    lockers: &[Locker],
    limit: Duration,
    count: fn(&Locker) -> usize,
    what: &str,
) {
    let idle = wait_until(limit, || {
        let busy: usize = lockers.iter().map(count).sum();
        async move { busy == 0 }
    })
    .await;
    let left: Vec<usize> = lockers.iter().map(count).collect();
    assert!(idle, "{what} = {left:?}");
}

/// Panics (naming `what`) unless `tokens` strictly increase.
pub fn assert_strictly_increasing(tokens: &[FencingToken], what: &str) {
    for (i, pair) in tokens.windows(2).enumerate() {
        assert!(
            pair[0] < pair[1],
            "{what}: fencing tokens do not strictly increase at #{i}: {} then {} (of {})",
            pair[0],
            pair[1],
            tokens.len()
        );
    }
}

/// The Redis name `name` + `suffix` (one of a key's companion names: `:rd`, `n`, …).
pub fn suffixed(name: &[u8], suffix: &str) -> Vec<u8> {
    [name, suffix.as_bytes()].concat()
}

/// Runs `cmd`, panicking with the command's name on an error.
pub async fn query<T: redis::FromRedisValue>(
    con: &mut MultiplexedConnection,
    cmd: &redis::Cmd,
) -> T {
    cmd.query_async(con)
        .await
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.args_iter().next()))
}

/// The string value at `name` (`None` if there is none).
pub async fn get_string(con: &mut MultiplexedConnection, name: &[u8]) -> Option<String> {
    query(con, redis::cmd("GET").arg(name)).await
}

/// Sets the string `name` to `value`, expiring in 30 s (as another holder would).
pub async fn set_for_30s(con: &mut MultiplexedConnection, name: &[u8], value: &str) {
    query::<()>(
        con,
        redis::cmd("SET").arg(name).arg(value).arg("PX").arg(30_000),
    )
    .await
}

/// Deletes the Redis key `name` (behind its holder's back, in the loss tests).
pub async fn del(con: &mut MultiplexedConnection, name: &[u8]) {
    query::<()>(con, redis::cmd("DEL").arg(name)).await
}

/// Whether the Redis key `name` exists.
pub async fn exists(con: &mut MultiplexedConnection, name: &[u8]) -> bool {
    query::<i64>(con, redis::cmd("EXISTS").arg(name)).await == 1
}

/// The remaining TTL of `name` in ms (`-2` missing, `-1` without a TTL).
pub async fn pttl(con: &mut MultiplexedConnection, name: &[u8]) -> i64 {
    query(con, redis::cmd("PTTL").arg(name)).await
}

/// The number of entries of a sorted set (a waiter queue).
pub async fn zcard(con: &mut MultiplexedConnection, name: &[u8]) -> i64 {
    query(con, redis::cmd("ZCARD").arg(name)).await
}

/// The critical section of the counter workloads: a read-modify-write increment of
/// the counter `name` on `con` (GET, then `pause`, then SET to one more), which
/// loses updates unless its runs exclude each other.
pub async fn increment<C: redis::aio::ConnectionLike>(
    con: &mut C,
    name: &[u8],
    pause: impl Future<Output = ()>,
) {
    let v: u64 = counter_value(con, name).await;
    pause.await;
    redis::cmd("SET")
        .arg(name)
        .arg(v + 1)
        .query_async::<()>(con)
        .await
        .expect("SET the counter");
}

/// The value of the counter `name` (0 while it does not exist).
pub async fn counter_value<C: redis::aio::ConnectionLike>(con: &mut C, name: &[u8]) -> u64 {
    redis::cmd("GET")
        .arg(name)
        .query_async::<Option<u64>>(con)
        .await
        .expect("GET the counter")
        .unwrap_or(0)
}

/// How many `EVALSHA` calls the server behind `con` has served (`INFO
/// commandstats`; 0 before the first).
pub async fn evalsha_count<C: redis::aio::ConnectionLike>(con: &mut C) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .expect("INFO commandstats");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// One lease of each exclusive kind, held by one instance: the mutex of a key, the
/// write lease of another and the only permit of a third (the failover tests'
/// "holder").
pub struct AllThree {
    /// The mutex.
    pub guard: LockGuard,
    /// The write lease.
    pub write: WriteGuard,
    /// The semaphore's only permit.
    pub permit: Permit,
    /// The Redis names that keep the three leases (at the holder's backend).
    pub names: [String; 3],
}

impl AllThree {
    /// `holder` (a locker over a Redis backend under `prefix`) takes the mutex
    /// `mutex`, the write lease of `rw` and the only permit of semaphore `sem`.
    pub async fn take(
        holder: &Locker,
        prefix: &str,
        (mutex, rw, sem): (&LockKey, &LockKey, &LockKey),
    ) -> AllThree {
        let name = |bytes: Vec<u8>| String::from_utf8(bytes).expect("a UTF-8 name");
        AllThree {
            guard: holder
                .lock(mutex)
                .await
                .expect("the holder takes the mutex"),
            write: holder
                .rwlock(rw)
                .write()
                .await
                .expect("the holder takes the write lease"),
            permit: holder
                .semaphore(sem, 1)
                .acquire()
                .await
                .expect("the holder takes the permit"),
            names: [
                name(crate::names::lock(prefix, mutex)),
                format!("{}:wr", name(crate::names::lock(prefix, rw))),
                name(crate::names::permits(prefix, sem)),
            ],
        }
    }

    /// Releases the three side by side; each one's outcome.
    pub async fn release(self) -> [Result<()>; 3] {
        let (m, w, p) = tokio::join!(
            self.guard.release(),
            self.write.release(),
            self.permit.release()
        );
        [m, w, p]
    }
}

/// After a failover: `other` takes the mutex `mutex`, the write lease of `rw` and
/// the only permit of semaphore `sem` (all released on the old primary at
/// `released_at`), at once, each within what is left of `bound`, and releases them.
/// Panics naming the kind that was not free again within `bound` after its release.
pub async fn takes_all_three_after(
    other: &Locker,
    (mutex, rw, sem): (&LockKey, &LockKey, &LockKey),
    released_at: Instant,
    bound: Duration,
) {
    let wait = bound.saturating_sub(released_at.elapsed());
    let other_sem = other.semaphore(sem, 1);
    let (m, w, p) = tokio::join!(
        async {
            let g = other
                .lock_with_options(mutex, lockflight::LockOptions::new().wait_timeout(wait))
                .await?;
            let at = released_at.elapsed();
            g.release().await.map(|()| at)
        },
        async {
            let g = other
                .rwlock(rw)
                .write_with_options(lockflight::LockOptions::new().wait_timeout(wait))
                .await?;
            let at = released_at.elapsed();
            g.release().await.map(|()| at)
        },
        async {
            let g = other_sem
                .acquire_with_options(lockflight::LockOptions::new().wait_timeout(wait))
                .await?;
            let at = released_at.elapsed();
            g.release().await.map(|()| at)
        },
    );
    println!(
        "after the release: mutex {m:?}, write lease {w:?}, permit {p:?} taken by the other instance"
    );
    for (kind, r) in [("mutex", m), ("write lease", w), ("permit", p)] {
        let at = r.unwrap_or_else(|e| {
            panic!("the {kind} released on the old primary stayed taken on the new one: {e}")
        });
        assert!(
            at < bound,
            "the {kind} was free again only {at:?} after its release"
        );
    }
}

/// A held lease of any kind, for tests that run one step over every kind.
pub enum Held {
    /// A mutex guard.
    Lock(LockGuard),
    /// A read lease.
    Read(ReadGuard),
    /// A write lease.
    Write(WriteGuard),
    /// A semaphore permit.
    Permit(Permit),
}

impl Held {
    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        match self {
            Held::Lock(g) => g.is_lost(),
            Held::Read(g) => g.is_lost(),
            Held::Write(g) => g.is_lost(),
            Held::Permit(p) => p.is_lost(),
        }
    }

    /// Resolves when the lease is lost.
    pub async fn lost(&self) {
        match self {
            Held::Lock(g) => g.lost().await,
            Held::Read(g) => g.lost().await,
            Held::Write(g) => g.lost().await,
            Held::Permit(p) => p.lost().await,
        }
    }

    /// Releases the lease.
    pub async fn release(self) -> Result<()> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Permit(p) => p.release().await,
        }
    }
}
