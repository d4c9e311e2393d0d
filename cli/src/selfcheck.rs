//! `lockflight selfcheck`: runs, under a private key prefix and bounded in time,
//! the parts of lockflight's fault matrix that are safe on a user's deployment,
//! against the user's server, and reports violations:
//!
//! * many waiters: 2 instances × 8 tasks on 3 keys;
//! * exclusion: no two critical sections of a key overlap (an in-process
//!   occupancy count per key);
//! * the fenced-order oracle: each key's tokens strictly increase in the order
//!   the critical sections ran, and a fenced write (`FencedKey`) of a live holder
//!   is never refused;
//! * lost updates: a read-modify-write counter in Redis (GET, pause, SET) ends
//!   equal to the number of critical sections.
//!
//! Not run here (they need a proxy or signals on the user's machine; the test
//! suite runs them): lost replies, paused clients, killed connections.
//!
//! The engine takes any [`Subject`] (a lock under test), so the tests point it
//! at a deliberately broken lock and check that it finds the violation.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey};
use lockflight::{FencingToken, Locker, RedisBackend};
use tokio::time::Instant;

use crate::report::{Check, Verdict, print_checks};
use crate::{EXIT_FAILED, connect, progress, redact};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A held critical section of the lock under test.
pub(crate) struct Held {
    pub(crate) token: FencingToken,
    pub(crate) release: BoxFuture<'static, ()>,
}

/// A lock under test: one per instance.
pub(crate) trait Subject: Send + Sync + 'static {
    fn acquire(&self, key: String) -> BoxFuture<'_, Result<Held, String>>;
}

/// lockflight itself.
struct Lockflight(Locker);

impl Subject for Lockflight {
    fn acquire(&self, key: String) -> BoxFuture<'_, Result<Held, String>> {
        Box::pin(async move {
            let guard = self.0.lock(key).await.map_err(|e| e.to_string())?;
            let token = guard.fencing_token();
            Ok(Held {
                token,
                release: Box::pin(async move {
                    let _ = guard.release().await;
                }),
            })
        })
    }
}

const KEYS: usize = 3;
const TASKS_PER_INSTANCE: usize = 8;
const ROUNDS: usize = 40;

/// What a run found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) sections: u64,
    pub(crate) overlaps: u64,
    pub(crate) out_of_order: u64,
    pub(crate) fenced_live: u64,
    pub(crate) lost_updates: i64,
    pub(crate) errors: Vec<String>,
}

impl Findings {
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
                format!("{} critical sections, none overlapped", self.sections),
                format!(
                    "{} of {} critical sections overlapped another of their key",
                    self.overlaps, self.sections
                ),
                "run `lockflight doctor` on this server; report the run with its output",
            ),
            one(
                "fenced-order",
                self.out_of_order > 0 || self.fenced_live > 0,
                "tokens strictly increased per key, no live holder's write was fenced".into(),
                format!(
                    "{} tokens did not increase, {} live holders' writes were refused by the fence",
                    self.out_of_order, self.fenced_live
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
        ];
        if !self.errors.is_empty() {
            checks.push(Check::warn(
                "errors",
                format!(
                    "{} operations failed, e.g. {}",
                    self.errors.len(),
                    self.errors[0]
                ),
                "see `lockflight doctor`",
            ));
        }
        checks
    }
}

/// Runs the workload of the module docs on `subjects` (one per instance), with
/// Redis data under `prefix`, for at most `budget`.
pub(crate) async fn exercise(
    subjects: Vec<Arc<dyn Subject>>,
    data: redis::aio::MultiplexedConnection,
    prefix: &str,
    budget: Duration,
    on_section: impl Fn() + Send + Sync + 'static,
) -> Findings {
    let deadline = Instant::now() + budget;
    let occupancy: Arc<Vec<AtomicUsize>> =
        Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let last: Arc<Mutex<HashMap<usize, FencingToken>>> = Arc::default();
    let sections = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let out_of_order = Arc::new(AtomicU64::new(0));
    let fenced_live = Arc::new(AtomicU64::new(0));
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let on_section = Arc::new(on_section);
    let mut tasks = tokio::task::JoinSet::new();
    for subject in &subjects {
        for t in 0..TASKS_PER_INSTANCE {
            let subject = Arc::clone(subject);
            let (occupancy, last, sections, overlaps, out_of_order, fenced_live, errors) = (
                Arc::clone(&occupancy),
                Arc::clone(&last),
                Arc::clone(&sections),
                Arc::clone(&overlaps),
                Arc::clone(&out_of_order),
                Arc::clone(&fenced_live),
                Arc::clone(&errors),
            );
            let on_section = Arc::clone(&on_section);
            let mut conn = data.clone();
            let prefix = prefix.to_owned();
            tasks.spawn(async move {
                for round in 0..ROUNDS {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let k = (t + round) % KEYS;
                    let key = format!("key{k}");
                    let held = match tokio::time::timeout_at(deadline, subject.acquire(key)).await {
                        Ok(Ok(held)) => held,
                        Ok(Err(e)) => {
                            errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
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
                        errors
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(e.to_string());
                    }
                    if let Ok(fenced) = FencedKey::new(format!("{prefix}:{{key{k}}}:fenced")) {
                        match fenced.incr_by(&mut conn, held.token, 1).await {
                            Ok(Fenced::Stale { .. }) => {
                                fenced_live.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(Fenced::Applied(_)) => {}
                            Err(e) => errors
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(e.to_string()),
                        }
                    }
                    sections.fetch_add(1, Ordering::SeqCst);
                    occupancy[k].fetch_sub(1, Ordering::SeqCst);
                    on_section();
                    held.release.await;
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    let mut conn = data;
    let mut total = 0i64;
    for k in 0..KEYS {
        let counter = format!("{prefix}:{{key{k}}}:counter");
        let value: Option<i64> = redis::cmd("GET")
            .arg(&counter)
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        total += value.unwrap_or(0);
    }
    let sections = sections.load(Ordering::SeqCst);
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(|p| p.into_inner()));
    Findings {
        sections,
        overlaps: overlaps.load(Ordering::SeqCst),
        out_of_order: out_of_order.load(Ordering::SeqCst),
        fenced_live: fenced_live.load(Ordering::SeqCst),
        lost_updates: sections as i64 - total,
        errors,
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

/// `lockflight selfcheck`.
pub(crate) async fn run(url: &str, budget: Duration, json: bool) -> Result<u8, String> {
    let data = connect(url).await?;
    let prefix = format!("lockflight-selfcheck-{:x}", rand::random::<u64>());
    let mut subjects: Vec<Arc<dyn Subject>> = Vec::new();
    for _ in 0..2 {
        let backend = RedisBackend::builder(url)
            .prefix(&prefix)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let locker = Locker::builder(backend)
            .lease_ttl(Duration::from_secs(5))
            .wait_timeout(budget)
            .build()
            .map_err(|e| e.to_string())?;
        subjects.push(Arc::new(Lockflight(locker)));
    }
    let bar = progress((2 * TASKS_PER_INSTANCE * ROUNDS) as u64, json);
    bar.set_message("critical sections");
    let counted = bar.clone();
    let findings = exercise(subjects, data.clone(), &prefix, budget, move || {
        counted.inc(1)
    })
    .await;
    bar.finish_and_clear();
    let mut conn = data;
    cleanup(&mut conn, &prefix).await;
    let checks = findings.checks();
    Ok(
        match print_checks("selfcheck", &redact(url), &checks, json) {
            Verdict::Fail => EXIT_FAILED,
            _ => 0,
        },
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use lockflight::FencingToken;

    use super::{Held, Subject, cleanup, exercise};

    /// A deliberately broken lock: grants every request at once, with a token that
    /// only counts grants per instance (so two instances mint the same tokens).
    struct Broken(AtomicU64);

    impl Subject for Broken {
        fn acquire(&self, _key: String) -> super::BoxFuture<'_, Result<Held, String>> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                Ok(Held {
                    token: FencingToken { epoch: n, seq: 0 },
                    release: Box::pin(async {}),
                })
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finds_the_violations_of_a_broken_lock() {
        let server = testkit::shared();
        let prefix = testkit::unique_prefix("selfcheck-broken");
        let subjects: Vec<Arc<dyn Subject>> = vec![
            Arc::new(Broken(AtomicU64::new(1))),
            Arc::new(Broken(AtomicU64::new(1))),
        ];
        let findings = exercise(
            subjects,
            server.connection().await,
            &prefix,
            Duration::from_secs(10),
            || {},
        )
        .await;
        assert!(findings.sections > 0);
        assert!(findings.overlaps > 0, "{findings:?}");
        assert!(findings.out_of_order > 0, "{findings:?}");
        assert!(
            findings
                .checks()
                .iter()
                .any(|c| c.verdict == crate::report::Verdict::Fail)
        );
        cleanup(&mut server.connection().await, &prefix).await;
    }
}
