//! Scheduled jobs (`Locker::run_exclusive`) against a real Redis.
//!
//! * Three replicas, each a child process (this test binary, re-executed) whose
//!   timer runs on a clock offset by -500, 0 and +500 ms, fire the same 12 ticks:
//!   each tick runs exactly once, with strictly increasing fencing tokens. The
//!   replicas' clocks are a second apart; `at_least` (2 s) covers that spread and
//!   the period (3 s) leaves as much again before the next tick, so a child's
//!   timer may fire up to a second late without changing the outcome.
//! * A tick that overruns `at_most` is told of its loss, and its fenced write
//!   after the next tick's is refused.

use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockflight::fence::{Fenced, FencedKey};
use lockflight::job::{JobOptions, Tick};
use lockflight::{FencingToken, Locker, RedisBackend};
use redis::AsyncCommands;
use testkit::{child_line, shared_scene, spawn_test_child, test_path, within};

/// A limit that only a hang reaches.
const TOLD: Duration = Duration::from_secs(30);
const CHILD_ENV: &str = "LOCKFLIGHT_JOB_CHILD";
const TICKS: u64 = 12;
const PERIOD: Duration = Duration::from_secs(3);
const AT_LEAST: Duration = Duration::from_secs(2);
const AT_MOST: Duration = Duration::from_millis(2_900);
/// Each replica's clock, ahead of the true time by this much.
const OFFSETS_MS: [i64; 3] = [-500, 0, 500];

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

async fn backend(url: String, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect")
}

fn say(msg: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\nLFJOB {msg}");
    let _ = out.flush();
}

/// Not a test: one replica. Prints `READY`, waits for the start (the parent
/// pushes it when every replica is ready), then fires each tick when its own
/// clock (the true time plus its offset) reaches it, and records each run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the scheduled job tests"]
async fn job_replica_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let (url, prefix, name) = (var("LF_URL"), var("LF_PREFIX"), var("LF_NAME"));
    let offset: i64 = var("LF_OFFSET_MS").parse().unwrap();
    let locker = Locker::builder(backend(url.clone(), &prefix).await)
        .build()
        .unwrap();
    let mut data = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("child: data connection");
    say("READY");
    let (_, start): (String, i64) = data
        .blpop(format!("{prefix}go:{name}"), TOLD.as_secs_f64())
        .await
        .expect("child: the start");
    let options = JobOptions::new(AT_MOST).at_least(AT_LEAST);
    for tick in 0..TICKS {
        // When this replica's clock reads the tick's time.
        let due = start + i64::try_from(tick * PERIOD.as_millis() as u64).unwrap() - offset;
        let wait = u64::try_from(due - now_ms()).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let mut conn = data.clone();
        let runs = format!("{prefix}runs");
        let name = &name;
        let ran = locker
            .run_exclusive("report", options, |lease| async move {
                let token = lease.fencing_token();
                let entry = format!("{tick}:{name}:{}:{}", token.epoch, token.seq);
                let _: () = conn.rpush(runs, entry).await.expect("record the run");
            })
            .await
            .expect("child: run_exclusive");
        say(&format!("TICK {tick} {}", matches!(ran, Tick::Ran(()))));
    }
    say("DONE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_whose_clocks_differ_by_a_second_run_each_tick_exactly_once() {
    let (server, _log, prefix) = shared_scene("job-clocks");
    let mut replicas = Vec::new();
    for (i, offset) in OFFSETS_MS.iter().enumerate() {
        let (process, mut lines) = spawn_test_child(
            &test_path(module_path!(), "job_replica_child"),
            &[
                (CHILD_ENV, "1".to_owned()),
                ("LF_URL", server.url()),
                ("LF_PREFIX", prefix.clone()),
                ("LF_NAME", format!("r{i}")),
                ("LF_OFFSET_MS", offset.to_string()),
            ],
        );
        child_line(&mut lines, "LFJOB READY").await;
        replicas.push((process, lines));
    }
    let mut conn = server.connection().await;
    // The first tick a second from now, by the true clock.
    let start = now_ms() + 1_000;
    for i in 0..OFFSETS_MS.len() {
        let _: () = conn.rpush(format!("{prefix}go:r{i}"), start).await.unwrap();
    }
    let all_ticks = PERIOD * u32::try_from(TICKS).unwrap() + TOLD;
    for (mut process, mut lines) in replicas {
        let done = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("LFJOB DONE") {
                    return;
                }
            }
            panic!("a replica exited before its last tick");
        };
        within(all_ticks, "a replica's ticks", done).await;
        let status = within(TOLD, "a replica exits", process.wait())
            .await
            .unwrap();
        assert!(status.success(), "a replica failed: {status}");
    }

    let runs: Vec<String> = conn.lrange(format!("{prefix}runs"), 0, -1).await.unwrap();
    let mut by_tick: Vec<Vec<(String, FencingToken)>> = vec![Vec::new(); TICKS as usize];
    for run in &runs {
        let parts: Vec<&str> = run.split(':').collect();
        let [tick, name, epoch, seq] = parts[..] else {
            panic!("a run recorded as {run:?}")
        };
        let token = FencingToken::new(epoch.parse().unwrap(), seq.parse().unwrap());
        by_tick[tick.parse::<usize>().unwrap()].push((name.to_owned(), token));
    }
    for (tick, ran) in by_tick.iter().enumerate() {
        assert_eq!(ran.len(), 1, "tick {tick} ran {ran:?}; every run: {runs:?}");
    }
    let tokens: Vec<FencingToken> = by_tick.iter().map(|ran| ran[0].1).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens in tick order: {tokens:?}"
    );
}

/// A tick that outlives `at_most` is told of its loss (its lease ends there at
/// the server too), the next tick runs with a greater token, and the overrun
/// tick's fenced write after the next tick's is refused.
#[tokio::test]
async fn a_tick_past_at_most_is_told_and_its_fenced_write_is_refused() {
    let (server, _log, prefix) = shared_scene("job-overrun");
    let a = Locker::builder(backend(server.url(), &prefix).await)
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let b = Locker::builder(backend(server.url(), &prefix).await)
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let resource = FencedKey::new(format!("{prefix}report")).unwrap();
    let mut conn = server.connection().await;
    let mut conn_b = conn.clone();
    let options = JobOptions::new(Duration::from_secs(1));
    let resource = &resource;
    let tick = a.run_exclusive("report", options, |lease| async move {
        let token = lease.fencing_token();
        within(TOLD, "the overrun tick's loss", lease.lost()).await;
        // The next tick: once the server ended the lease, another replica
        // takes the job with a greater token and writes.
        b.lock("report").await.unwrap().release().await.unwrap();
        let resource_b = resource;
        let next = b.run_exclusive("report", options, |next| async move {
            let write = resource_b.set(&mut conn_b, next.fencing_token(), "b").await;
            (next.fencing_token(), write.unwrap())
        });
        let Tick::Ran((next_token, next_write)) = next.await.unwrap() else {
            panic!("the next tick was skipped after the loss")
        };
        assert!(next_token > token, "{next_token:?} after {token:?}");
        assert_eq!(next_write, Fenced::Applied(()));
        // The overrun tick's write comes late: refused.
        resource.set(&mut conn, token, "a").await.unwrap()
    });
    let Tick::Ran(late) = tick.await.unwrap() else {
        panic!("the first tick was skipped")
    };
    assert!(matches!(late, Fenced::Stale { .. }), "{late:?}");
}
