//! The leader-only job: one instance at a time releases expired reservations.
//!
//! Every instance is a candidate of the election [`ELECTION`] (`inventory:jobs`),
//! with its name and port as identity, on a locker of its own whose lease TTL is
//! short (`JOB_LEASE_TTL_MS`, 2.5 s by default): a leader that dies is replaced
//! about one TTL later. [`Election::run`] starts the job when this instance leads,
//! drops it when leadership is lost, and campaigns again.
//!
//! The job, every `JOB_EVERY_MS`: release the reservations older than the hold
//! period (`RESERVATION_HOLD_SECS`, 15 min by default). Their units go back to
//! stock and each is recorded once in `released_reservations`. A sweep is one
//! transaction that first writes the job's row in `jobs` with lockflight's
//! [`FencedUpsert`], **fenced by the leader's term** (its lease's fencing token):
//!
//! ```sql
//! INSERT INTO jobs AS lockflight_row (name, leader, sweeps, released, swept_at_ms, fence_epoch, fence_seq)
//! VALUES (?, ?, 1, 0, ?, ?, ?)
//! ON CONFLICT (name) DO UPDATE SET leader = excluded.leader, sweeps = lockflight_row.sweeps + 1, ...
//!  WHERE (lockflight_row.fence_epoch, lockflight_row.fence_seq) <= (excluded.fence_epoch, excluded.fence_seq)
//! ```
//!
//! A leader whose term is older than the last sweep's (one that lost its lease
//! while paused, and resumed after a newer leader swept) is refused there, and its
//! transaction rolls back before it releases anything. SQLite serializes writers, so
//! the check and the effect are one step. Each applied sweep is logged in
//! `job_sweeps` with its term and leader: one run of rows per period of leadership,
//! the terms strictly increasing ([`sweeps_by_term`]).
//!
//! Who leads (identity, term, since when) is in `GET /stats` under `"job"`, from
//! [`Election::observe`], beside this instance's own part; the instance prints
//! every leadership change it sees and every start and stop of its job. The job's
//! lease is a mutex lease of its own locker: it does not count in `/stats`'s lock
//! counters, but with a `metrics` recorder its wait (a campaign) and hold (a term)
//! land in the `lockflight_*_seconds{kind=lock}` histograms with the reservations'.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockflight::election::{Election, LeaderInfo, Observation, Observed};
use lockflight::fence::{FenceColumns, Fenced, FencedUpsert};
use lockflight::guard::LossSignal;
use lockflight::{FencingToken, LockerBuilder};
use serde_json::json;
use sqlx::SqlitePool;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::AppError;
use super::db::to_sql;

/// The election every instance campaigns in for the job.
pub const ELECTION: &str = "inventory:jobs";
/// The job's name: the key of its row in `jobs`.
pub const JOB: &str = "release-expired-reservations";
/// Most reservations one sweep releases (the rest wait for the next sweep).
const BATCH: i64 = 100;

/// Default of `JOB_LEASE_TTL_MS`: the job's lease TTL, about the time a dead
/// leader's successor waits.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_millis(2500);
/// Default of `JOB_EVERY_MS`: the period of the leader's sweeps.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(1);
/// Default of `RESERVATION_HOLD_SECS`: how long a reservation holds its units.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(15 * 60);

/// How the job runs.
#[derive(Clone, Copy, Debug)]
pub struct JobConfig {
    /// The job's lease TTL (its locker's).
    pub lease_ttl: Duration,
    /// The period of the leader's sweeps.
    pub every: Duration,
    /// How long a reservation holds its units before a sweep releases them.
    pub hold: Duration,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            lease_ttl: DEFAULT_LEASE_TTL,
            every: DEFAULT_EVERY,
            hold: DEFAULT_HOLD,
        }
    }
}

/// The running job of one instance: its campaign (and, while it leads, its
/// sweeps) in a background task stopped when the last clone is dropped, and what
/// `/stats` shows of it. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LeaderJob {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    status: Arc<Status>,
    config: JobConfig,
    task: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping the campaign drops the work and gives up leadership.
        self.task.abort();
    }
}

/// This instance's part in the job.
#[derive(Debug)]
struct Status {
    /// The identity it campaigns with.
    identity: String,
    /// Who leads, as the newest change [`Election::observe`] gave.
    leader: Mutex<Option<LeaderInfo>>,
    /// Its term while it leads (and the job runs).
    leading: Mutex<Option<LeaderInfo>>,
    /// Terms it led.
    terms: AtomicU64,
    /// Sweeps it applied, and reservations they released.
    sweeps: AtomicU64,
    released: AtomicU64,
    /// Its sweeps the jobs row refused (a newer term had swept).
    refused: AtomicU64,
}

impl LeaderJob {
    /// Builds the job's locker from `builder` (its lease TTL set to
    /// `config.lease_ttl`) and starts campaigning for the job as `identity`; while
    /// this instance leads, it sweeps `db`.
    ///
    /// # Errors
    ///
    /// The locker's, for a lease TTL it refuses.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn start(
        builder: LockerBuilder,
        db: SqlitePool,
        identity: &str,
        config: JobConfig,
    ) -> Result<Self, lockflight::Error> {
        let locker = builder.lease_ttl(config.lease_ttl).build()?;
        let election = locker.election(ELECTION).identity(identity);
        let leader = election.observe();
        let status = Arc::new(Status {
            identity: identity.to_owned(),
            leader: Mutex::new(None),
            leading: Mutex::new(None),
            terms: AtomicU64::new(0),
            sweeps: AtomicU64::new(0),
            released: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let task = tokio::spawn(campaign(election, db, config, Arc::clone(&status), leader));
        Ok(LeaderJob {
            inner: Arc::new(Inner {
                status,
                config,
                task,
            }),
        })
    }

    /// The job in `/stats`: its settings, this instance's part (`leading`, its
    /// `term` and `since_ms` while it leads, counts) and who leads (`leader`, as
    /// the election's record says; `null` while nobody does).
    pub fn stats_json(&self) -> serde_json::Value {
        let Inner { status, config, .. } = &*self.inner;
        let leading = status.leading().clone();
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "name": JOB,
            "election": ELECTION,
            "identity": status.identity,
            "lease_ttl_ms": config.lease_ttl.as_millis() as u64,
            "every_ms": config.every.as_millis() as u64,
            "hold_s": config.hold.as_secs(),
            "leading": leading.is_some(),
            "term": leading.as_ref().map(|l| token_json(l.term)),
            "since_ms": leading.as_ref().map(|l| unix_ms(l.since)),
            "terms": n(&status.terms),
            "sweeps": n(&status.sweeps),
            "released": n(&status.released),
            "refused": n(&status.refused),
            "leader": status.leader().as_ref().map(|l| json!({
                "identity": l.identity,
                "term": token_json(l.term),
                "since_ms": unix_ms(l.since),
            })),
        })
    }
}

fn token_json(t: FencingToken) -> serde_json::Value {
    json!({ "epoch": t.epoch, "seq": t.seq })
}

/// `t` in milliseconds since the Unix epoch.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Status {
    fn leading(&self) -> std::sync::MutexGuard<'_, Option<LeaderInfo>> {
        self.leading.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn leader(&self) -> std::sync::MutexGuard<'_, Option<LeaderInfo>> {
        self.leader.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This instance leads in `info`'s term: the job starts, until the returned
    /// guard is dropped.
    fn gained(self: &Arc<Self>, info: &LeaderInfo, loss: LossSignal, config: JobConfig) -> Term {
        *self.leading() = Some(info.clone());
        self.terms.fetch_add(1, Ordering::Relaxed);
        println!(
            "[{}] leading {ELECTION} in term {}: releasing reservations older than {} s \
             every {} ms",
            self.identity,
            info.term,
            config.hold.as_secs(),
            config.every.as_millis()
        );
        Term {
            status: Arc::clone(self),
            term: info.term,
            loss,
        }
    }
}

/// A term's job while it runs: dropped when the job stops (leadership lost, the
/// term refused, or the campaign stopped), it says so.
struct Term {
    status: Arc<Status>,
    term: FencingToken,
    loss: LossSignal,
}

impl Drop for Term {
    fn drop(&mut self) {
        *self.status.leading() = None;
        let why = match self.loss.reason() {
            Some(cause) => format!("leadership lost ({cause})"),
            None => "the term ended".to_owned(),
        };
        println!(
            "[{}] stopped the job of term {}: {why}",
            self.status.identity, self.term
        );
    }
}

/// The campaign, for as long as the instance runs: [`Election::run`] with the
/// job as its work (campaigning again after an error), and the log of every
/// leadership change the observer sees.
async fn campaign(
    election: Election,
    db: SqlitePool,
    config: JobConfig,
    status: Arc<Status>,
    mut leader: Observation,
) {
    let identity = status.identity.clone();
    let changes = async {
        while let Some(change) = leader.next().await {
            match change {
                Observed::Leader(l) => println!(
                    "[{identity}] {ELECTION} is led by {} in term {}",
                    l.identity, l.term
                ),
                Observed::NoLeader => println!("[{identity}] {ELECTION} has no leader"),
                Observed::Missed(n) => println!("[{identity}] {ELECTION}: {n} changes missed"),
                _ => {}
            }
            *status.leader() = leader.current();
        }
    };
    let run = async {
        loop {
            let ran = election
                .run(|info, loss| lead(db.clone(), Arc::clone(&status), config, info, loss))
                .await;
            match ran {
                Ok(never) => match never {},
                Err(e) => {
                    println!("[{identity}] campaign for {ELECTION} failed: {e}; again in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    };
    tokio::join!(changes, run);
}

/// The job of one term: a sweep every period, fenced by `info.term`, until
/// leadership is lost (then [`Election::run`] drops this future) or a sweep is
/// refused (a newer term swept: this one is over; returning resigns).
async fn lead(
    db: SqlitePool,
    status: Arc<Status>,
    config: JobConfig,
    info: LeaderInfo,
    loss: LossSignal,
) {
    let _term = status.gained(&info, loss.clone(), config);
    let mut period = tokio::time::interval(config.every);
    period.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        period.tick().await;
        if loss.is_lost() {
            return;
        }
        match sweep(
            &db,
            info.term,
            &info.identity,
            unix_ms(SystemTime::now()),
            config.hold,
        )
        .await
        {
            Ok(Swept::Applied { released }) => {
                status.sweeps.fetch_add(1, Ordering::Relaxed);
                status.released.fetch_add(released, Ordering::Relaxed);
                if released > 0 {
                    println!(
                        "[{}] released {released} expired reservation(s) in term {}",
                        info.identity, info.term
                    );
                }
            }
            Ok(Swept::Refused { last }) => {
                status.refused.fetch_add(1, Ordering::Relaxed);
                println!(
                    "[{}] sweep of term {} refused: the jobs row carries the newer term {last}",
                    info.identity, info.term
                );
                return;
            }
            Err(e) => println!("[{}] sweep failed: {e}", info.identity),
        }
    }
}

/// What a sweep did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swept {
    /// Applied: the jobs row took the term, and `released` reservations went back
    /// to stock.
    Applied {
        /// Reservations released.
        released: u64,
    },
    /// Refused: the jobs row carries the newer term `last`; nothing was written.
    Refused {
        /// The term of the last applied sweep.
        last: FencingToken,
    },
}

/// Where the jobs keep their fence: `jobs.fence_epoch`, `jobs.fence_seq`, keyed by
/// `name`; a term may sweep any number of times (guard `<=`).
fn job_fence_columns() -> Result<FenceColumns, AppError> {
    FenceColumns::new("jobs", "name").map_err(|e| AppError::Internal(e.to_string()))
}

/// One sweep under `term` by `leader` at `now_ms` (Unix ms): in one transaction,
/// the fenced write of the job's row (refused, and the transaction rolled back,
/// if the row carries a newer term), then the release of up to 100 reservations
/// made before `now_ms - hold` (each recorded in `released_reservations`, its
/// units back in stock), then the sweep's line in `job_sweeps`.
///
/// Repeating a sweep is safe: a reservation is released at most once (the primary
/// key of `released_reservations`, and the anti-join that picks them).
pub async fn sweep(
    db: &SqlitePool,
    term: FencingToken,
    leader: &str,
    now_ms: i64,
    hold: Duration,
) -> Result<Swept, AppError> {
    let columns = job_fence_columns()?;
    let (epoch, seq) = (to_sql(term.epoch)?, to_sql(term.seq)?);
    let internal = |e: lockflight::Error| AppError::Internal(e.to_string());
    let mut tx = db.begin().await?;
    let fenced = FencedUpsert::<sqlx::Sqlite>::new(&columns, term, JOB)
        .value("leader", leader.to_owned())
        .and_then(|u| u.value("sweeps", 1_i64))
        .and_then(|u| u.value("released", 0_i64))
        .and_then(|u| u.value("swept_at_ms", now_ms))
        .map_err(internal)?
        .update_set(|q| {
            q.push(
                "leader = excluded.leader, sweeps = lockflight_row.sweeps + 1, \
                 swept_at_ms = excluded.swept_at_ms",
            );
        })
        .execute(&mut tx)
        .await?;
    if let Fenced::Stale { last, .. } = fenced {
        // Dropping `tx` rolls it back (it wrote nothing anyway).
        return Ok(Swept::Refused { last });
    }
    let hold_ms = i64::try_from(hold.as_millis()).unwrap_or(i64::MAX);
    let expired: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT r.id, r.sku, r.qty FROM reservations r \
         WHERE r.reserved_at_ms <= ? AND NOT EXISTS \
           (SELECT 1 FROM released_reservations x WHERE x.reservation_id = r.id) \
         ORDER BY r.id LIMIT ?",
    )
    .bind(now_ms.saturating_sub(hold_ms))
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await?;
    for (id, sku, qty) in &expired {
        sqlx::query(
            "INSERT INTO released_reservations \
             (reservation_id, sku, qty, released_at_ms, fence_epoch, fence_seq) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(sku)
        .bind(qty)
        .bind(now_ms)
        .bind(epoch)
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE items SET stock = stock + ? WHERE sku = ?")
            .bind(qty)
            .bind(sku)
            .execute(&mut *tx)
            .await?;
    }
    let released = expired.len() as i64;
    sqlx::query("UPDATE jobs SET released = released + ? WHERE name = ?")
        .bind(released)
        .bind(JOB)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO job_sweeps (job, leader, released, swept_at_ms, fence_epoch, fence_seq) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(JOB)
    .bind(leader)
    .bind(released)
    .bind(now_ms)
    .bind(epoch)
    .bind(seq)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Swept::Applied {
        released: released as u64,
    })
}

/// A period of leadership as `job_sweeps` shows it: consecutive sweeps of one
/// term and leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermSweeps {
    /// The term.
    pub term: FencingToken,
    /// The leader's identity.
    pub leader: String,
    /// Sweeps applied.
    pub sweeps: i64,
    /// Reservations the sweeps released.
    pub released: i64,
    /// The first sweep (Unix ms).
    pub first_ms: i64,
    /// The last sweep (Unix ms).
    pub last_ms: i64,
}

/// The job's sweeps in the order they were applied, grouped into periods of
/// leadership (a new period starts where the term or the leader changes). With
/// the fence, each term is one period and the terms strictly increase:
/// [`one_term_at_a_time`] checks it.
pub async fn sweeps_by_term(db: &SqlitePool) -> Result<Vec<TermSweeps>, sqlx::Error> {
    let rows: Vec<(i64, i64, String, i64, i64)> = sqlx::query_as(
        "SELECT fence_epoch, fence_seq, leader, released, swept_at_ms \
         FROM job_sweeps WHERE job = ? ORDER BY id",
    )
    .bind(JOB)
    .fetch_all(db)
    .await?;
    let mut periods: Vec<TermSweeps> = Vec::new();
    for (epoch, seq, leader, released, at) in rows {
        let term = FencingToken::new(
            u64::try_from(epoch).unwrap_or(0),
            u64::try_from(seq).unwrap_or(0),
        );
        match periods.last_mut() {
            Some(p) if p.term == term && p.leader == leader => {
                p.sweeps += 1;
                p.released += released;
                p.last_ms = at;
            }
            _ => periods.push(TermSweeps {
                term,
                leader,
                sweeps: 1,
                released,
                first_ms: at,
                last_ms: at,
            }),
        }
    }
    Ok(periods)
}

/// Whether the periods are one per term, terms strictly increasing: no sweep of
/// an older term after a newer one, no two leaders in one term.
pub fn one_term_at_a_time(periods: &[TermSweeps]) -> bool {
    periods.windows(2).all(|w| w[0].term < w[1].term)
}
