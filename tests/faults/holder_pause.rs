//! Row 1: the holder's **process** is SIGSTOPped for 2 × TTL.
//!
//! A child process (this test binary, re-executed) takes a lock with a 1 s TTL
//! and loops: wait, check `is_lost()`, "work", write to a fenced resource in the
//! shared Redis (never faulted). The parent SIGSTOPs it, takes the lock with
//! another locker, writes, and SIGCONTs the child after 2 × TTL. The child must
//! then either see `is_lost()` before writing, or have its write rejected by the
//! fence; it reports which by its exit code.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockflight::{FencingToken, Locker, RedisBackend};
use rand::RngExt as _;
use tokio::sync::mpsc;

use crate::oracle::RedisFence;
use crate::{TTL, backend_at, join_all, serial, within};
use testkit::nemesis::{continue_process, stop_process};
use testkit::{RedisServer, shared, spawn_test_child, unique_prefix};

const CHILD_ENV: &str = "LOCKFLIGHT_FAULTS_CHILD";
/// The child's pause before each `is_lost()` check.
const GAP: Duration = Duration::from_millis(300);
/// The child's "work" between the check and the write.
const WORK: Duration = Duration::from_millis(300);
const EXIT_LOST: i32 = 10;
const EXIT_FENCED: i32 = 11;
const EXIT_STUCK: i32 = 12;

fn say(msg: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\nLFCHILD {msg}");
    let _ = out.flush();
}

/// Not a test: the child process of [`paused_holder_process_sees_loss_or_is_fenced`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of paused_holder_process_sees_loss_or_is_fenced"]
async fn paused_holder_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let backend = RedisBackend::builder(var("LF_URL"))
        .prefix(var("LF_PREFIX"))
        .connect()
        .await
        .expect("child: connect");
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_millis(var("LF_TTL_MS").parse().unwrap()))
        .wait_timeout(Duration::from_secs(10))
        .build()
        .expect("child: build");
    let fence = RedisFence::connect(&var("LF_FENCE_URL")).await;
    let (key, resource, me) = (var("LF_KEY"), var("LF_RESOURCE"), var("LF_WRITER"));
    let guard = locker.lock(key.as_str()).await.expect("child: lock");
    let token = guard.fencing_token();
    say(&format!("HELD {token}"));
    let started = Instant::now();
    for _ in 0..200 {
        if started.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(GAP).await;
        say("CHECK");
        if guard.is_lost() {
            say("LOST");
            std::process::exit(EXIT_LOST);
        }
        tokio::time::sleep(WORK).await;
        if fence.write(&resource, token, &me).await {
            say("WROTE");
        } else {
            say("FENCED");
            std::process::exit(EXIT_FENCED);
        }
    }
    say("STUCK");
    std::process::exit(EXIT_STUCK);
}

/// When the parent stops the child.
#[derive(Clone, Copy, Debug)]
enum PauseAt {
    /// Right after a `CHECK` that follows a write: the child is "working" between
    /// its check and its write, so the write comes after the pause (expect the
    /// fence to reject it).
    AfterCheck,
    /// Right after a write: the child's next step is its check (expect it to see
    /// the loss).
    AfterWrite,
    /// At a random moment.
    Random(Duration),
}

#[derive(Debug)]
struct Outcome {
    at: PauseAt,
    code: Option<i32>,
    /// From the SIGSTOP to the parent's grant.
    taken_after: Duration,
    child_token: FencingToken,
    parent_token: FencingToken,
    /// Child writes the fence accepted (all before the pause).
    child_writes: usize,
}

struct Ctx {
    lock_server: RedisServer,
    fence_url: String,
    fence: RedisFence,
    prefix: String,
    locker: Locker,
}

/// Waits for the next child line that contains `what` (any line if `what` is
/// empty) and returns it.
async fn next_line(lines: &mut mpsc::UnboundedReceiver<String>, what: &str) -> String {
    loop {
        match lines.recv().await {
            Some(line) if line.contains(what) => return line,
            Some(_) => {}
            None => panic!("the child exited before printing {what:?}"),
        }
    }
}

async fn run_child(ctx: Arc<Ctx>, i: usize, at: PauseAt) -> Outcome {
    let key = format!("k{i}");
    let resource = format!("{}:resource:{i}", ctx.prefix);
    let (mut child, mut reader) = spawn_test_child(
        "holder_pause::paused_holder_child",
        &[
            (CHILD_ENV, "1".to_owned()),
            ("LF_URL", ctx.lock_server.url()),
            ("LF_PREFIX", ctx.prefix.clone()),
            ("LF_KEY", key.clone()),
            ("LF_TTL_MS", TTL.as_millis().to_string()),
            ("LF_FENCE_URL", ctx.fence_url.clone()),
            ("LF_RESOURCE", resource.clone()),
            ("LF_WRITER", format!("child{i}")),
        ],
    );
    let pid = child.id().expect("the child's pid");
    let (tx, mut lines) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = reader.next_line().await {
            if let Some(at) = line.find("LFCHILD ") {
                let _ = tx.send(line[at + 8..].trim().to_owned());
            }
        }
    });

    let held = within(Duration::from_secs(30), "the child's HELD line", async {
        next_line(&mut lines, "HELD ").await
    })
    .await;
    let child_token = parse_token(held.trim_start_matches("HELD "));
    within(Duration::from_secs(10), "the child's trigger line", async {
        match at {
            PauseAt::AfterCheck => {
                next_line(&mut lines, "WROTE").await;
                next_line(&mut lines, "CHECK").await;
            }
            PauseAt::AfterWrite => {
                next_line(&mut lines, "WROTE").await;
            }
            PauseAt::Random(d) => tokio::time::sleep(d).await,
        }
    })
    .await;
    assert!(stop_process(pid), "the child {pid} did not stop");
    let paused_at = Instant::now();

    // Another instance takes the lock once the child's lease expires, and writes.
    let guard = within(
        Duration::from_secs(15),
        "the parent's lock",
        ctx.locker.lock_with_options(
            key.as_str(),
            lockflight::LockOptions::new().wait_timeout(Duration::from_secs(10)),
        ),
    )
    .await
    .expect("the lock of a stopped holder frees up");
    let taken_after = paused_at.elapsed();
    let parent_token = guard.fencing_token();
    assert!(
        parent_token > child_token,
        "the parent's token {parent_token} is not above the child's {child_token}"
    );
    assert!(
        ctx.fence.write(&resource, parent_token, "parent").await,
        "the fence rejected the parent's write with {parent_token}"
    );
    tokio::time::sleep_until((paused_at + 2 * TTL).into()).await;
    continue_process(pid);

    let status = within(Duration::from_secs(20), "the child's exit", child.wait())
        .await
        .expect("wait for the child");
    guard.release().await.expect("the parent's release");

    // The fence's log: the child's accepted writes, then the parent's, last.
    let log = ctx.fence.log(&resource).await;
    let (last_writer, last_token) = log.last().cloned().expect("the parent wrote");
    assert_eq!(
        (last_writer.as_str(), last_token),
        ("parent", parent_token),
        "a write was accepted after the parent's: {log:?}"
    );
    let child_writes = log.len() - 1;
    assert!(
        log[..child_writes]
            .iter()
            .all(|(w, t)| *w == format!("child{i}") && *t == child_token),
        "unexpected writes: {log:?}"
    );
    Outcome {
        at,
        code: status.code(),
        taken_after,
        child_token,
        parent_token,
        child_writes,
    }
}

fn parse_token(s: &str) -> FencingToken {
    let (epoch, seq) = s.trim().split_once('.').expect("<epoch>.<seq>");
    FencingToken::new(epoch.parse().expect("epoch"), seq.parse().expect("seq"))
}

/// Row 1. Several children at once, each on its own key: one stopped right
/// after its check (its write comes after the pause), one right after a write
/// (its check comes after the pause), the others at random moments. After the
/// SIGCONT every child either saw `is_lost()` or was fenced — never a write
/// accepted after the new holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_process_sees_loss_or_is_fenced() {
    let _serial = serial().await;
    let lock_server = RedisServer::start();
    let fence_server = shared();
    let _log = fence_server.log_on_panic();
    let prefix = unique_prefix("paused-holder");
    let locker = Locker::builder(backend_at(&lock_server.url(), &prefix).await)
        .lease_ttl(TTL)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let ctx = Arc::new(Ctx {
        fence_url: fence_server.url(),
        fence: RedisFence::connect(&fence_server.url()).await,
        lock_server,
        prefix,
        locker,
    });
    let children: usize = std::env::var("LOCKFLIGHT_FAULTS_PAUSED_CHILDREN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
        .max(2);
    let mut rng = rand::rng();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..children {
        let at = match i {
            0 => PauseAt::AfterCheck,
            1 => PauseAt::AfterWrite,
            _ => PauseAt::Random(Duration::from_millis(rng.random_range(0..1500))),
        };
        tasks.spawn(run_child(Arc::clone(&ctx), i, at));
    }
    let outcomes = within(Duration::from_secs(90), "the children", join_all(tasks)).await;

    let (mut lost, mut fenced) = (0, 0);
    for o in &outcomes {
        println!(
            "paused child ({:?}): exit {:?}, child token {}, parent token {} taken {:?} after the \
             SIGSTOP, {} child writes before the pause",
            o.at, o.code, o.child_token, o.parent_token, o.taken_after, o.child_writes
        );
        match o.code {
            Some(EXIT_LOST) => lost += 1,
            Some(EXIT_FENCED) => fenced += 1,
            other => {
                panic!("a paused child neither saw its loss nor was fenced: exit {other:?} ({o:?})")
            }
        }
        assert!(
            o.taken_after <= TTL + Duration::from_millis(1500),
            "the lock of the stopped holder was taken only {:?} after the SIGSTOP",
            o.taken_after
        );
    }
    println!(
        "paused holder processes: {lost} saw is_lost() before writing, {fenced} were fenced \
         (of {})",
        outcomes.len()
    );
}
