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
//!
//! Waits are bounded by generous limits ([`TOLD`]) only to fail instead of hanging.

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey};
use lockflight::{FencingToken, Locker, RedisBackend};
use testkit::nemesis::{continue_process, stop_process};
use testkit::{Counting, count_reaches, shared_scene, spawn_test_child, within};
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
    let term = leadership.term();
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

/// The child leader, its lines, and its term once it leads.
struct Child {
    process: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    term: FencingToken,
}

impl Child {
    async fn lead(url: String, prefix: &str, resource: &str) -> Child {
        let (process, mut reader) = spawn_test_child(
            "election_child",
            &[
                (CHILD_ENV, "1".to_owned()),
                ("LF_URL", url),
                ("LF_PREFIX", prefix.to_owned()),
                ("LF_RESOURCE", resource.to_owned()),
            ],
        );
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
            term: FencingToken { epoch: 0, seq: 0 },
        };
        let leading = within(TOLD, "the child leads", child.next("LEADING ")).await;
        let (epoch, seq) = leading
            .trim_start_matches("LEADING ")
            .split_once(':')
            .expect("LEADING epoch:seq");
        child.term = FencingToken {
            epoch: epoch.parse().unwrap(),
            seq: seq.parse().unwrap(),
        };
        // It leads and its writes land.
        within(TOLD, "the child's first write", child.next("WROTE")).await;
        child
    }

    /// The next line that contains `what`.
    async fn next(&mut self, what: &str) -> String {
        loop {
            match self.lines.recv().await {
                Some(line) if line.contains(what) => return line,
                Some(_) => {}
                None => panic!("the child exited before printing {what:?}"),
            }
        }
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
        leads.term() > child.term,
        "{} <= {}",
        leads.term(),
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
            .set(&mut data, leads.term(), "parent")
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
    assert!(leads.term() > child.term);
    let mut data = server.connection().await;
    let resource = FencedKey::new(resource_name).unwrap();
    assert!(
        resource
            .set(&mut data, leads.term(), "parent")
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
        Some(leads.term())
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
            led_tx.send(leadership.term()).unwrap();
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
    assert!(leads.term() > blocked_term);
    let lost = tokio::task::spawn_blocking(move || blocked.join().unwrap())
        .await
        .unwrap();
    assert!(lost, "the blocked leader still believed it led");
    leads.resign().await.unwrap();
}
