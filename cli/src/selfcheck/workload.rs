//! The workload of phases 1 and 2: tasks of every instance taking the keys,
//! with the checks of each critical section, and what a run found ([`Findings`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::FencingToken;
use lockflight::fence::{Fenced, FencedKey};
use tokio::time::Instant;

use super::subject::{Release, Subject};
use crate::report::{Check, plural};

pub(super) const KEYS: usize = 3;
pub(super) const TASKS_PER_INSTANCE: usize = 8;

/// What a run of the workload found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) sections: u64,
    pub(crate) overlaps: u64,
    pub(crate) out_of_order: u64,
    pub(crate) fenced_live: u64,
    pub(crate) lost_updates: i64,
    /// Releases that reported the lease lost while its holder had not been told.
    pub(crate) false_losses: u64,
    /// Keys still held once every instance was idle.
    pub(crate) left_locked: Vec<String>,
    pub(crate) errors: Vec<String>,
}

impl Findings {
    /// Adds the findings of another phase.
    pub(super) fn absorb(&mut self, other: Findings) {
        self.sections += other.sections;
        self.overlaps += other.overlaps;
        self.out_of_order += other.out_of_order;
        self.fenced_live += other.fenced_live;
        self.lost_updates += other.lost_updates;
        self.false_losses += other.false_losses;
        self.left_locked.extend(other.left_locked);
        self.errors.extend(other.errors);
    }

    pub(crate) fn checks(&self) -> Vec<Check> {
        let one = |id, bad: bool, ok: String, what: String, fix: &str| {
            if bad {
                Check::fail(id, what, fix)
            } else {
                Check::pass(id, ok)
            }
        };
        let mut checks = vec![
            one(
                "exclusion",
                self.overlaps > 0,
                format!(
                    "{}, none overlapped",
                    plural(self.sections, "critical section", "critical sections")
                ),
                format!(
                    "{} of {} overlapped another of their key",
                    self.overlaps,
                    plural(self.sections, "critical section", "critical sections")
                ),
                "run `lockflight doctor` on this server; report the run with its output",
            ),
            one(
                "fenced-order",
                self.out_of_order > 0 || self.fenced_live > 0,
                "tokens strictly increased per key, no live holder's write was fenced".into(),
                format!(
                    "{} not increase, {} refused by the fence",
                    plural(self.out_of_order, "token did", "tokens did"),
                    plural(
                        self.fenced_live,
                        "live holder's write was",
                        "live holders' writes were"
                    )
                ),
                "check the server's clock (it must not step back) and `lockflight doctor`",
            ),
            one(
                "lost-updates",
                self.lost_updates != 0,
                "the read-modify-write counters are exact".into(),
                format!("the counters are off by {}", self.lost_updates),
                "run `lockflight doctor` (eviction, persistence) on this server",
            ),
            one(
                "truthful-release",
                self.false_losses > 0,
                "every release told the truth (a lost reply was never reported as a lost lease)"
                    .into(),
                format!(
                    "{} a lost lease whose holder had not been told it was lost",
                    plural(self.false_losses, "release reported", "releases reported")
                ),
                "report the run with its output; check `lockflight doctor` (eviction)",
            ),
            one(
                "nothing-left-locked",
                !self.left_locked.is_empty(),
                "no key was left held once the instances were idle".into(),
                format!(
                    "keys still held after every release: {}",
                    self.left_locked.join(", ")
                ),
                "report the run with its output; `lockflight inspect` shows what holds them",
            ),
        ];
        if !self.errors.is_empty() {
            checks.push(Check::warn(
                "errors",
                format!(
                    "{}, e.g. {}",
                    plural(self.errors.len(), "operation failed", "operations failed"),
                    self.errors[0]
                ),
                "see `lockflight doctor`",
            ));
        }
        checks
    }
}

fn push(errors: &Mutex<Vec<String>>, e: String) {
    errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
}

/// Runs the workload of the module docs on `subjects` (one per instance),
/// `rounds` critical sections per task, with Redis data under `prefix`, for at
/// most `budget`; then checks (for at most 5 s, until the instances' background
/// releases are done) that no key is left held.
pub(crate) async fn exercise(
    subjects: Vec<Arc<dyn Subject>>,
    data: redis::aio::MultiplexedConnection,
    prefix: &str,
    rounds: usize,
    budget: Duration,
    on_section: impl Fn() + Send + Sync + 'static,
) -> Findings {
    let deadline = Instant::now() + budget;
    // The counters may hold an earlier phase's sections.
    let before = counters_total(&mut data.clone(), prefix).await;
    let occupancy: Arc<Vec<AtomicUsize>> =
        Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let last: Arc<Mutex<HashMap<usize, FencingToken>>> = Arc::default();
    let sections = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let out_of_order = Arc::new(AtomicU64::new(0));
    let fenced_live = Arc::new(AtomicU64::new(0));
    let false_losses = Arc::new(AtomicU64::new(0));
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let on_section = Arc::new(on_section);
    let mut tasks = tokio::task::JoinSet::new();
    for subject in &subjects {
        for t in 0..TASKS_PER_INSTANCE {
            let subject = Arc::clone(subject);
            let (occupancy, last, sections, overlaps, out_of_order, fenced_live) = (
                Arc::clone(&occupancy),
                Arc::clone(&last),
                Arc::clone(&sections),
                Arc::clone(&overlaps),
                Arc::clone(&out_of_order),
                Arc::clone(&fenced_live),
            );
            let (false_losses, errors) = (Arc::clone(&false_losses), Arc::clone(&errors));
            let on_section = Arc::clone(&on_section);
            let mut conn = data.clone();
            let prefix = prefix.to_owned();
            tasks.spawn(async move {
                for round in 0..rounds {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let k = (t + round) % KEYS;
                    let key = format!("key{k}");
                    let held = match tokio::time::timeout_at(deadline, subject.acquire(key)).await {
                        Ok(Ok(held)) => held,
                        Ok(Err(e)) => {
                            push(&errors, e);
                            continue;
                        }
                        Err(_) => break,
                    };
                    if occupancy[k].fetch_add(1, Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    {
                        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                        let previous = last.entry(k).or_default();
                        if held.token <= *previous {
                            out_of_order.fetch_add(1, Ordering::SeqCst);
                        }
                        *previous = (*previous).max(held.token);
                    }
                    let counter = format!("{prefix}:{{key{k}}}:counter");
                    let read: redis::RedisResult<Option<i64>> =
                        redis::cmd("GET").arg(&counter).query_async(&mut conn).await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let write: redis::RedisResult<()> = redis::cmd("SET")
                        .arg(&counter)
                        .arg(read.unwrap_or(None).unwrap_or(0) + 1)
                        .query_async(&mut conn)
                        .await;
                    if let Err(e) = write {
                        push(&errors, e.to_string());
                    }
                    if let Ok(fenced) = FencedKey::new(format!("{prefix}:{{key{k}}}:fenced")) {
                        match fenced.incr_by(&mut conn, held.token, 1).await {
                            Ok(Fenced::Stale { .. }) => {
                                fenced_live.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(Fenced::Applied(_)) => {}
                            Err(e) => push(&errors, e.to_string()),
                        }
                    }
                    sections.fetch_add(1, Ordering::SeqCst);
                    occupancy[k].fetch_sub(1, Ordering::SeqCst);
                    on_section();
                    let told = (held.is_lost)();
                    match held.release.await {
                        Release::Done => {}
                        Release::Lost if told => {}
                        Release::Lost => {
                            false_losses.fetch_add(1, Ordering::SeqCst);
                        }
                        Release::Failed(e) => push(&errors, e),
                    }
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    let total = counters_total(&mut data.clone(), prefix).await - before;
    let left_locked = left_locked(&*subjects[0], Duration::from_secs(5)).await;
    let sections = sections.load(Ordering::SeqCst);
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(|p| p.into_inner()));
    Findings {
        sections,
        overlaps: overlaps.load(Ordering::SeqCst),
        out_of_order: out_of_order.load(Ordering::SeqCst),
        fenced_live: fenced_live.load(Ordering::SeqCst),
        lost_updates: sections as i64 - total,
        false_losses: false_losses.load(Ordering::SeqCst),
        left_locked,
        errors,
    }
}

/// The sum of the workload's read-modify-write counters.
async fn counters_total(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> i64 {
    let mut total = 0;
    for k in 0..KEYS {
        let counter = format!("{prefix}:{{key{k}}}:counter");
        let value: Option<i64> = redis::cmd("GET")
            .arg(&counter)
            .query_async(conn)
            .await
            .unwrap_or(None);
        total += value.unwrap_or(0);
    }
    total
}

/// The keys of the workload that `subject` still sees held after `wait` (asked
/// every 50 ms until none is).
async fn left_locked(subject: &dyn Subject, wait: Duration) -> Vec<String> {
    let deadline = Instant::now() + wait;
    loop {
        let mut held = Vec::new();
        for k in 0..KEYS {
            let key = format!("key{k}");
            if subject.is_held(key.clone()).await.unwrap_or(false) {
                held.push(key);
            }
        }
        if held.is_empty() || Instant::now() >= deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Deletes every key under `prefix` (SCAN, bounded).
pub(crate) async fn cleanup(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) {
    let mut cursor: u64 = 0;
    for _ in 0..1000 {
        let Ok((next, names)): redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
        else {
            return;
        };
        for name in names {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(name).query_async(conn).await;
        }
        cursor = next;
        if cursor == 0 {
            return;
        }
    }
}
