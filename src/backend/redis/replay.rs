//! Releases repeated on the new primary after a failover, so that a failover does
//! not strand a released lock for a whole lease TTL.
//!
//! # The problem
//!
//! Redis replication is asynchronous. A write the old primary accepted after its
//! replica was promoted (or that it had not yet sent to that replica) is lost when
//! the replica takes over. A release is such a write when it lands on the old
//! primary in that window: after `SENTINEL FAILOVER` promotes a replica, the old
//! primary keeps accepting writes until it is told to replicate, and this backend
//! keeps sending to it until it hears `+switch-master` (or gets `READONLY`, or a
//! connection error). The holder is told "released", but the new primary still
//! holds the lease, and every other instance waits until its TTL ends (measured:
//! about 29 s of a 30 s TTL, for a switch that took 53–78 ms).
//!
//! # What this does
//!
//! Every release that got a reply saying it released something (the mutex, a read
//! or write lease, a permit; `lock_many` uses the mutex's) is kept in a log: the
//! script, its KEYS and ARGV bytes, and the version of the topology it was sent
//! under (a sentinel backend's connection generation, which goes up each time the
//! backend follows a new primary). A background task, running only while the log
//! is not empty, checks the version every [`POLL`]; once it has moved past an
//! entry's, it runs that entry's release again on the current primary (at most
//! [`CONCURRENCY`] at a time) and drops it. A release sent before a switch whose
//! reply comes after it is replayed the same way. A replay that fails (the new
//! primary is not reachable yet) stays in the log and is tried again, until its
//! entry expires.
//!
//! The replay is the same script with the same bytes, not a new request: it needs
//! nothing from the scripts but the property below, and follows changes to their
//! KEYS and ARGV by itself. A fair-mode release is logged without its requeue
//! arguments: the replay only frees the lease; the instance's next waiter queues
//! again by its own acquire.
//!
//! # Why a replay never frees a lease someone else holds
//!
//! 1. Each release script deletes only what belongs to the token it is given: the
//!    mutex only while it holds that token (`GET` = token), the read lease, write
//!    lease, waiting-writer entry or permit stored under that token. Everything
//!    else a release does, any script may do at any time: purge expired entries,
//!    and wake waiters when the lock or permits are free (a wake-up only tells an
//!    instance to try).
//! 2. A token names one lease: it is 128 random bits, and the lockers never acquire
//!    with a token again once a release of it has been answered (a token is reused
//!    only to reconcile an acquire or a release whose reply was lost, and such a
//!    release is not logged: only released replies are).
//!
//! So a replayed release either deletes the very lease that was released (still on
//! the new primary only because the failover lost the release) or changes no lease
//! at all.
//!
//! # Bounds
//!
//! An entry matters only while the lease it released could still exist on the new
//! primary: at most its TTL after its last renewal, which came before the release.
//! It is kept for the longest lease TTL this backend has granted (acquires report
//! theirs), then dropped. The log holds at most [`BUDGET`] bytes (an entry costs
//! its KEYS and ARGV bytes plus [`OVERHEAD`]: about 300 bytes for a mutex with a
//! short key, so some 28,000 releases; at a 30 s TTL, about 900 releases/s); past
//! that, the oldest entries are evicted first. A key whose entry was evicted (or
//! that was released more than the window before the switch) behaves as without
//! the log: it waits out its TTL.
//!
//! Only the sentinel mode logs. One server has no failover; a cluster's primary
//! changes are handled by the `redis` crate's cluster client, which does not say
//! which node ran a request, so a release lost in a cluster failover still waits
//! out its TTL.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use redis::{RedisError, Script, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::conn::Conn;

/// How often the task checks the topology version while the log is not empty.
pub(super) const POLL: Duration = Duration::from_millis(20);
/// At most this many replays in flight.
pub(super) const CONCURRENCY: usize = 16;
/// The log's size bound, in bytes.
pub(super) const BUDGET: usize = 8 << 20;
/// What an entry costs besides its bytes.
pub(super) const OVERHEAD: usize = 96;
/// How long the task waits after a pass in which some replays failed.
const RETRY: Duration = Duration::from_millis(250);

/// One logged release.
struct Entry {
    script: &'static Script,
    /// The KEYS, then the ARGV, back to back.
    bytes: Box<[u8]>,
    /// Where each KEY and ARGV ends in `bytes`.
    ends: Box<[u32]>,
    keys: usize,
    /// The topology version it was sent under.
    sent: u64,
    /// When it stops mattering.
    until: Instant,
}

impl Entry {
    fn new(script: &'static Script, keys: &[&[u8]], args: &[&[u8]], sent: u64) -> Entry {
        let mut bytes = Vec::with_capacity(keys.iter().chain(args).map(|b| b.len()).sum());
        let mut ends = Vec::with_capacity(keys.len() + args.len());
        for part in keys.iter().chain(args) {
            bytes.extend_from_slice(part);
            ends.push(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
        }
        Entry {
            script,
            bytes: bytes.into(),
            ends: ends.into(),
            keys: keys.len(),
            sent,
            until: Instant::now(),
        }
    }

    fn cost(&self) -> usize {
        self.bytes.len() + self.ends.len() * 4 + OVERHEAD
    }

    fn parts(&self) -> Vec<&[u8]> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let part = &self.bytes[start..end as usize];
                start = end as usize;
                part
            })
            .collect()
    }

    /// Runs the release again.
    async fn replay(&self, conn: &Conn) -> Result<Value, RedisError> {
        let parts = self.parts();
        let (keys, args) = parts.split_at(self.keys);
        conn.invoke(self.script, keys, args).await
    }
}

#[derive(Default)]
struct Log {
    entries: VecDeque<Entry>,
    bytes: usize,
}

impl Log {
    fn pop_front(&mut self) -> Option<Entry> {
        let e = self.entries.pop_front()?;
        self.bytes -= e.cost();
        Some(e)
    }

    fn push(&mut self, e: Entry) {
        self.bytes += e.cost();
        self.entries.push_back(e);
    }

    /// Drops expired entries (from the front: `until` does not decrease along the
    /// log), then the oldest ones past the budget.
    fn trim(&mut self, now: Instant) {
        while self.entries.front().is_some_and(|e| e.until <= now) {
            self.pop_front();
        }
        let mut evicted = 0u32;
        while self.bytes > BUDGET {
            self.pop_front();
            evicted += 1;
        }
        if evicted > 0 {
            tracing::debug!(
                evicted,
                "the failover replay log is full; the oldest releases will not be replayed"
            );
        }
    }
}

/// The log of recent releases and the task that replays them; one per backend.
#[derive(Default)]
pub(super) struct Replays {
    log: Mutex<Log>,
    /// The longest lease TTL acquired through this backend, in ms.
    longest_ttl_ms: AtomicU64,
    /// Signalled on each logged release (wakes the idle task).
    logged: tokio::sync::Notify,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Replays {
    /// Notes the TTL of a lease being acquired: entries are kept as long as the
    /// longest one.
    pub(super) fn lease_ttl(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.longest_ttl_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn window(&self) -> Duration {
        Duration::from_millis(self.longest_ttl_ms.load(Ordering::Relaxed).max(1_000))
    }

    fn record(&self, mut entry: Entry) {
        let now = Instant::now();
        entry.until = now + self.window();
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.push(entry);
        log.trim(now);
        drop(log);
        self.logged.notify_one();
    }

    fn is_empty(&self) -> bool {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .is_empty()
    }

    /// Takes out the live entries sent under a version older than `version`.
    fn take_due(&self, version: u64) -> Vec<Entry> {
        let now = Instant::now();
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.trim(now);
        if log.entries.iter().all(|e| e.sent >= version) {
            return Vec::new();
        }
        let mut due = Vec::new();
        let mut keep = Log::default();
        while let Some(e) = log.pop_front() {
            if e.sent < version {
                due.push(e);
            } else {
                keep.push(e);
            }
        }
        *log = keep;
        due
    }

    /// Puts back entries whose replay failed, in their order among the others.
    fn put_back(&self, failed: Vec<Entry>) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<Entry> = failed;
        all.extend(log.entries.drain(..));
        all.sort_by_key(|e| e.until);
        log.bytes = 0;
        for e in all {
            log.push(e);
        }
        log.trim(Instant::now());
    }

    /// Starts the replay task on the current runtime unless it is running (it ends
    /// with its runtime, and with the backend).
    fn ensure_task(self: &Arc<Self>, conn: &Conn, stop: &CancellationToken) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *task = Some(runtime.spawn(run(conn.clone(), Arc::clone(self), stop.clone())));
    }
}

/// The topology version of `conn`, or `None` if its releases are not logged.
fn version(conn: &Conn) -> Option<u64> {
    match conn {
        #[cfg(feature = "sentinel")]
        Conn::Sentinel(s) => Some(s.generation()),
        _ => None,
    }
}

/// Whether a release reply says the release deleted something (`{ 1, … }`).
fn released(reply: &Value) -> bool {
    matches!(reply, Value::Array(items) if matches!(items.first(), Some(Value::Int(1))))
}

impl Inner {
    /// Runs `run`, a release by `script` with `keys` and `args`, and logs it for a
    /// replay on the next primary if it released something (see the module docs).
    pub(super) async fn replayable(
        &self,
        script: &'static Script,
        keys: &[&[u8]],
        args: &[&[u8]],
        run: impl Future<Output = Result<Value, RedisError>>,
    ) -> Result<Value, RedisError> {
        // Read before the release is sent: a switch meanwhile makes it replayed.
        let sent = version(&self.conn);
        let reply = run.await;
        if let (Some(sent), Ok(value)) = (sent, &reply)
            && released(value)
        {
            self.replays.record(Entry::new(script, keys, args, sent));
            self.replays.ensure_task(&self.conn, &self.stop);
        }
        reply
    }
}

/// The replay task: idle while the log is empty; otherwise checks the topology
/// version every [`POLL`] and replays the entries sent under an older one.
async fn run(conn: Conn, replays: Arc<Replays>, stop: CancellationToken) {
    loop {
        if replays.is_empty() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = replays.logged.notified() => continue,
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
        let Some(now) = version(&conn) else { return };
        let due = replays.take_due(now);
        if due.is_empty() {
            continue;
        }
        let total = due.len();
        let results: Vec<(Entry, Result<Value, RedisError>)> = futures::stream::iter(due)
            .map(|e| {
                let conn = &conn;
                async move {
                    let r = e.replay(conn).await;
                    (e, r)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut freed = 0usize;
        let mut failed = Vec::new();
        for (e, r) in results {
            match r {
                Ok(v) => freed += usize::from(released(&v)),
                Err(error) => {
                    // Still sent under an older version: due again at the next pass.
                    tracing::debug!(%error, "replaying a release on the new primary failed; will retry");
                    failed.push(e);
                }
            }
        }
        tracing::info!(
            replayed = total - failed.len(),
            freed,
            failed = failed.len(),
            "the primary changed: repeated the releases it may have lost"
        );
        if !failed.is_empty() {
            replays.put_back(failed);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sent: u64, key: &[u8]) -> Entry {
        Entry::new(&super::super::RELEASE, &[key, b"k2"], &[b"tok", b""], sent)
    }

    #[test]
    fn entries_keep_their_keys_and_args() {
        let e = entry(3, b"lock");
        let parts = e.parts();
        assert_eq!(parts, vec![&b"lock"[..], b"k2", b"tok", b""]);
        assert_eq!(e.keys, 2);
    }

    #[tokio::test]
    async fn takes_only_entries_sent_under_an_older_version() {
        let r = Replays::default();
        r.lease_ttl(Duration::from_secs(30));
        r.record(entry(0, b"a"));
        r.record(entry(1, b"b"));
        r.record(entry(0, b"c"));
        assert!(r.take_due(0).is_empty());
        let due = r.take_due(1);
        let keys: Vec<&[u8]> = due.iter().map(|e| e.parts()[0]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"c"]);
        assert!(!r.is_empty());
        r.put_back(due);
        assert_eq!(r.take_due(2).len(), 3);
        assert!(r.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_the_longest_ttl() {
        let r = Replays::default();
        r.lease_ttl(Duration::from_secs(5));
        r.lease_ttl(Duration::from_secs(2));
        r.record(entry(0, b"a"));
        tokio::time::advance(Duration::from_millis(4_900)).await;
        r.record(entry(0, b"b"));
        tokio::time::advance(Duration::from_millis(200)).await;
        let due = r.take_due(1);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].parts()[0], b"b");
    }

    #[tokio::test]
    async fn the_log_stays_within_its_budget_oldest_out_first() {
        let r = Replays::default();
        r.lease_ttl(Duration::from_secs(30));
        let big = vec![b'x'; 64 << 10];
        let n = BUDGET / (64 << 10) + 10;
        for i in 0..n {
            let mut key = big.clone();
            key.extend_from_slice(i.to_string().as_bytes());
            r.record(entry(0, &key));
        }
        let due = r.take_due(1);
        assert!(due.len() < n);
        assert!(due.iter().map(Entry::cost).sum::<usize>() <= BUDGET);
        let last = [&big[..], (n - 1).to_string().as_bytes()].concat();
        assert_eq!(due.last().unwrap().parts()[0], &last[..]);
    }
}
