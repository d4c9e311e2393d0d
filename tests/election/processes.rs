//! Leader election across processes, against a real Redis: the leader is a child
//! process (this test binary, re-executed) that writes to a fenced resource while
//! it leads; the test process campaigns on its own backend.
//!
//! * `kill -9` of the leader: the waiting instance leads once the dead leader's
//!   lease ends (its TTL after the last renewal) with a greater term, asking the
//!   server a bounded number of times meanwhile (no polling).
//! * `SIGSTOP` of the leader for twice its TTL: the other instance leads and
//!   writes; the resumed leader learns of its loss before any write of its own
//!   lands (it sees `is_lost()`, or the fence refuses it).
//! * A leader whose runtime is blocked past its validity reports itself lost when
//!   it runs again, before any renewal could answer.
//! * The server is killed (`SIGKILL`) and restarted without its data, ten times, under
//!   a leader (and under a mutex holder) that acts through fenced writes on another
//!   server: the holder learns that its lease is gone, for that reason, before anyone
//!   is granted the next one, and no act of its term is accepted after that grant.
//!
//! Waits are bounded by generous limits ([`TOLD`]) only to fail instead of hanging.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockflight::election::Leadership;
use lockflight::fence::{Fenced, FencedKey};
use lockflight::guard::LossSignal;
use lockflight::{FencingToken, LockGuard, LockOptions, Locker, RedisBackend};
use testkit::nemesis::{continue_process, stop_process};
use testkit::{
    Counting, RedisServer, count_reaches, shared_scene, spawn_test_child, test_path, unique_prefix,
    within,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A limit that only a hang reaches.
const TOLD: Duration = Duration::from_secs(30);
/// The leaders' lease TTL.
const TTL: Duration = Duration::from_secs(2);
const CHILD_ENV: &str = "LOCKFLIGHT_ELECTION_CHILD";
/// The child leader's pause between its writes, and between its check and write.
const GAP: Duration = Duration::from_millis(150);
const EXIT_LOST: i32 = 10;
const EXIT_FENCED: i32 = 11;
const EXIT_STUCK: i32 = 12;

async fn backend(url: String, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect")
}

fn locker(backend: impl lockflight::backend::LockBackend) -> Locker {
    Locker::builder(backend)
        .lease_ttl(TTL)
        .renew_every(TTL / 4)
        .wait_timeout(Duration::from_secs(5))
        .build()
        .expect("valid settings")
}

fn say(msg: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\nLFCHILD {msg}");
    let _ = out.flush();
}

/// Not a test: the child leader. Campaigns, prints `LEADING <term>`, then loops:
/// checks its leadership (exits [`EXIT_LOST`] once lost), waits, writes its name
/// to the fenced resource with its term (exits [`EXIT_FENCED`] when refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the election process tests"]
async fn election_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let locker = locker(backend(var("LF_URL"), &var("LF_PREFIX")).await);
    let resource = FencedKey::new(var("LF_RESOURCE")).unwrap();
    let mut data = redis::Client::open(var("LF_URL"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("child: data connection");
    let leadership = locker
        .election("leader")
        .identity("child")
        .campaign()
        .await
        .expect("child: campaign");
    let term = leadership.fencing_token();
    say(&format!("LEADING {}:{}", term.epoch, term.seq));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if leadership.is_lost() {
            say("LOST");
            std::process::exit(EXIT_LOST);
        }
        tokio::time::sleep(GAP).await;
        match resource.set(&mut data, term, "child").await {
            Ok(Fenced::Applied(())) => say("WROTE"),
            Ok(Fenced::Stale { .. }) => {
                say("FENCED");
                std::process::exit(EXIT_FENCED);
            }
            Err(e) => say(&format!("ERROR {e}")),
        }
    }
    say("STUCK");
    std::process::exit(EXIT_STUCK);
}

/// A child process (the leader of `election_child`, or the holder of
/// `restart_child`), its lines, and its term once it leads.
struct Child {
    process: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line read so far.
    said: Vec<String>,
    term: FencingToken,
}

impl Child {
    /// Starts the child test `test` with `envs` and waits until it prints
    /// `LEADING <epoch>:<seq>`.
    async fn start(test: &str, envs: &[(&str, String)]) -> Child {
        let (process, mut reader) = spawn_test_child(&test_path(module_path!(), test), envs);
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = reader.next_line().await {
                if let Some(at) = line.find("LFCHILD ") {
                    let _ = tx.send(line[at + 8..].trim().to_owned());
                }
            }
        });
        let mut child = Child {
            process,
            lines,
            said: Vec::new(),
            term: FencingToken::new(0, 0),
        };
        let leading = within(TOLD, "the child leads", child.next("LEADING ")).await;
        let (epoch, seq) = leading
            .trim_start_matches("LEADING ")
            .split_once(':')
            .expect("LEADING epoch:seq");
        child.term = FencingToken::new(epoch.parse().unwrap(), seq.parse().unwrap());
        child
    }

    async fn lead(url: String, prefix: &str, resource: &str) -> Child {
        let mut child = Child::start(
            "election_child",
            &[
                (CHILD_ENV, "1".to_owned()),
                ("LF_URL", url),
                ("LF_PREFIX", prefix.to_owned()),
                ("LF_RESOURCE", resource.to_owned()),
            ],
        )
        .await;
        // It leads and its writes land.
        within(TOLD, "the child's first write", child.next("WROTE")).await;
        child
    }

    /// The next line that contains `what`.
    async fn next(&mut self, what: &str) -> String {
        loop {
            match self.lines.recv().await {
                Some(line) => {
                    self.said.push(line.clone());
                    if line.contains(what) {
                        return line;
                    }
                }
                None => panic!(
                    "the child exited before printing {what:?}; it said {:#?}",
                    self.said
                ),
            }
        }
    }

    /// Every line the child printed, read until its output ends.
    async fn said_all(mut self) -> Vec<String> {
        while let Some(line) = self.lines.recv().await {
            self.said.push(line);
        }
        self.said
    }

    fn pid(&self) -> u32 {
        self.process.id().expect("the child runs")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_once_its_lease_ends() {
    let (server, _log, prefix) = shared_scene("election-kill");
    let resource = format!("{prefix}:resource");
    let mut child = Child::lead(server.url(), &prefix, &resource).await;
    let (counted, counts) = Counting::new(backend(server.url(), &prefix).await);
    let me = locker(counted);
    let election = me.election("leader").identity("parent");
    let seen = election.leader().await.unwrap().expect("the child leads");
    assert_eq!((seen.identity.as_str(), seen.term), ("child", child.term));
    let campaign = tokio::spawn({
        let election = election.clone();
        async move { election.campaign().await }
    });
    // Queued behind the child (its first acquire answered busy).
    within(
        TOLD,
        "the parent's first acquire",
        count_reaches(&counts.acquire, 1),
    )
    .await;

    child.process.start_kill().expect("SIGKILL the child");
    let killed_at = Instant::now();
    let _ = child.process.wait().await;
    let leads = within(TOLD, "the parent leads", campaign)
        .await
        .unwrap()
        .unwrap();
    let took = killed_at.elapsed();
    assert!(
        leads.fencing_token() > child.term,
        "{} <= {}",
        leads.fencing_token(),
        child.term
    );
    // The dead leader's lease ended at most one TTL after the kill; the waiting
    // instance asked again when its busy answer said the lease would end, not
    // in a loop: a handful of acquires in all.
    let acquires = counts.acquire.load(Ordering::SeqCst);
    assert!(acquires <= 6, "{acquires} acquires while waiting {took:?}");
    println!("a new leader {took:?} after the kill, after {acquires} acquires");
    let mut data = server.connection().await;
    let resource = FencedKey::new(resource).unwrap();
    assert!(
        resource
            .set(&mut data, leads.fencing_token(), "parent")
            .await
            .unwrap()
            .is_applied()
    );
    leads.resign().await.unwrap();
    assert_eq!(election.leader().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_resumes_lost_and_never_writes_after_the_next() {
    let (server, _log, prefix) = shared_scene("election-stop");
    let resource_name = format!("{prefix}:resource");
    let mut child = Child::lead(server.url(), &prefix, &resource_name).await;
    let me = locker(backend(server.url(), &prefix).await);
    let election = me.election("leader").identity("parent");

    // Stop it between two writes.
    within(TOLD, "a child write", child.next("WROTE")).await;
    let pid = child.pid();
    assert!(stop_process(pid), "the child {pid} did not stop");
    let stopped_at = Instant::now();
    let leads = within(TOLD, "the parent leads", election.campaign())
        .await
        .unwrap();
    assert!(leads.fencing_token() > child.term);
    let mut data = server.connection().await;
    let resource = FencedKey::new(resource_name).unwrap();
    assert!(
        resource
            .set(&mut data, leads.fencing_token(), "parent")
            .await
            .unwrap()
            .is_applied(),
        "the new leader's write"
    );
    tokio::time::sleep_until(stopped_at + 2 * TTL).await;
    continue_process(pid);

    let status = within(TOLD, "the resumed child exits", child.process.wait())
        .await
        .unwrap();
    let code = status.code();
    assert!(
        code == Some(EXIT_LOST) || code == Some(EXIT_FENCED),
        "the resumed leader neither saw its loss nor was fenced: {status:?}"
    );
    // Nothing of the old leader landed after the new leader's write.
    let value: Option<String> = redis::cmd("GET")
        .arg(resource.name())
        .query_async(&mut data)
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some("parent"));
    assert_eq!(
        resource.last_token(&mut data).await.unwrap(),
        Some(leads.fencing_token())
    );
    leads.resign().await.unwrap();
}

/// The leader runs on a current-thread runtime whose one thread is then blocked
/// (a synchronous call inside an async task) for twice the TTL: no renewal can run.
/// Meanwhile another instance leads. When the blocked leader's thread runs
/// again, its leadership says lost at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_runtime_is_blocked_reports_itself_lost() {
    let (server, _log, prefix) = shared_scene("election-blocked");
    let (url, p) = (server.url(), prefix.clone());
    let (led_tx, led_rx) = tokio::sync::oneshot::channel();
    let blocked = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let locker = locker(backend(url, &p).await);
            let leadership = locker
                .election("leader")
                .identity("blocked")
                .campaign()
                .await
                .unwrap();
            led_tx.send(leadership.fencing_token()).unwrap();
            // The runtime's only thread blocks: no timer, no renewal runs.
            std::thread::sleep(2 * TTL);
            let lost = leadership.is_lost();
            drop(leadership);
            lost
        })
    });
    let blocked_term = within(TOLD, "the blocked leader leads", led_rx)
        .await
        .unwrap();
    let me = locker(backend(server.url(), &prefix).await);
    let leads = within(
        TOLD,
        "another instance leads",
        me.election("leader").identity("me").campaign(),
    )
    .await
    .unwrap();
    assert!(leads.fencing_token() > blocked_term);
    let lost = tokio::task::spawn_blocking(move || blocked.join().unwrap())
        .await
        .unwrap();
    assert!(lost, "the blocked leader still believed it led");
    leads.resign().await.unwrap();
}

// ---------------------------------------------------------------------------
// A server restarted without its data
// ---------------------------------------------------------------------------

const RESTART_CHILD_ENV: &str = "LOCKFLIGHT_RESTART_CHILD";
/// The restart child's pause between two acts.
const ACT_EVERY: Duration = Duration::from_millis(50);
/// Runs of each restart scenario.
const RUNS: usize = 10;
/// The child's acts seen before the server is killed.
const ACTS_BEFORE_KILL: usize = 3;
/// What the loss reason of a lease whose server restarted says.
const RESTARTED: &str = "restarted without its data";

/// The wall clock, as UNIX µs: the child and the test process read the same one.
fn unix_us() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_micros()).unwrap()
}

/// What a restart scenario holds: the leadership of the election `leader`, or
/// the mutex `resource`.
#[derive(Clone, Copy, Debug)]
enum Role {
    Leader,
    Holder,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Holder => "holder",
        }
    }

    fn parse(name: &str) -> Role {
        match name {
            "leader" => Role::Leader,
            "holder" => Role::Holder,
            _ => panic!("no role {name:?}"),
        }
    }

    /// Waits (a campaign, or a lock call with a long wait) until it holds.
    async fn take(self, locker: &Locker, identity: &str) -> Held {
        match self {
            Role::Leader => Held::Leader(
                locker
                    .election("leader")
                    .identity(identity)
                    .campaign()
                    .await
                    .expect("campaign"),
            ),
            Role::Holder => Held::Lock(
                locker
                    .lock_with_options("resource", LockOptions::new().wait_timeout(TOLD))
                    .await
                    .expect("lock"),
            ),
        }
    }
}

/// A leadership or a mutex guard, and the acts done under it.
enum Held {
    Leader(Leadership),
    Lock(LockGuard),
}

impl Held {
    fn fencing_token(&self) -> FencingToken {
        match self {
            Held::Leader(leadership) => leadership.fencing_token(),
            Held::Lock(guard) => guard.fencing_token(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Held::Leader(leadership) => leadership.is_lost(),
            Held::Lock(guard) => guard.is_lost(),
        }
    }

    fn loss_signal(&self) -> LossSignal {
        match self {
            Held::Leader(leadership) => leadership.loss_signal(),
            Held::Lock(guard) => guard.loss_signal(),
        }
    }

    /// One act: adds 1 to the fenced counter `resource` under this term.
    async fn act(
        &self,
        resource: &FencedKey,
        data: &mut redis::aio::MultiplexedConnection,
    ) -> lockflight::Result<Fenced<i64>> {
        match self {
            Held::Leader(leadership) => resource.incr_by(data, leadership.fencing_token(), 1).await,
            Held::Lock(guard) => resource.incr_by(data, guard, 1).await,
        }
    }

    /// Resigns or releases.
    async fn end(self) -> lockflight::Result<()> {
        match self {
            Held::Leader(leadership) => leadership.resign().await,
            Held::Lock(guard) => guard.release().await,
        }
    }
}

/// Not a test: the child of the restart tests. Takes `LF_ROLE` (see [`Role`]) on
/// the server at `LF_URL`, prints `LEADING <term>`, then every [`ACT_EVERY`]:
/// once it is lost, prints `LOST <µs> <reason>` (the wall clock when it learned)
/// and exits [`EXIT_LOST`]; until then adds 1 with its term to the fenced counter
/// `LF_RESOURCE` on the server at `LF_DATA_URL`, printing `ACTED <µs>` (the wall
/// clock right after the act was applied), or `FENCED` and exits [`EXIT_FENCED`]
/// when the fence refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the restart tests"]
async fn restart_child() {
    if std::env::var_os(RESTART_CHILD_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let locker = locker(backend(var("LF_URL"), &var("LF_PREFIX")).await);
    let resource = FencedKey::new(var("LF_RESOURCE")).unwrap();
    let mut data = redis::Client::open(var("LF_DATA_URL"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("child: data connection");
    let held = Role::parse(&var("LF_ROLE")).take(&locker, "child").await;
    let term = held.fencing_token();
    say(&format!("LEADING {}:{}", term.epoch, term.seq));
    let signal = held.loss_signal();
    let learned = tokio::spawn(async move {
        signal.lost().await;
        let at = unix_us();
        let reason = signal.reason().unwrap_or_default();
        say(&format!("LOST {at} {reason}"));
    });
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(ACT_EVERY).await;
        if held.is_lost() {
            let _ = tokio::time::timeout(TOLD, learned).await;
            std::process::exit(EXIT_LOST);
        }
        match held.act(&resource, &mut data).await {
            Ok(Fenced::Applied(_)) => say(&format!("ACTED {}", unix_us())),
            Ok(Fenced::Stale { .. }) => {
                say("FENCED");
                std::process::exit(EXIT_FENCED);
            }
            Err(e) => say(&format!("ERROR {e}")),
        }
    }
    say("STUCK");
    std::process::exit(EXIT_STUCK);
}

/// What one restart run saw; times are UNIX µs.
#[derive(Debug)]
struct RestartRun {
    /// The child's accepted acts.
    acts: Vec<u64>,
    /// When the child learned its loss, and why it was lost.
    lost: u64,
    reason: String,
    /// `kill()` and `restart()` returned.
    killed: u64,
    restarted: u64,
    /// The test process's wait returned.
    granted: u64,
    old_term: FencingToken,
    new_term: FencingToken,
}

impl RestartRun {
    fn last_act(&self) -> u64 {
        self.acts.iter().copied().max().unwrap_or(0)
    }

    /// Margins in ms: (granted − last act, granted − loss, loss − restarted,
    /// granted − restarted).
    fn margins(&self) -> [f64; 4] {
        let ms = |a: u64, b: u64| (a as f64 - b as f64) / 1000.0;
        [
            ms(self.granted, self.last_act()),
            ms(self.granted, self.lost),
            ms(self.lost, self.restarted),
            ms(self.granted, self.restarted),
        ]
    }
}

/// One run: a child takes `role` on `server` and acts on `data`; the test process
/// waits for the same; `server` is killed and restarted empty; the test process is
/// granted, and acts.
async fn restart_run(role: Role, server: &Arc<RedisServer>, data: &RedisServer) -> RestartRun {
    let prefix = unique_prefix(&format!("restart-{}", role.name()));
    let resource_name = format!("{prefix}:acts");
    let mut child = Child::start(
        "restart_child",
        &[
            (RESTART_CHILD_ENV, "1".to_owned()),
            ("LF_ROLE", role.name().to_owned()),
            ("LF_URL", server.url()),
            ("LF_DATA_URL", data.url()),
            ("LF_PREFIX", prefix.clone()),
            ("LF_RESOURCE", resource_name.clone()),
        ],
    )
    .await;
    let (counted, counts) = Counting::new(backend(server.url(), &prefix).await);
    let me = locker(counted);
    let waiting = tokio::spawn({
        let me = me.clone();
        async move {
            let held = role.take(&me, "parent").await;
            (held, unix_us())
        }
    });
    // Waiting, behind the child (its first ask answered busy): this instance
    // knows the server's first life, and the lease TTL it asks for.
    within(
        TOLD,
        "the parent's first ask",
        count_reaches(&counts.acquire, 1),
    )
    .await;
    for _ in 0..ACTS_BEFORE_KILL {
        within(TOLD, "the child acts", child.next("ACTED ")).await;
    }

    let (killed, restarted) = {
        let server = Arc::clone(server);
        tokio::task::spawn_blocking(move || {
            server.kill();
            let killed = unix_us();
            server.restart();
            (killed, unix_us())
        })
        .await
        .unwrap()
    };
    let (held, granted) = within(TOLD, "the parent is granted", waiting)
        .await
        .unwrap();
    let mut conn = data.connection().await;
    let resource = FencedKey::new(resource_name).unwrap();
    let own = held.act(&resource, &mut conn).await.unwrap();
    assert!(own.is_applied(), "the new term's act was refused: {own:?}");

    let status = within(TOLD, "the child exits", child.process.wait())
        .await
        .unwrap();
    let old_term = child.term;
    let said = within(TOLD, "the child's output", child.said_all()).await;
    assert_eq!(
        status.code(),
        Some(EXIT_LOST),
        "the child did not end lost: {status:?}; it said {said:#?}"
    );
    let acts: Vec<u64> = said
        .iter()
        .filter_map(|line| line.strip_prefix("ACTED "))
        .map(|at| at.parse().unwrap())
        .collect();
    let (lost, reason) = said
        .iter()
        .find_map(|line| line.strip_prefix("LOST "))
        .and_then(|rest| rest.split_once(' '))
        .map(|(at, reason)| (at.parse().unwrap(), reason.to_owned()))
        .unwrap_or_else(|| panic!("the child did not say why it was lost: {said:#?}"));
    // Nothing of the old term landed after the new one's act.
    assert_eq!(
        resource.last_token(&mut conn).await.unwrap(),
        Some(held.fencing_token())
    );
    let run = RestartRun {
        acts,
        lost,
        reason,
        killed,
        restarted,
        granted,
        old_term,
        new_term: held.fencing_token(),
    };
    held.end().await.unwrap();
    drop(me);
    run
}

/// Every assertion on one run.
fn check_restart_run(role: Role, i: usize, run: &RestartRun) {
    let [
        act_margin,
        loss_margin,
        loss_after_restart,
        grant_after_restart,
    ] = run.margins();
    println!(
        "{} run {i}: {} acts; the last {act_margin:.1} ms and the loss {loss_margin:.1} ms \
         before the grant; lost {loss_after_restart:.1} ms and granted \
         {grant_after_restart:.1} ms after the restart (down {:.1} ms); terms {} -> {}",
        role.name(),
        run.acts.len(),
        (run.restarted as f64 - run.killed as f64) / 1000.0,
        run.old_term,
        run.new_term,
    );
    assert!(
        run.acts.len() >= ACTS_BEFORE_KILL,
        "{} run {i}: {run:#?}",
        role.name()
    );
    assert!(
        run.last_act() < run.granted,
        "{} run {i}: an act of the old term was accepted {:.1} ms after the new term was \
         granted: {run:#?}",
        role.name(),
        -act_margin
    );
    // The grant's own time: a fence that the restart emptied mints the epoch from
    // the server's clock at the grant (`max(last + 1, TIME µs)`, with no last).
    assert!(
        run.last_act() < run.new_term.epoch,
        "{} run {i}: an act of the old term was accepted after the grant's server time: \
         {run:#?}",
        role.name()
    );
    assert!(
        run.new_term > run.old_term,
        "{} run {i}: {run:#?}",
        role.name()
    );
    assert!(
        run.reason.contains(RESTARTED),
        "{} run {i}: lost for another reason: {run:#?}",
        role.name()
    );
    assert!(
        run.lost < run.granted && run.lost < run.new_term.epoch,
        "{} run {i}: the old holder learned its loss {:.1} ms after the new grant: {run:#?}",
        role.name(),
        -loss_margin
    );
}

/// Ten runs of `role`, on one server restarted in each and one data server.
async fn restart_runs(role: Role) {
    let server = Arc::new(RedisServer::start());
    let data = RedisServer::start();
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let run = restart_run(role, &server, &data).await;
        check_restart_run(role, i, &run);
        runs.push(run);
    }
    let least = |k: usize| {
        runs.iter()
            .map(|run| run.margins()[k])
            .fold(f64::INFINITY, f64::min)
    };
    let most = |k: usize| runs.iter().map(|run| run.margins()[k]).fold(0.0, f64::max);
    println!(
        "{}: {RUNS} of {RUNS} runs kept every act of an old term before the next grant; \
         least margins: last act {:.1} ms, loss {:.1} ms before the grant; the loss at most \
         {:.1} ms after the restart",
        role.name(),
        least(0),
        least(1),
        most(2)
    );
}

/// A leader in another process acts (fenced writes with its term, on a server that
/// stays up) while a candidate here waits; the election's server is killed with
/// `SIGKILL` and restarted without its data, ten times. Each time the leader learns
/// that its leadership is lost, because the server restarted, before the candidate
/// is elected, and none of its acts is accepted after that election.
///
/// The restarted server holds no lease. Without its life (`backend/redis/life.rs`)
/// the candidate, woken when its subscription is made again, would be elected at
/// once, while the old leader learned nothing until its next renewal (up to a
/// renewal interval later, here 500 ms: ten more acts, accepted, since the fence
/// refuses them only after the new leader's first act), and would then be told
/// that it no longer held its lease rather than why. With it, the leader marks its
/// lease lost when it reconnects, and the server grants nothing until a lease TTL
/// after the restart, when the old lease would have ended anyway.
///
/// Times are wall-clock readings of one machine, compared only with each other;
/// the margin the quarantine leaves between the old term's last act and the grant is
/// about one lease TTL, which only a pause that long between a check of
/// `is_lost()` and the act it allows could spend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_server_restarts_empty_stops_acting_before_the_next_is_elected() {
    restart_runs(Role::Leader).await;
}

/// As the election's restart test, with a mutex: the holder in another process
/// acts with its guard's token while the test process waits in
/// `lock_with_options`; after each restart the holder learns that its lock is
/// lost, because the server restarted, before the waiter is granted, and none of
/// its acts is accepted after that grant. Without the server's life the waiter
/// would be granted at the first ask after the restart, while the holder acted on
/// until its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_holder_whose_server_restarts_empty_stops_acting_before_the_next_grant() {
    restart_runs(Role::Holder).await;
}
