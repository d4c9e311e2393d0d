//! `lockflight selfcheck`: runs, under a private key prefix and bounded in time,
//! the parts of lockflight's fault matrix that are safe on a user's deployment,
//! against the user's server, and reports violations. Three phases share the
//! time budget:
//!
//! 1. **many waiters**: 2 instances × 8 tasks on 3 keys;
//! 2. **lost replies**: the same workload, with the instances connected through a
//!    local proxy ([`FaultProxy`], loopback, ephemeral port) that cuts a
//!    connection right after forwarding some requests (acquires, releases,
//!    renewals, queue calls alike), so the server applies them and the client
//!    never gets the reply;
//! 3. **a paused client**: an instance with a 1 s lease takes a key and writes a
//!    fenced resource, then all its traffic stops (the proxy holds it back, as a
//!    stopped process); another instance takes the key, then the paused one
//!    resumes and writes late.
//!
//! What is checked, over the phases:
//!
//! * exclusion: no two critical sections of a key overlap (an in-process
//!   occupancy count per key);
//! * the fenced-order oracle: each key's tokens strictly increase in the order
//!   the critical sections ran, and a fenced write (`FencedKey`) of a live holder
//!   is never refused;
//! * lost updates: a read-modify-write counter in Redis (GET, pause, SET) ends
//!   equal to the number of critical sections;
//! * truthful release: a release reports the lease lost only if its holder had
//!   already been told so (a lost reply is no loss);
//! * nothing left locked: once the instances are idle, no key is held;
//! * the paused client: the next holder gets a greater token, its fenced write
//!   lands, the paused holder's late fenced write is refused, and the paused
//!   holder's guard reports the loss (by the time the next holder has the key)
//!   and its release says so.
//!
//! Not run here: killed connections by the server (`CLIENT KILL` would need
//! rights the application's user should not have) and failovers.
//!
//! The engine takes any [`Subject`] (a lock under test), so the tests point it
//! at deliberately broken locks and check that it finds the violations.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey};
use lockflight::inspect::Inspector;
use lockflight::{Error, FencingToken, Handoff, LockGuard, Locker, RedisBackend};
use tokio::time::Instant;

use crate::proxy::FaultProxy;
use crate::report::{Check, Verdict, plural, print_checks};
use crate::{EXIT_FAILED, connect, progress, redact};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a release reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// It removed the lease.
    Done,
    /// The lease was gone (expired, taken over).
    Lost,
    /// Another error.
    Failed(String),
}

/// A held critical section of the lock under test.
pub(crate) struct Held {
    pub(crate) token: FencingToken,
    /// Whether the lock has told its holder the lease is lost.
    pub(crate) is_lost: Box<dyn Fn() -> bool + Send + Sync>,
    pub(crate) release: BoxFuture<'static, Release>,
}

/// A lock under test: one per instance.
pub(crate) trait Subject: Send + Sync + 'static {
    /// Takes `key`, waiting for it.
    fn acquire(&self, key: String) -> BoxFuture<'_, Result<Held, String>>;
    /// Whether anything holds `key` now (read from the server).
    fn is_held(&self, key: String) -> BoxFuture<'_, Result<bool, String>>;
    /// Stops (`true`) or resumes all of this instance's traffic, as a stopped
    /// and continued process.
    fn pause(&self, paused: bool);
}

/// lockflight itself, connected directly or through a fault proxy.
struct Lockflight {
    locker: Locker,
    inspector: Inspector,
    data: redis::aio::MultiplexedConnection,
    proxy: Option<Arc<FaultProxy>>,
}

impl Subject for Lockflight {
    fn acquire(&self, key: String) -> BoxFuture<'_, Result<Held, String>> {
        Box::pin(async move {
            let guard = self.locker.lock(key).await.map_err(|e| e.to_string())?;
            let token = guard.fencing_token();
            let guard: Arc<Mutex<Option<LockGuard>>> = Arc::new(Mutex::new(Some(guard)));
            let watched = Arc::clone(&guard);
            Ok(Held {
                token,
                is_lost: Box::new(move || {
                    watched
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_ref()
                        .is_some_and(LockGuard::is_lost)
                }),
                release: Box::pin(async move {
                    let guard = guard.lock().unwrap_or_else(|p| p.into_inner()).take();
                    match guard {
                        Some(guard) => match guard.release().await {
                            Ok(()) => Release::Done,
                            Err(Error::LeaseLost { .. }) => Release::Lost,
                            Err(e) => Release::Failed(e.to_string()),
                        },
                        None => Release::Failed("released twice".into()),
                    }
                }),
            })
        })
    }

    fn is_held(&self, key: String) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async move {
            let mut data = self.data.clone();
            self.inspector
                .key(&mut data, key)
                .await
                .map(|state| state.is_held())
                .map_err(|e| e.to_string())
        })
    }

    fn pause(&self, paused: bool) {
        if let Some(proxy) = &self.proxy {
            proxy.pause(paused);
        }
    }
}

const KEYS: usize = 3;
const TASKS_PER_INSTANCE: usize = 8;
/// Critical sections per task in the many-waiters phase, and under lost replies.
const ROUNDS: usize = 40;
const ROUNDS_LOST_REPLIES: usize = 15;
/// Under lost replies: the chance (‰) that a forwarded request loses its reply,
/// and at most how many do.
const CUT_PER_MILLE: u32 = 100;
const CUT_BUDGET: u64 = 12;
/// The paused instance's lease TTL.
const PAUSED_TTL: Duration = Duration::from_secs(1);

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
    fn absorb(&mut self, other: Findings) {
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

/// The paused-client phase (module docs, phase 3): `paused` takes the key and
/// writes, then is paused; `next` takes the key; `paused` resumes and writes
/// late. Returns the verdict; at most `budget` plus one release.
pub(crate) async fn paused_client(
    paused: &dyn Subject,
    next: &dyn Subject,
    mut data: redis::aio::MultiplexedConnection,
    prefix: &str,
    budget: Duration,
) -> Check {
    const ID: &str = "paused-client";
    let deadline = Instant::now() + budget;
    let key = "paused".to_owned();
    let not_run = |what: String| {
        Check::warn(
            ID,
            format!("not finished: {what}"),
            "give selfcheck more --seconds; see `lockflight doctor`",
        )
    };
    let resource = match FencedKey::new(format!("{prefix}:{{paused}}:resource")) {
        Ok(resource) => resource,
        Err(e) => return not_run(e.to_string()),
    };
    let first = match tokio::time::timeout_at(deadline, paused.acquire(key.clone())).await {
        Ok(Ok(held)) => held,
        Ok(Err(e)) => return not_run(format!("the first holder's acquire failed: {e}")),
        Err(_) => return not_run("the first holder's acquire timed out".into()),
    };
    let mut violations = Vec::new();
    match resource.set(&mut data, first.token, "first").await {
        Ok(Fenced::Applied(())) => {}
        Ok(Fenced::Stale { last, .. }) => violations.push(format!(
            "the live holder's write (token {}) was refused: the resource had {last}",
            first.token
        )),
        Err(e) => return not_run(format!("the first fenced write failed: {e}")),
    }
    paused.pause(true);
    let second = tokio::time::timeout_at(deadline, next.acquire(key)).await;
    let told = (first.is_lost)();
    let second = match second {
        Ok(Ok(held)) => held,
        other => {
            paused.pause(false);
            let _ = first.release.await;
            return match other {
                Ok(Err(e)) => not_run(format!("the next holder's acquire failed: {e}")),
                _ => Check::fail(
                    ID,
                    format!(
                        "the key of a holder paused past its {PAUSED_TTL:?} lease was not free within {budget:?}"
                    ),
                    "report the run with its output; `lockflight inspect` shows what holds the key",
                ),
            };
        }
    };
    if second.token <= first.token {
        violations.push(format!(
            "the next holder's token {} is not greater than the paused holder's {}",
            second.token, first.token
        ));
    }
    if !told {
        violations.push(
            "the paused holder's guard did not report its loss by the time the next holder had the key"
                .into(),
        );
    }
    match resource.set(&mut data, second.token, "next").await {
        Ok(Fenced::Applied(())) => {}
        Ok(Fenced::Stale { last, .. }) => violations.push(format!(
            "the next holder's write (token {}) was refused: the resource had {last}",
            second.token
        )),
        Err(e) => violations.push(format!("the next holder's fenced write failed: {e}")),
    }
    paused.pause(false);
    // The paused holder resumes and writes late.
    match resource.set(&mut data, first.token, "late").await {
        Ok(Fenced::Stale { .. }) => {}
        Ok(Fenced::Applied(())) => violations.push(format!(
            "the paused holder's late write (token {}) was applied after the next holder's ({})",
            first.token, second.token
        )),
        Err(e) => violations.push(format!("the late fenced write failed: {e}")),
    }
    match first.release.await {
        Release::Lost => {}
        Release::Done => violations.push(
            "the paused holder's release reported success after the next holder took the key"
                .into(),
        ),
        Release::Failed(e) => violations.push(format!("the paused holder's release failed: {e}")),
    }
    let _ = second.release.await;
    if violations.is_empty() {
        Check::pass(
            ID,
            format!(
                "a holder paused past its {PAUSED_TTL:?} lease was told of its loss; the next holder's token {} > {}; the late fenced write was refused",
                second.token, first.token
            ),
        )
    } else {
        Check::fail(
            ID,
            violations.join("; "),
            "check the server's clock and `lockflight doctor`; report the run with its output",
        )
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

/// The server's address of `url` (for the proxy), and the URL with the proxy's
/// port on 127.0.0.1 in its place (credentials and database kept).
async fn through_proxy(url: &str) -> Result<(SocketAddr, impl Fn(u16) -> String), String> {
    let parsed = redis::parse_redis_url(url)
        .filter(|u| u.scheme() == "redis")
        .ok_or("only redis:// URLs (TCP without TLS) can be proxied")?;
    let host = parsed.host_str().ok_or("the URL has no host")?.to_owned();
    let port = parsed.port().unwrap_or(6379);
    let target = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} resolves to no address"))?;
    Ok((target, move |proxy_port: u16| {
        let mut via = parsed.clone();
        let _ = via.set_host(Some("127.0.0.1"));
        let _ = via.set_port(Some(proxy_port));
        via.to_string()
    }))
}

/// An instance on `url` (lease TTL `ttl`, waits at most `wait`); with a proxy,
/// without local handoff, so that every critical section sends its own acquire
/// and release through it.
async fn instance(
    url: &str,
    prefix: &str,
    data: &redis::aio::MultiplexedConnection,
    ttl: Duration,
    wait: Duration,
    proxy: Option<Arc<FaultProxy>>,
) -> Result<Lockflight, String> {
    // Through a client of the command's own: a `rediss://` URL gets the
    // certificates of the `--tls-…` options.
    let client = crate::tls::client(url).map_err(|e| format!("bad URL {}: {e}", redact(url)))?;
    let backend = RedisBackend::from_client(client)
        .prefix(prefix)
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut locker = Locker::builder(backend).lease_ttl(ttl).wait_timeout(wait);
    if proxy.is_some() {
        locker = locker.handoff(Handoff::disabled());
    }
    let locker = locker.build().map_err(|e| e.to_string())?;
    Ok(Lockflight {
        locker,
        inspector: Inspector::new(prefix),
        data: data.clone(),
        proxy,
    })
}

/// `lockflight selfcheck`.
pub(crate) async fn run(url: &str, budget: Duration, json: bool) -> Result<u8, String> {
    let data = connect(url).await?;
    let prefix = format!("lockflight-selfcheck-{:x}", rand::random::<u64>());
    let result = phases(url, &prefix, &data, budget, json).await;
    let mut conn = data;
    cleanup(&mut conn, &prefix).await;
    let checks = result?;
    Ok(
        match print_checks("selfcheck", &redact(url), &checks, json) {
            Verdict::Fail => EXIT_FAILED,
            _ => 0,
        },
    )
}

/// The three phases; the many waiters get 45 % of the budget, lost replies
/// 35 %, the paused client 20 % but at least 3 s (each workload then waits at
/// most 5 s for its keys to be free).
async fn phases(
    url: &str,
    prefix: &str,
    data: &redis::aio::MultiplexedConnection,
    budget: Duration,
    json: bool,
) -> Result<Vec<Check>, String> {
    let total = (2 * TASKS_PER_INSTANCE * (ROUNDS + ROUNDS_LOST_REPLIES)) as u64 + 1;
    let bar = progress(total, json);
    let counted = bar.clone();
    let count = move || counted.inc(1);

    bar.set_message("many waiters");
    let mut subjects: Vec<Arc<dyn Subject>> = Vec::new();
    for _ in 0..2 {
        subjects.push(Arc::new(
            instance(url, prefix, data, Duration::from_secs(5), budget, None).await?,
        ));
    }
    let mut findings = exercise(
        subjects,
        data.clone(),
        prefix,
        ROUNDS,
        budget.mul_f64(0.45),
        count.clone(),
    )
    .await;

    bar.set_message("lost replies");
    let mut checks = Vec::new();
    match through_proxy(url).await {
        Ok((target, via)) => {
            let proxy = Arc::new(FaultProxy::start(target).await.map_err(|e| e.to_string())?);
            let mut subjects: Vec<Arc<dyn Subject>> = Vec::new();
            for _ in 0..2 {
                subjects.push(Arc::new(
                    instance(
                        &via(proxy.port()),
                        prefix,
                        data,
                        Duration::from_secs(5),
                        budget,
                        Some(Arc::clone(&proxy)),
                    )
                    .await?,
                ));
            }
            // Armed only once the instances are connected.
            proxy.lose_replies(CUT_PER_MILLE, CUT_BUDGET);
            let mut faulted = exercise(
                subjects,
                data.clone(),
                prefix,
                ROUNDS_LOST_REPLIES,
                budget.mul_f64(0.35),
                count,
            )
            .await;
            // Operations that failed here failed because of the cuts this
            // phase makes itself: reported with the phase, not as the server's.
            let injected = std::mem::take(&mut faulted.errors).len();
            findings.absorb(faulted);
            proxy.lose_replies(0, 0);
            let cuts = proxy.cuts();
            checks.push(if cuts > 0 {
                Check::pass(
                    "lost-replies",
                    format!(
                        "{} cut right after a request (its reply lost) while the instances worked; {} because of those cuts, as expected",
                        plural(cuts, "connection was", "connections were"),
                        plural(injected, "operation failed", "operations failed")
                    ),
                )
            } else {
                Check::warn(
                    "lost-replies",
                    "no reply was lost (too few requests in the time given)",
                    "give selfcheck more --seconds",
                )
            });

            bar.set_message("a paused client");
            let pausable = Arc::new(FaultProxy::start(target).await.map_err(|e| e.to_string())?);
            let paused = instance(
                &via(pausable.port()),
                prefix,
                data,
                PAUSED_TTL,
                budget,
                Some(Arc::clone(&pausable)),
            )
            .await?;
            let next = instance(url, prefix, data, Duration::from_secs(5), budget, None).await?;
            let rest = budget.mul_f64(0.2).max(Duration::from_secs(3));
            checks.push(paused_client(&paused, &next, data.clone(), prefix, rest).await);
            bar.inc(1);
        }
        Err(why) => {
            for id in ["lost-replies", "paused-client"] {
                checks.push(Check::warn(
                    id,
                    format!("not run: {why}"),
                    "run selfcheck with a redis:// URL",
                ));
            }
        }
    }
    bar.finish_and_clear();
    let mut all = findings.checks();
    all.extend(checks);
    Ok(all)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use lockflight::FencingToken;

    use super::{BoxFuture, Held, Release, Subject, cleanup, exercise, paused_client};
    use crate::report::Verdict;

    /// A deliberately broken lock: grants every request at once, with a token that
    /// only counts grants per instance (so two instances mint the same tokens);
    /// never tells a holder of a loss.
    struct Broken(AtomicU64);

    impl Subject for Broken {
        fn acquire(&self, _key: String) -> BoxFuture<'_, Result<Held, String>> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                Ok(Held {
                    token: FencingToken { epoch: n, seq: 0 },
                    is_lost: Box::new(|| false),
                    release: Box::pin(async { Release::Done }),
                })
            })
        }

        fn is_held(&self, _key: String) -> BoxFuture<'_, Result<bool, String>> {
            Box::pin(async { Ok(false) })
        }

        fn pause(&self, _paused: bool) {}
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
            super::ROUNDS,
            Duration::from_secs(10),
            || {},
        )
        .await;
        assert!(findings.sections > 0);
        assert!(findings.overlaps > 0, "{findings:?}");
        assert!(findings.out_of_order > 0, "{findings:?}");
        assert!(findings.checks().iter().any(|c| c.verdict == Verdict::Fail));
        cleanup(&mut server.connection().await, &prefix).await;
    }

    /// A lock that excludes (one process, a mutex per key, increasing tokens) but
    /// takes a lost reply for a lost lease: every third release says "lost"
    /// although nobody else took the key; and every fifth release forgets to free
    /// its key in the state that `is_held` reads (a release that never landed).
    #[derive(Default)]
    struct Untruthful {
        keys: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
        tokens: AtomicU64,
        releases: AtomicU64,
        stuck: Arc<Mutex<Vec<String>>>,
    }

    impl Subject for Untruthful {
        fn acquire(&self, key: String) -> BoxFuture<'_, Result<Held, String>> {
            Box::pin(async move {
                let lock = Arc::clone(self.keys.lock().unwrap().entry(key.clone()).or_default());
                let guard = lock.lock_owned().await;
                let epoch = self.tokens.fetch_add(1, Ordering::SeqCst) + 1;
                let n = self.releases.fetch_add(1, Ordering::SeqCst);
                let stuck = Arc::clone(&self.stuck);
                Ok(Held {
                    token: FencingToken { epoch, seq: 0 },
                    is_lost: Box::new(|| false),
                    release: Box::pin(async move {
                        drop(guard);
                        if n % 5 == 4 {
                            stuck.lock().unwrap().push(key);
                        }
                        if n % 3 == 2 {
                            Release::Lost
                        } else {
                            Release::Done
                        }
                    }),
                })
            })
        }

        fn is_held(&self, key: String) -> BoxFuture<'_, Result<bool, String>> {
            let held = self.stuck.lock().unwrap().contains(&key);
            Box::pin(async move { Ok(held) })
        }

        fn pause(&self, _paused: bool) {}
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finds_untruthful_releases_and_keys_left_locked() {
        let server = testkit::shared();
        let prefix = testkit::unique_prefix("selfcheck-untruthful");
        let lock: Arc<dyn Subject> = Arc::new(Untruthful::default());
        let findings = exercise(
            vec![Arc::clone(&lock), lock],
            server.connection().await,
            &prefix,
            5,
            Duration::from_secs(10),
            || {},
        )
        .await;
        assert_eq!(findings.overlaps, 0, "{findings:?}");
        assert_eq!(findings.out_of_order, 0, "{findings:?}");
        assert!(findings.false_losses > 0, "{findings:?}");
        assert!(!findings.left_locked.is_empty(), "{findings:?}");
        let failed: Vec<&str> = findings
            .checks()
            .iter()
            .filter(|c| c.verdict == Verdict::Fail)
            .map(|c| c.id)
            .collect();
        assert_eq!(failed, ["truthful-release", "nothing-left-locked"]);
        cleanup(&mut server.connection().await, &prefix).await;
    }

    /// A lock that hands a paused holder's key to the next instance at once, with
    /// the same token, and never tells the paused holder.
    struct Amnesiac {
        paused: AtomicBool,
    }

    impl Subject for Amnesiac {
        fn acquire(&self, _key: String) -> BoxFuture<'_, Result<Held, String>> {
            Box::pin(async {
                Ok(Held {
                    token: FencingToken { epoch: 7, seq: 0 },
                    is_lost: Box::new(|| false),
                    release: Box::pin(async { Release::Done }),
                })
            })
        }

        fn is_held(&self, _key: String) -> BoxFuture<'_, Result<bool, String>> {
            Box::pin(async { Ok(false) })
        }

        fn pause(&self, paused: bool) {
            self.paused.store(paused, Ordering::SeqCst);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finds_a_paused_holder_that_is_not_fenced_out() {
        let server = testkit::shared();
        let prefix = testkit::unique_prefix("selfcheck-paused");
        let paused = Amnesiac {
            paused: AtomicBool::new(false),
        };
        let next = Amnesiac {
            paused: AtomicBool::new(false),
        };
        let check = paused_client(
            &paused,
            &next,
            server.connection().await,
            &prefix,
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(check.verdict, Verdict::Fail, "{check:?}");
        assert!(check.detail.contains("not greater"), "{}", check.detail);
        assert!(
            check.detail.contains("did not report its loss"),
            "{}",
            check.detail
        );
        assert!(check.detail.contains("late write"), "{}", check.detail);
        assert!(
            check.detail.contains("reported success"),
            "{}",
            check.detail
        );
        assert!(!paused.paused.load(Ordering::SeqCst), "resumed at the end");
        cleanup(&mut server.connection().await, &prefix).await;
    }
}
