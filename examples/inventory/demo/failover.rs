//! The leadership failover: instances campaign for the leader-only job
//! (`job.rs`), the demo kills the leader with SIGKILL, another instance takes over
//! in a greater term about one lease TTL later, a sweep under the old term is
//! refused, and the job's rows show each term's sweeps. Every wait is bounded;
//! every instance it starts it stops.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use lockflight::FencingToken;
use sqlx::SqlitePool;
use tokio::task::JoinSet;

use super::INSTANCES;
use super::servers::{Proc, Target};
use crate::app::job::{self, Swept, TermSweeps};
use crate::client::{BoxError, Http};

/// The job election's lease TTL in this run (`JOB_LEASE_TTL_MS`): about the time
/// the instances go without a leader after the kill.
const LEASE_TTL: Duration = Duration::from_secs(2);
/// The period of the leader's sweeps (`JOB_EVERY_MS`).
const EVERY: Duration = Duration::from_millis(500);
/// Sweeps a leader makes before the demo goes on (before the kill, and after it).
const SWEEPS: u64 = 3;
/// The longest the demo waits for a leader (at the start, after the kill).
const WAIT: Duration = Duration::from_secs(20);

/// One instance's part in the job, from its `/stats`.
#[derive(Clone, Debug)]
struct Part {
    identity: String,
    /// This instance's term while it leads.
    term: Option<FencingToken>,
    since_ms: i64,
    sweeps: u64,
    refused: u64,
}

/// The failover, with the instances locking at `target` and sharing the SQLite
/// file `db_path` (open here as `db`).
pub(super) async fn run(target: &Target, db_path: &Path, db: &SqlitePool) -> Result<(), BoxError> {
    println!(
        "\nLeadership failover: {INSTANCES} new instances campaign for the leader-only job \
         ({}, lease TTL\n{:.1} s; the runs above had it off, so their counts are the \
         reservations' alone). The leader\nreleases expired reservations every {} ms, each \
         sweep fenced by its term in the jobs row.\n",
        job::ELECTION,
        LEASE_TTL.as_secs_f64(),
        EVERY.as_millis()
    );
    let http = Http::new();
    let mut procs = start(target, db_path).await?;
    let result = failover(&http, &mut procs, db).await;
    for p in procs {
        p.stop().await;
    }
    result
}

/// Starts the instances (concurrently), sorted by name.
async fn start(target: &Target, db_path: &Path) -> Result<Vec<Proc>, BoxError> {
    let mut starting = JoinSet::new();
    for i in 0..INSTANCES {
        let name = format!("{}", (b'a' + i as u8) as char);
        let (var, value) = target.env();
        let envs = vec![
            ("INSTANCE_NAME", name.clone()),
            ("DATABASE_PATH", db_path.display().to_string()),
            (var, value),
            ("INVENTORY_LEADER_JOB", "on".to_owned()),
            ("JOB_LEASE_TTL_MS", LEASE_TTL.as_millis().to_string()),
            ("JOB_EVERY_MS", EVERY.as_millis().to_string()),
        ];
        starting.spawn(async move { Proc::spawn(&name, &["serve"], &envs).await });
    }
    let mut procs = Vec::new();
    while let Some(p) = starting.join_next().await {
        procs.push(p??);
    }
    procs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(procs)
}

/// Waits for the leader, kills it, waits for the next, shows and checks the rows.
async fn failover(http: &Http, procs: &mut Vec<Proc>, db: &SqlitePool) -> Result<(), BoxError> {
    let mut problems = Vec::new();
    let Some((i, old)) = leader_with_sweeps(http, procs, None).await? else {
        println!("PROBLEM: no instance led the job within {WAIT:?}");
        return Ok(());
    };
    let old_term = old.term.unwrap_or_default();
    println!(
        "  leader:     {:<10} term {old_term}  ({} sweeps so far)",
        old.identity, old.sweeps
    );
    let victim = procs.remove(i);
    let pid = victim
        .pid()
        .map_or_else(|| "?".to_owned(), |p| p.to_string());
    let killed_at = SystemTime::now();
    victim.kill().await?;
    println!("  kill -9 {} (pid {pid})", old.identity);

    let Some((_, new)) = leader_with_sweeps(http, procs, Some(old_term)).await? else {
        println!("PROBLEM: no instance took over within {WAIT:?} of the kill");
        return Ok(());
    };
    let new_term = new.term.unwrap_or_default();
    let took = (new.since_ms - job::unix_ms(killed_at)) as f64 / 1000.0;
    println!(
        "  new leader: {:<10} term {new_term}  ({took:.2} s after the kill; lease TTL {:.1} s)",
        new.identity,
        LEASE_TTL.as_secs_f64()
    );
    if new_term <= old_term {
        problems.push(format!("the new term {new_term} is not after {old_term}"));
    }

    // The killed leader, had it only been paused, would sweep under its old term
    // now: the jobs row refuses it, and nothing of it is written.
    let now = job::unix_ms(SystemTime::now());
    let stale = job::sweep(db, old_term, &old.identity, now, job::DEFAULT_HOLD).await;
    match stale.map_err(|e| e.to_string())? {
        Swept::Refused { last } => {
            println!("  a sweep under the old term now: refused (the jobs row carries term {last})")
        }
        Swept::Applied { .. } => problems.push("a sweep under the old term was applied".into()),
    }

    let periods = job::sweeps_by_term(db).await?;
    print_periods(&periods, job::unix_ms(killed_at));
    if !job::one_term_at_a_time(&periods) {
        problems.push("the job's sweeps are not one term at a time, terms increasing".into());
    }
    let terms: Vec<FencingToken> = periods.iter().map(|p| p.term).collect();
    if !terms.ends_with(&[old_term, new_term]) {
        problems.push(format!(
            "expected the sweeps of {old_term}, then of {new_term}, last: {terms:?}"
        ));
    }
    let refused: u64 = parts(http, procs).await?.iter().map(|p| p.refused).sum();
    if refused != 0 {
        problems.push(format!(
            "{refused} sweeps of the surviving instances were refused"
        ));
    }
    if problems.is_empty() {
        println!(
            "\nchecks passed: the job's rows hold one term at a time, the term increased at the \
             failover,\nthe old term's sweep was refused"
        );
    } else {
        println!();
        for p in problems {
            println!("PROBLEM: {p}");
        }
    }
    Ok(())
}

/// The job's sweeps per period of leadership, times from the kill.
fn print_periods(periods: &[TermSweeps], killed_ms: i64) {
    let from_kill = |ms: i64| format!("{:+.2}", (ms - killed_ms) as f64 / 1000.0);
    println!("\n  job_sweeps, by term (s from the kill):");
    println!(
        "  {:<22} {:<10} {:>6} {:>8}  first .. last",
        "term", "leader", "sweeps", "released"
    );
    for p in periods {
        println!(
            "  {:<22} {:<10} {:>6} {:>8}  {} .. {}",
            p.term.to_string(),
            p.leader,
            p.sweeps,
            p.released,
            from_kill(p.first_ms),
            from_kill(p.last_ms)
        );
    }
}

/// Waits (up to [`WAIT`]) until one of `procs` leads in a term after `after` and
/// has swept [`SWEEPS`] times in it: its index and part.
async fn leader_with_sweeps(
    http: &Http,
    procs: &[Proc],
    after: Option<FencingToken>,
) -> Result<Option<(usize, Part)>, BoxError> {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let parts = parts(http, procs).await?;
        let leading = parts.into_iter().enumerate().find(|(_, p)| {
            p.term.is_some_and(|t| after.is_none_or(|a| t > a)) && p.sweeps >= SWEEPS
        });
        if leading.is_some() {
            return Ok(leading);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// Each instance's part, from its `/stats`.
async fn parts(http: &Http, procs: &[Proc]) -> Result<Vec<Part>, BoxError> {
    let mut parts = Vec::new();
    for p in procs {
        let stats = http.get(&format!("{}/stats", p.url)).await?.json();
        let job = &stats["job"];
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let term = job["term"]
            .is_object()
            .then(|| FencingToken::new(n(&job["term"]["epoch"]), n(&job["term"]["seq"])));
        parts.push(Part {
            identity: job["identity"].as_str().unwrap_or(&p.name).to_owned(),
            term,
            since_ms: job["since_ms"].as_i64().unwrap_or(0),
            sweeps: n(&job["sweeps"]),
            refused: n(&job["refused"]),
        });
    }
    Ok(parts)
}
