//! The leader-only job (`examples/inventory/app/job.rs`): one instance at a time runs
//! it, a killed leader's successor takes over in a greater term, and a stale
//! term's sweep is refused by the jobs row's fence.

use lockflight::LockerBuilder;
use tokio::process::Child;

use super::*;
use app::job::{self, JobConfig, LeaderJob, Swept};

/// The child's environment: set, the child test serves an instance.
const CHILD: &str = "INVENTORY_JOB_CHILD";
const CHILD_URL: &str = "INVENTORY_JOB_CHILD_URL";
const CHILD_PREFIX: &str = "INVENTORY_JOB_CHILD_PREFIX";
const CHILD_DB: &str = "INVENTORY_JOB_CHILD_DB";
const CHILD_NAME: &str = "INVENTORY_JOB_CHILD_NAME";

/// The job in the children: a lease TTL short enough for a quick failover and
/// long enough for a busy machine's renewals, frequent sweeps, reservations held
/// for 1 s.
const CHILD_JOB: JobConfig = JobConfig {
    lease_ttl: Duration::from_secs(3),
    every: Duration::from_millis(200),
    hold: Duration::from_secs(1),
};

/// The longest any step waits for the instances (generous: a busy 2-core machine).
const WAIT: Duration = Duration::from_secs(20);

/// Three instances (processes) on one Redis and one SQLite file: exactly one leads
/// the job and releases the expired reservations; after SIGKILL of the leader
/// another instance leads within the wait, in a greater term, and does the work.
/// The job's rows hold one term per period of leadership, terms strictly
/// increasing, and a sweep under the killed leader's term is refused without
/// releasing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_runs_the_job_and_a_killed_leader_is_replaced_in_a_greater_term() {
    let _log = testkit::shared().log_on_panic();
    let prefix = testkit::unique_prefix("inventory-job");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = file_db(dir.path()).await;
    let db_path = dir.path().join("inventory.db");
    let mut children = Vec::new();
    for name in ["a", "b", "c"] {
        children.push(spawn_instance(name, &prefix, &db_path).await);
    }
    let urls: Vec<String> = children.iter().map(|c| c.url.clone()).collect();
    let http = Http::new();
    create_item(&http, &urls[0], "held", 10).await;
    for url in &urls {
        assert_eq!(reserve_one(&http, url, "held").await.status, StatusCode::OK);
    }

    // One leader: it releases the three reservations once they are 1 s old, and
    // it is the only instance that ever led.
    wait_for("the expired reservations released", || async {
        stock(&http, &urls[0], "held").await == 10
    })
    .await;
    let parts = job_parts(&http, &urls).await;
    let leaders: Vec<&Part> = parts.iter().filter(|p| p.term.is_some()).collect();
    assert_eq!(leaders.len(), 1, "{parts:?}");
    assert_eq!(parts.iter().map(|p| p.terms).sum::<u64>(), 1, "{parts:?}");
    let old = leaders[0].clone();
    let old_term = old.term.expect("leading");
    // Who leads, as every instance observes it (re-read once per renewal interval).
    wait_for("every instance observes the leader", || async {
        job_parts(&http, &urls)
            .await
            .iter()
            .all(|p| p.leader.as_deref() == Some(old.identity.as_str()))
    })
    .await;

    // SIGKILL the leader; another instance leads within the wait, in a greater
    // term, and releases a reservation made after the kill.
    let at = parts.iter().position(|p| p.term.is_some()).expect("leader");
    let mut victim = children.remove(at);
    let killed = Instant::now();
    victim.child.kill().await.expect("SIGKILL the leader");
    let urls: Vec<String> = children.iter().map(|c| c.url.clone()).collect();
    let new = wait_for_value("a new leader", || async {
        job_parts(&http, &urls)
            .await
            .into_iter()
            .find(|p| p.term.is_some_and(|t| t > old_term) && p.sweeps >= 2)
    })
    .await;
    let new_term = new.term.expect("leading");
    eprintln!(
        "{} took over from {} {:?} after the kill",
        new.identity,
        old.identity,
        killed.elapsed()
    );

    // A sweep under the killed leader's term, with a reservation it would
    // release: refused, nothing released under that term.
    assert_eq!(
        reserve_one(&http, &urls[0], "held").await.status,
        StatusCode::OK
    );
    let stale = job::sweep(&db, old_term, &old.identity, i64::MAX / 2, Duration::ZERO)
        .await
        .expect("sweep");
    assert_eq!(stale, Swept::Refused { last: new_term });
    assert_eq!(released_under(&db, old_term).await, 3);
    wait_for("the new leader releases the new reservation", || async {
        stock(&http, &urls[0], "held").await == 10
    })
    .await;
    assert_eq!(released_under(&db, new_term).await, 1);

    // The job's rows: one period per term, terms strictly increasing, the killed
    // leader's then the new one's; no instance's sweep was ever refused.
    let periods = job::sweeps_by_term(&db).await.expect("job_sweeps");
    assert!(job::one_term_at_a_time(&periods), "{periods:#?}");
    let seen: Vec<(FencingToken, &str)> = periods
        .iter()
        .map(|p| (p.term, p.leader.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (old_term, old.identity.as_str()),
            (new_term, new.identity.as_str())
        ],
        "{periods:#?}"
    );
    assert_eq!(periods.iter().map(|p| p.released).sum::<i64>(), 4);
    let parts = job_parts(&http, &urls).await;
    assert_eq!(parts.iter().map(|p| p.refused).sum::<u64>(), 0, "{parts:?}");
    assert_eq!(parts.iter().map(|p| p.terms).sum::<u64>(), 1, "{parts:?}");
}

/// The sweep's fence, on its own: after a newer term swept, an older term's sweep
/// is refused and releases nothing; the newer term's next sweep releases what
/// expired, each reservation once.
#[tokio::test]
async fn a_stale_terms_sweep_is_refused_and_releases_nothing() {
    let db = app::open_db(None).await.expect("database");
    sqlx::query("INSERT INTO items (sku, name, stock) VALUES ('held', 'held', 10)")
        .execute(&db)
        .await
        .expect("item");
    // Reservations under the SKU's lock tokens (another key's: not the job's).
    let reserve = |epoch| app::db::fenced_write(&db, "held", 2, FencingToken::new(epoch, 0));
    assert!(matches!(
        reserve(10).await.expect("reserve"),
        WriteOutcome::Reserved { remaining: 8 }
    ));
    let (older, newer) = (FencingToken::new(500, 0), FencingToken::new(600, 0));
    let later = i64::MAX / 2; // every reservation has expired by then
    let sweep = |term| job::sweep(&db, term, "x", later, Duration::ZERO);

    assert_eq!(
        sweep(newer).await.expect("sweep"),
        Swept::Applied { released: 1 }
    );
    assert_eq!(item_stock(&db).await, 10);
    reserve(11).await.expect("reserve");
    assert_eq!(
        sweep(older).await.expect("sweep"),
        Swept::Refused { last: newer }
    );
    assert_eq!(
        item_stock(&db).await,
        8,
        "the refused sweep released nothing"
    );
    assert_eq!(released_under(&db, older).await, 0);
    assert_eq!(
        sweep(newer).await.expect("sweep"),
        Swept::Applied { released: 1 }
    );
    assert_eq!(
        sweep(newer).await.expect("sweep"),
        Swept::Applied { released: 0 },
        "each reservation is released once"
    );
    assert_eq!(item_stock(&db).await, 10);
    let periods = job::sweeps_by_term(&db).await.expect("job_sweeps");
    assert_eq!(periods.len(), 1, "{periods:#?}");
    assert_eq!((periods[0].term, periods[0].sweeps), (newer, 3));
}

/// Without Redis (the in-process backend, one instance) the job runs too, and
/// `/stats` says who leads.
#[tokio::test]
async fn the_job_runs_on_the_in_process_backend() {
    let db = app::open_db(None).await.expect("database");
    let backend = MemoryBackend::new();
    let locker = Locker::builder(backend.clone()).build().expect("locker");
    let config = JobConfig {
        every: Duration::from_millis(20),
        ..JobConfig::default()
    };
    let job = LeaderJob::start(Locker::builder(backend), db.clone(), "solo", config).expect("job");
    let url = serve(app::app(AppState::new(db, locker, "solo").with_job(job))).await;
    let http = Http::new();
    let stats = wait_for_value("two sweeps", || async {
        let stats = http.get(&format!("{url}/stats")).await.ok()?.json();
        let job = &stats["job"];
        (job["sweeps"].as_u64() >= Some(2) && job["leader"]["identity"] == "solo").then_some(stats)
    })
    .await;
    let job = &stats["job"];
    assert_eq!(job["leading"], true, "{job}");
    assert_eq!(job["leader"]["identity"], "solo", "{job}");
    assert_eq!(job["leader"]["term"], job["term"], "{job}");
    assert_eq!(job["refused"], 0, "{job}");
}

/// The child: an instance as `serve` runs it (a locker for the reservations and
/// one for the job over one Redis backend, the job's identity `name@port`), until
/// the parent kills it. Does nothing in an ordinary run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of one_instance_runs_the_job_and_a_killed_leader_is_replaced_in_a_greater_term"]
async fn child_serves_an_instance() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let name = var(CHILD_NAME);
    let backend = RedisBackend::builder(var(CHILD_URL))
        .prefix(var(CHILD_PREFIX))
        .connect()
        .await
        .expect("child: connect");
    let db = app::open_db(Some(Path::new(&var(CHILD_DB))))
        .await
        .expect("child: database");
    let locker = Locker::builder(backend.clone()).build().expect("locker");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let identity = format!("{name}@{}", addr.port());
    let job_locker: LockerBuilder = Locker::builder(backend);
    let job = LeaderJob::start(job_locker, db.clone(), &identity, CHILD_JOB).expect("job");
    let state = AppState::new(db, locker, &name)
        .describe("redis", "test")
        .with_job(job);
    tokio::spawn(async move { axum::serve(listener, app::app(state)).await });
    testkit::tell_parent(&format!("child: listening on http://{addr}"));
    std::future::pending::<()>().await;
}

/// An instance process, killed when dropped.
struct Instance {
    child: Child,
    url: String,
}

async fn spawn_instance(name: &str, prefix: &str, db: &Path) -> Instance {
    let (child, mut lines) = testkit::spawn_test_child(
        "job::child_serves_an_instance",
        &[
            (CHILD, "1".to_owned()),
            (CHILD_URL, testkit::shared().url()),
            (CHILD_PREFIX, prefix.to_owned()),
            (CHILD_DB, db.display().to_string()),
            (CHILD_NAME, name.to_owned()),
        ],
    );
    let url = testkit::child_line(&mut lines, "child: listening on").await;
    // Keep reading its log (leadership changes), so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Instance { child, url }
}

/// An instance's part in the job, from its `/stats`.
#[derive(Clone, Debug)]
struct Part {
    identity: String,
    /// Its term while it leads.
    term: Option<FencingToken>,
    /// Terms it led, sweeps it applied and had refused.
    terms: u64,
    sweeps: u64,
    refused: u64,
    /// Who leads, as it observes the election.
    leader: Option<String>,
}

async fn job_parts(http: &Http, urls: &[String]) -> Vec<Part> {
    let mut parts = Vec::new();
    for url in urls {
        let stats = http
            .get(&format!("{url}/stats"))
            .await
            .expect("GET /stats")
            .json();
        let job = &stats["job"];
        let n = |v: &serde_json::Value| v.as_u64().expect("a count");
        parts.push(Part {
            identity: job["identity"].as_str().expect("identity").to_owned(),
            term: job["term"]
                .is_object()
                .then(|| FencingToken::new(n(&job["term"]["epoch"]), n(&job["term"]["seq"]))),
            terms: n(&job["terms"]),
            sweeps: n(&job["sweeps"]),
            refused: n(&job["refused"]),
            leader: job["leader"]["identity"].as_str().map(str::to_owned),
        });
    }
    parts
}

async fn stock(http: &Http, url: &str, sku: &str) -> i64 {
    let res = http
        .get(&format!("{url}/items/{sku}"))
        .await
        .expect("GET /items/{sku}");
    res.json()["stock"].as_i64().expect("stock")
}

async fn item_stock(db: &sqlx::SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT stock FROM items WHERE sku = 'held'")
        .fetch_one(db)
        .await
        .expect("stock")
}

/// Reservations released under `term`.
async fn released_under(db: &sqlx::SqlitePool, term: FencingToken) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM released_reservations WHERE fence_epoch = ? AND fence_seq = ?",
    )
    .bind(term.epoch as i64)
    .bind(term.seq as i64)
    .fetch_one(db)
    .await
    .expect("released_reservations")
}

/// Polls `check` every 50 ms until it holds; fails after [`WAIT`].
async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for_value(what, || {
        let done = check();
        async move { done.await.then_some(()) }
    })
    .await;
}

/// Polls `probe` every 50 ms until it yields a value; fails after [`WAIT`].
async fn wait_for_value<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
