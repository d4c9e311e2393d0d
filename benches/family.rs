//! The lock family, side by side in one run (one process, P instances × T tasks,
//! each instance its own `RedisBackend`, 2 Tokio workers, one local redis-server):
//!
//! 1. **read-heavy** (95 % reads) on one key: the read-write lock against the
//!    exclusive lock. A read GETs a counter; a write GETs it and SETs it + 1.
//! 2. **capacity 4**: a semaphore with N = 4 against four independent locks
//!    (each task always uses lock `task % 4`). The guarded work GETs a key and
//!    waits 1 ms (a call the cap protects).
//! 3. **fair vs default** on one hot exclusive key (GET + SET of a counter).
//!
//! ```text
//! cargo bench --bench family                          # P = 4, T = 64, 3 s per row
//! LOCKFLIGHT_BENCH_SECS=5 cargo bench --bench family
//! ```
//!
//! Reported per row: operations per second, lock round trips per operation (the
//! `EVALSHA` calls in `INFO commandstats`: every lock operation is one), the p99
//! wait for the lock, and each instance's share of the operations. Every row
//! checks itself: the counter equals the writes (no lost update), write fencing
//! tokens strictly increase, at most N holders at once. Without `--bench` (as
//! `cargo test --benches` runs it) a tiny smoke configuration runs.

#[path = "common/mod.rs"]
mod common;

use std::future::ready;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockflight::{Contention, FencingToken, Locker, RedisBackend};
use rand::{RngExt as _, SeedableRng as _};
use redis::aio::MultiplexedConnection;
use testkit::{RedisServer, counter_value, evalsha_count, increment};

/// What one row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    /// 95 % reads under the exclusive lock.
    ReadsExclusive,
    /// 95 % reads under the read-write lock.
    ReadsRw,
    /// Capacity 4 through four independent locks.
    FourLocks,
    /// Capacity 4 through one semaphore with N = 4.
    Semaphore,
    /// The hot key, default mode.
    Default,
    /// The hot key, fair mode.
    Fair,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::ReadsExclusive => "95 % reads: exclusive lock",
            Row::ReadsRw => "95 % reads: read-write lock",
            Row::FourLocks => "capacity 4: four locks",
            Row::Semaphore => "capacity 4: semaphore N = 4",
            Row::Default => "hot key: default",
            Row::Fair => "hot key: fair",
        }
    }
}

/// Fraction of writes in the read-heavy rows.
const WRITE_SHARE: f64 = 0.05;
/// The semaphore's permits and the number of locks it is compared with.
const CAPACITY: u32 = 4;

struct Measured {
    row: Row,
    ops: u64,
    secs: f64,
    requests: u64,
    wait_p99: Duration,
    shares: Vec<f64>,
}

async fn evalsha_calls(server: &RedisServer) -> u64 {
    evalsha_count(&mut server.connection().await).await
}

/// What every task of a row shares.
struct Shared {
    counter: String,
    writes: AtomicU64,
    tokens: Mutex<Vec<FencingToken>>,
    inside: AtomicUsize,
    most_inside: AtomicUsize,
    waits: Mutex<Vec<Duration>>,
}

impl Shared {
    fn enter(&self) {
        let n = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_inside.fetch_max(n, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One operation of `row` by task `task`; returns after the lock is released.
async fn operation(
    row: Row,
    locker: &Locker,
    task: usize,
    rng: &mut rand::rngs::StdRng,
    con: &mut MultiplexedConnection,
    shared: &Shared,
) {
    let start = Instant::now();
    match row {
        Row::ReadsExclusive | Row::ReadsRw => {
            let write = rng.random_bool(WRITE_SHARE);
            if row == Row::ReadsRw && !write {
                let g = locker.rwlock("hot").read().await.expect("read");
                shared.waits.lock().unwrap().push(start.elapsed());
                let _ = counter_value(con, shared.counter.as_bytes()).await;
                g.release().await.expect("release read");
            } else if row == Row::ReadsRw {
                let g = locker.rwlock("hot").write().await.expect("write");
                shared.waits.lock().unwrap().push(start.elapsed());
                shared.tokens.lock().unwrap().push(g.fencing_token());
                increment(con, shared.counter.as_bytes(), ready(())).await;
                shared.writes.fetch_add(1, Ordering::Relaxed);
                g.release().await.expect("release write");
            } else {
                let g = locker.lock("hot").await.expect("lock");
                shared.waits.lock().unwrap().push(start.elapsed());
                let v = counter_value(con, shared.counter.as_bytes()).await;
                if write {
                    shared.tokens.lock().unwrap().push(g.fencing_token());
                    redis::cmd("SET")
                        .arg(&shared.counter)
                        .arg(v + 1)
                        .query_async::<()>(con)
                        .await
                        .expect("SET");
                    shared.writes.fetch_add(1, Ordering::Relaxed);
                }
                g.release().await.expect("release");
            }
        }
        Row::FourLocks | Row::Semaphore => {
            let guard: Box<dyn std::any::Any + Send> = if row == Row::Semaphore {
                let p = locker
                    .semaphore("lanes", CAPACITY)
                    .acquire()
                    .await
                    .expect("permit");
                Box::new(p)
            } else {
                let lane = task % CAPACITY as usize;
                Box::new(locker.lock(format!("lane-{lane}")).await.expect("lock"))
            };
            shared.waits.lock().unwrap().push(start.elapsed());
            shared.enter();
            let _ = counter_value(con, shared.counter.as_bytes()).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
            shared.leave();
            drop(guard); // released in the background, like a dropped guard
        }
        Row::Default | Row::Fair => {
            let g = locker.lock("hot").await.expect("lock");
            shared.waits.lock().unwrap().push(start.elapsed());
            shared.tokens.lock().unwrap().push(g.fencing_token());
            increment(con, shared.counter.as_bytes(), ready(())).await;
            shared.writes.fetch_add(1, Ordering::Relaxed);
            g.release().await.expect("release");
        }
    }
}

async fn run_row(server: &RedisServer, row: Row, p: usize, t: usize, secs: f64) -> Measured {
    let prefix = testkit::unique_prefix(&format!("family-{row:?}"));
    let mut lockers = Vec::new();
    for _ in 0..p {
        let backend = RedisBackend::builder(server.url())
            .prefix(&prefix)
            .connect()
            .await
            .expect("connect");
        let builder = Locker::builder(backend)
            .wait_timeout(Duration::from_secs(60))
            .max_waiters(1 << 16);
        let builder = if row == Row::Fair {
            builder.contention(Contention::Fair)
        } else {
            builder
        };
        lockers.push(builder.build().expect("locker"));
    }
    let shared = Arc::new(Shared {
        counter: format!("{prefix}:counter"),
        writes: AtomicU64::new(0),
        tokens: Mutex::new(Vec::new()),
        inside: AtomicUsize::new(0),
        most_inside: AtomicUsize::new(0),
        waits: Mutex::new(Vec::new()),
    });
    let con = server.connection().await;
    let before = evalsha_calls(server).await;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, locker) in lockers.iter().enumerate() {
        for task in 0..t {
            let (locker, mut con, shared) = (locker.clone(), con.clone(), Arc::clone(&shared));
            tasks.spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64((i * t + task) as u64);
                let mut n = 0u64;
                while Instant::now() < end {
                    operation(row, &locker, task, &mut rng, &mut con, &shared).await;
                    n += 1;
                }
                (i, n)
            });
        }
    }
    let mut per_instance = vec![0u64; p];
    while let Some(done) = tasks.join_next().await {
        let (i, n) = done.expect("task");
        per_instance[i] += n;
    }
    let secs = start.elapsed().as_secs_f64();
    // Background releases of the capacity rows: let them land before counting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let requests = evalsha_calls(server).await - before;
    let ops: u64 = per_instance.iter().sum();

    // The row's own checks.
    let mut con = con.clone();
    let writes = shared.writes.load(Ordering::Relaxed);
    assert_eq!(
        counter_value(&mut con, shared.counter.as_bytes()).await,
        writes,
        "{}: lost update",
        row.label()
    );
    let tokens = shared.tokens.lock().unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "{}: write fencing tokens do not strictly increase",
        row.label()
    );
    let most = shared.most_inside.load(Ordering::SeqCst);
    assert!(
        most <= CAPACITY as usize,
        "{}: {most} holders at once",
        row.label()
    );
    let mut waits = shared.waits.lock().unwrap().clone();
    waits.sort_unstable();
    let wait_p99 = waits
        .get(waits.len().saturating_mul(99) / 100)
        .copied()
        .unwrap_or_default();
    Measured {
        row,
        ops,
        secs,
        requests,
        wait_p99,
        shares: per_instance
            .iter()
            .map(|&n| n as f64 / ops.max(1) as f64)
            .collect(),
    }
}

fn main() {
    let (secs, p, t) = common::scale();
    common::runtime().block_on(async move {
        let server = RedisServer::start();
        let mut rows = Vec::new();
        for row in [
            Row::ReadsExclusive,
            Row::ReadsRw,
            Row::FourLocks,
            Row::Semaphore,
            Row::Default,
            Row::Fair,
        ] {
            let m = run_row(&server, row, p, t, secs).await;
            eprintln!("{}: {} operations in {:.1} s", row.label(), m.ops, m.secs);
            rows.push(m);
        }
        println!(
            "P = {p} instances × T = {t} tasks, {secs} s per row, one process, 2 Tokio workers, \
             one local redis-server\n"
        );
        println!("| row | ops/s | lock round trips / op | wait p99 | instance shares |");
        println!("|---|---:|---:|---:|---|");
        for m in &rows {
            let shares: Vec<String> = m.shares.iter().map(|s| format!("{:.0} %", s * 100.0)).collect();
            println!(
                "| {} | {:.0} | {:.3} | {:.1} ms | {} |",
                m.row.label(),
                m.ops as f64 / m.secs,
                m.requests as f64 / m.ops.max(1) as f64,
                m.wait_p99.as_secs_f64() * 1000.0,
                shares.join(" / ")
            );
        }
        let ratio = |a: Row, b: Row| {
            let rate = |r: Row| {
                rows.iter()
                    .find(|m| m.row == r)
                    .map_or(0.0, |m| m.ops as f64 / m.secs)
            };
            rate(a) / rate(b).max(f64::MIN_POSITIVE)
        };
        println!(
            "\nread-write / exclusive: {:.2}×; semaphore / four locks: {:.2}×; fair / default: {:.2}×",
            ratio(Row::ReadsRw, Row::ReadsExclusive),
            ratio(Row::Semaphore, Row::FourLocks),
            ratio(Row::Fair, Row::Default)
        );
    });
}
