//! Releases repeated on the new primary after a failover, so that a failover does
//! not strand a released lock for a whole lease TTL.
//!
//! # The problem
//!
//! Redis replication is asynchronous. A write the old primary accepted but had not
//! yet sent to the replica that takes over is lost with the failover. A release is
//! such a write when it lands on the old primary in that window: after
//! `SENTINEL FAILOVER` promotes a replica, the old primary keeps accepting writes
//! until it is told to replicate, and a sentinel backend keeps sending to it until
//! it hears `+switch-master` (or gets `READONLY`, or a connection error); a
//! cluster primary that dies (or is cut off) right after acknowledging a release
//! takes it along. The holder is told "released", but the new primary still holds
//! the lease, and every other instance waits until its TTL ends (nearly the whole
//! TTL, for a switch that takes milliseconds; the measurement is in BENCHMARKS.md).
//!
//! # What this does
//!
//! Every release whose reply says it released something (the mutex, a read or
//! write lease, a permit; `lock_many` uses the mutex's) is kept in a log: the
//! script, its KEYS and ARGV bytes, and the *version* of the topology it was sent
//! under, read before it was sent:
//!
//! * sentinel: the connection's generation, which goes up each time the backend
//!   follows a new primary;
//! * cluster: how many times the primary of the release's slot has changed in the
//!   slot map this module reads (`CLUSTER SLOTS`, from any node, every
//!   [`CLUSTER_POLL`]). The `redis` crate's cluster client follows a failover by
//!   itself but does not say which node ran a request, hence a map of our own.
//!
//! A background task checks the version (every [`POLL`] on Sentinel) and runs
//! every entry whose version moved on again on the current primary (newest
//! first, at most [`CONCURRENCY`] at a time): through the sentinel connection, or addressed to
//! the slot's new primary in the map (not through the cluster client's routing,
//! which may still point at the old one). A release sent before a switch whose
//! reply comes after it is replayed the same way. A replay that fails (the new
//! primary is not reachable yet) is tried again every 250 ms. An entry stays in
//! the log, at its new version, until it expires, so a second failover within
//! the window repeats it again.
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
//!    with a token again once a release of it was sent (a token is reused only to
//!    repeat an acquire whose answer was lost; the acquire scripts refuse a token
//!    whose release record exists). Only releases that returned "released" are
//!    logged, after their reply was decoded.
//!
//! So a replayed release either deletes the very lease that was released (still on
//! the new primary only because the failover lost the release) or changes no lease
//! at all, whenever and wherever it runs (a replay that reaches a stale primary is
//! as harmless as one that finds the lease gone).
//!
//! # Bounds and limits
//!
//! * An entry matters only while the lease it released could still exist on the
//!   new primary: at most its TTL after its last renewal, which came before the
//!   release. It is kept for the longest lease TTL acquired through this backend,
//!   then dropped.
//! * The log holds at most [`BUDGET`] bytes (an entry costs its KEYS and ARGV bytes
//!   plus [`OVERHEAD`]: about 300 bytes for a mutex with a short key, so some
//!   28,000 releases; at a 30 s TTL, about 900 releases/s); past that, the oldest
//!   entries are evicted first. A key whose entry was evicted behaves as without
//!   the log: it waits out its TTL.
//! * Cost: nothing on one server. On Sentinel, a check of an in-memory counter
//!   every 20 ms while the log is not empty. On a cluster, one `CLUSTER SLOTS` every
//!   250 ms while a lease acquired through the backend may live or the log is not
//!   empty (the map must be current *before* a release is sent to see that its
//!   slot moved afterwards).
//! * Cluster: a release sent while the map was not read yet (the first acquire
//!   after an idle period starts the reads, so only a release within about one
//!   poll of it) or read from a node that had not yet heard of a promotion is
//!   replayed only when the map next shows a change for its slot; a slot change
//!   the map never shows (the old primary comes back as primary) replays nothing.
//! * A release that failed (no reply) is not logged: the lockers repeat it in the
//!   background; if that also fails, the key waits out its TTL.
//! * Only this backend's own releases are logged: a process that releases and
//!   exits before the switch leaves its lost releases to the TTL.

// The sentinel and cluster parts are each used only with their feature.
#![cfg_attr(not(all(feature = "cluster", feature = "sentinel")), allow(dead_code))]

use std::collections::VecDeque;
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
use super::slots::{SlotView, slot};

/// How often the task checks a sentinel backend's generation while the log is
/// not empty.
pub(super) const POLL: Duration = Duration::from_millis(20);
/// How often the task reads a cluster's slot map (`CLUSTER SLOTS`) while it is
/// active (see the module docs).
pub(super) const CLUSTER_POLL: Duration = Duration::from_millis(250);
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
    /// The cluster slot of its first key.
    slot: u16,
    /// The topology version it was last sent under (by the release or a replay).
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
            slot: keys.first().map_or(0, |k| slot(k)),
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

    /// Runs the release again on the current primary (`at`, for a cluster: the
    /// slot's primary in the task's view, not the client's).
    async fn replay(&self, conn: &Conn, at: Option<&(String, u16)>) -> Result<Value, RedisError> {
        let parts = self.parts();
        let (keys, args) = parts.split_at(self.keys);
        match (conn, at) {
            #[cfg(feature = "cluster")]
            (Conn::Cluster(c), Some((host, port))) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.script.get_hash()).arg(keys.len());
                for part in keys.iter().chain(args) {
                    cmd.arg(*part);
                }
                let route = || {
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    })
                };
                let mut node = c.conn.clone();
                // A routed command returns a server error as a value.
                let first = node.route_command(cmd.clone(), route()).await;
                match first.and_then(Value::extract_error) {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        conn.load(self.script).await?;
                        let again = node.route_command(cmd, route()).await;
                        again.and_then(Value::extract_error)
                    }
                    other => other,
                }
            }
            _ => conn.invoke(self.script, false, keys, args).await,
        }
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
    /// Until when a lease acquired through this backend may live (a cluster
    /// backend keeps its slot view fresh meanwhile).
    leases_until: Mutex<Option<Instant>>,
    /// A cluster backend's slot view.
    view: Mutex<Option<SlotView>>,
    /// Signalled on each logged release and acquire (wakes the idle task).
    logged: tokio::sync::Notify,
    /// A release was logged with a version that was already behind.
    stale: std::sync::atomic::AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Replays {
    /// Notes the TTL of a lease being acquired: entries are kept as long as the
    /// longest one.
    fn lease_ttl(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.longest_ttl_ms.fetch_max(ms, Ordering::Relaxed);
        let until = Instant::now() + ttl;
        let mut leases = self
            .leases_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if leases.is_none_or(|u| u < until) {
            *leases = Some(until);
        }
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

    /// Whether a lease acquired through this backend may still live.
    fn leases_live(&self) -> bool {
        self.leases_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|u| u > Instant::now())
    }

    /// Takes out the live entries whose version (`current`) moved past the one
    /// they were sent under.
    fn take_due(&self, current: impl Fn(&Entry) -> u64) -> Vec<Entry> {
        let now = Instant::now();
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.trim(now);
        if log.entries.iter().all(|e| e.sent >= current(e)) {
            return Vec::new();
        }
        let mut due = Vec::new();
        let mut keep = Log::default();
        while let Some(e) = log.pop_front() {
            if e.sent < current(&e) {
                due.push(e);
            } else {
                keep.push(e);
            }
        }
        *log = keep;
        due
    }

    /// Puts entries back, in their order among the others.
    fn put_back(&self, entries: Vec<Entry>) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<Entry> = entries;
        all.extend(log.entries.drain(..));
        all.sort_by_key(|e| e.until);
        log.bytes = 0;
        for e in all {
            log.push(e);
        }
        log.trim(Instant::now());
    }

    /// The version of `slot` in the cluster view (0 before the first read).
    fn slot_version(&self, slot: u16) -> u64 {
        self.view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |v| v.changes[usize::from(slot)])
    }

    /// Starts the replay task on the current runtime unless it is running (it ends
    /// with its runtime, and with the backend).
    fn ensure_task(self: &Arc<Self>, conn: &Conn, stop: &CancellationToken) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if let Some(started) =
            crate::runtime::spawn(run(conn.clone(), Arc::clone(self), stop.clone()))
        {
            *task = Some(started);
        }
    }
}

/// How a backend's topology changes are seen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One server: no failover, nothing logged.
    Off,
    /// Sentinel: the connection's generation.
    Generation,
    /// Cluster: each slot's primary in a polled slot map.
    Slots,
}

fn mode(conn: &Conn) -> Mode {
    match conn {
        Conn::Single(_) => Mode::Off,
        #[cfg(feature = "cluster")]
        Conn::Cluster(_) => Mode::Slots,
        #[cfg(feature = "sentinel")]
        Conn::Sentinel(_) => Mode::Generation,
    }
}

/// The current topology version for a release whose first key is `key`, or
/// `None` if releases on `conn` are not logged (one server: nothing is computed).
fn version(conn: &Conn, replays: &Replays, key: Option<&[u8]>) -> Option<u64> {
    match conn {
        #[cfg(feature = "sentinel")]
        Conn::Sentinel(s) => Some(s.generation()),
        #[cfg(feature = "cluster")]
        Conn::Cluster(_) => Some(replays.slot_version(key.map_or(0, slot))),
        _ => {
            let _ = (replays, key);
            None
        }
    }
}

/// Whether a release reply says the release deleted something (`{ 1, … }`).
fn released(reply: &Value) -> bool {
    matches!(reply, Value::Array(items) if matches!(items.first(), Some(Value::Int(1))))
}

impl Inner {
    /// Notes a lease being acquired with `ttl` (see the module docs: the log keeps
    /// entries for the longest TTL; a cluster backend watches its slot map while
    /// leases may live).
    pub(super) fn note_lease(&self, ttl: Duration) {
        self.life.note_lease(ttl);
        let mode = mode(&self.conn);
        if mode == Mode::Off {
            return;
        }
        self.replays.lease_ttl(ttl);
        if mode == Mode::Slots {
            self.replays.ensure_task(&self.conn, &self.stop);
            self.replays.logged.notify_one();
        }
    }

    /// The topology version to log a release of `keys` with (`None`: not logged).
    /// Read it before the release is sent: a switch meanwhile makes the release
    /// due for a replay.
    pub(super) fn replay_version(&self, keys: &[&[u8]]) -> Option<u64> {
        version(&self.conn, &self.replays, keys.first().copied())
    }

    /// Logs a release by `script` with `keys` and `args`, sent under version
    /// `sent` (from [`replay_version`](Self::replay_version)), for a replay on the
    /// next primary if its `reply` says it released something (see the module
    /// docs).
    pub(super) fn log_release(
        &self,
        sent: Option<u64>,
        script: &'static Script,
        keys: &[&[u8]],
        args: &[&[u8]],
        reply: &Value,
    ) {
        let Some(sent) = sent else { return };
        if !released(reply) {
            return;
        }
        self.replays.record(Entry::new(script, keys, args, sent));
        if self.replay_version(keys) != Some(sent) {
            // Sent before a switch, answered after it: due at once.
            self.replays.stale.store(true, Ordering::Relaxed);
        }
        self.replays.ensure_task(&self.conn, &self.stop);
    }
}

/// Reads the slot map once; returns how many slots changed primary.
#[cfg(feature = "cluster")]
async fn read_slots(conn: &Conn, replays: &Replays) -> usize {
    let Conn::Cluster(c) = conn else { return 0 };
    let read = tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<Value>(&mut c.conn.clone()),
    )
    .await;
    let Ok(Ok(reply)) = read else { return 0 };
    let mut view = replays.view.lock().unwrap_or_else(PoisonError::into_inner);
    view.get_or_insert_with(SlotView::new).update(&reply)
}

#[cfg(not(feature = "cluster"))]
async fn read_slots(_: &Conn, _: &Replays) -> usize {
    0
}

/// The replay task. Idle while there is nothing to watch (an empty log; for a
/// cluster, also no lease that may still live); otherwise it checks the topology
/// every [`POLL`] (sentinel) or [`CLUSTER_POLL`] (cluster) and replays the entries
/// sent under an older version than the current one.
async fn run(conn: Conn, replays: Arc<Replays>, stop: CancellationToken) {
    let mode = mode(&conn);
    let poll = if mode == Mode::Slots {
        CLUSTER_POLL
    } else {
        POLL
    };
    let mut first = true;
    // Scan the log only when something may be due: the version moved, a release
    // was logged behind it, or replays failed.
    let mut last_generation = None;
    let mut retry = false;
    loop {
        let active = !replays.is_empty() || (mode == Mode::Slots && replays.leases_live());
        if !active {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = replays.logged.notified() => {}
            }
            first = true;
            continue;
        }
        if !first {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(poll) => {}
            }
        }
        first = false;
        let stale = replays.stale.swap(false, Ordering::Relaxed);
        let current: Box<dyn Fn(&Entry) -> u64 + Send> = match mode {
            Mode::Off => return,
            Mode::Generation => {
                let Some(g) = version(&conn, &replays, None) else {
                    return;
                };
                let moved = last_generation != Some(g);
                last_generation = Some(g);
                if !(moved || stale || retry) {
                    continue;
                }
                Box::new(move |_: &Entry| g)
            }
            Mode::Slots => {
                let moved = read_slots(&conn, &replays).await > 0;
                if !(moved || stale || retry) {
                    continue;
                }
                let view = replays.view.lock().unwrap_or_else(PoisonError::into_inner);
                let changes = view.as_ref().map(|v| v.changes.clone()).unwrap_or_default();
                Box::new(move |e: &Entry| changes.get(usize::from(e.slot)).copied().unwrap_or(0))
            }
        };
        retry = false;
        let mut due = replays.take_due(&current);
        if due.is_empty() {
            continue;
        }
        // Newest first: the releases a failover lost are the latest ones.
        due.reverse();
        let targets: Vec<Option<(String, u16)>> = {
            let view = replays.view.lock().unwrap_or_else(PoisonError::into_inner);
            due.iter()
                .map(|e| view.as_ref().and_then(|v| v.primary(e.slot)).cloned())
                .collect()
        };
        let total = due.len();
        let results: Vec<(Entry, Result<Value, RedisError>)> =
            futures::stream::iter(due.into_iter().zip(targets))
                .map(|(e, at)| {
                    let conn = &conn;
                    async move {
                        let r = e.replay(conn, at.as_ref()).await;
                        (e, r)
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
        let (mut freed, mut failed) = (0usize, 0usize);
        let mut back = Vec::with_capacity(total);
        for (mut e, r) in results {
            match r {
                Ok(v) => {
                    freed += usize::from(released(&v));
                    // Kept until it expires, for a later failover.
                    e.sent = current(&e);
                }
                Err(error) => {
                    // Still behind the current version: due again at the next pass.
                    tracing::debug!(%error, "replaying a release on the new primary failed; will retry");
                    failed += 1;
                }
            }
            back.push(e);
        }
        tracing::info!(
            replayed = total - failed,
            freed,
            failed,
            "the primary changed: repeated the releases it may have lost"
        );
        replays.put_back(back);
        if failed > 0 {
            retry = true;
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
        assert!(r.take_due(|_| 0).is_empty());
        let due = r.take_due(|_| 1);
        let keys: Vec<&[u8]> = due.iter().map(|e| e.parts()[0]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"c"]);
        assert!(!r.is_empty());
        r.put_back(due);
        assert_eq!(r.take_due(|_| 2).len(), 3);
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
        let due = r.take_due(|_| 1);
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
        let due = r.take_due(|_| 1);
        assert!(due.len() < n);
        assert!(due.iter().map(Entry::cost).sum::<usize>() <= BUDGET);
        let last = [&big[..], (n - 1).to_string().as_bytes()].concat();
        assert_eq!(due.last().unwrap().parts()[0], &last[..]);
    }
}
