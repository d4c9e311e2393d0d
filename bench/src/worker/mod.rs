//! A worker process: one lock mode, T tasks running critical sections on the
//! workload's keys between the start and end instants of the `GO` line, and the
//! typed result.

mod plain;
mod zipf;

use std::io::BufRead as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lockflight::{LockKey, Locker, RedisBackend};
use rand::SeedableRng as _;
use rand::rngs::StdRng;

use crate::config::{
    HOLD, Mode, WAIT_TIMEOUT, Workload, ZIPF_KEYS, ZIPF_S, counter_name, lock_key,
};
use crate::protocol::{LockStats, WorkerResult, WorkerSpec, emit, parse_go, unix_us};
use crate::{data_connection, micros, new_histogram};
use plain::PlainLock;
use testkit::Counting;
use zipf::Zipf;

/// The entry point of a worker process: reads its spec from stdin, runs, prints one
/// `LFBENCH RESULT` line. Call it first thing in `main` (or in a dedicated test)
/// when [`WORKER_ENV`](crate::WORKER_ENV) is set.
pub fn worker_main() {
    let mut line = String::new();
    if let Err(e) = std::io::stdin().lock().read_line(&mut line) {
        emit("ERROR", &format!("reading the worker spec: {e}"));
        return;
    }
    let spec: WorkerSpec = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => {
            emit("ERROR", &format!("bad worker spec {line:?}: {e}"));
            return;
        }
    };
    let threads = spec.threads;
    let rt = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("a tokio runtime");
    match rt.block_on(worker(spec)) {
        Ok(result) => match serde_json::to_string(&result) {
            Ok(json) => emit("RESULT", &json),
            Err(e) => emit("ERROR", &format!("serializing the result: {e}")),
        },
        Err(e) => emit("ERROR", &e.replace('\n', " | ")),
    }
    rt.shutdown_timeout(Duration::from_secs(1));
}

/// How the tasks of a worker guard their critical sections (by mode).
enum Guard {
    Lock(Arc<Locker>),
    Mutexes(Vec<tokio::sync::Mutex<()>>),
    Plain(PlainLock),
}

/// What every task of a worker shares.
struct Ctx {
    workload: Workload,
    guard: Guard,
    data: redis::aio::MultiplexedConnection,
    keys: Vec<LockKey>,
    counters: Vec<String>,
    zipf: Option<Zipf>,
    end: Instant,
}

#[derive(Default)]
struct TaskOut {
    sections: u64,
    /// Time spent inside [`critical_section`], summed over this task's sections.
    section: Duration,
    hist: Option<Histogram<u64>>,
    /// `[key index, counter value read, epoch, seq, start, end]` (start and end:
    /// the section's, unix µs)
    records: Vec<[u64; 6]>,
    error: Option<String>,
}

async fn worker(spec: WorkerSpec) -> Result<WorkerResult, String> {
    let WorkerSpec {
        id,
        url,
        prefix,
        workload,
        mode,
        tasks,
        threads: _,
        seed,
    } = spec;
    let data = data_connection(&url).await?;
    let nkeys = workload.keys();
    let (guard, counts) = if mode == Mode::Floor {
        let mutexes = (0..nkeys).map(|_| tokio::sync::Mutex::new(())).collect();
        (Guard::Mutexes(mutexes), None)
    } else if mode == Mode::Plain {
        let plain = PlainLock {
            conn: data_connection(&url).await?,
            names: (0..nkeys)
                .map(|k| format!("{prefix}:{{plain-{k}}}"))
                .collect(),
            requests: Default::default(),
        };
        (Guard::Plain(plain), None)
    } else {
        let backend = RedisBackend::builder(url.as_str())
            .prefix(prefix.as_str())
            .connect()
            .await
            .map_err(|e| format!("worker {id}: connect: {e}"))?;
        let (backend, counts) = Counting::new(backend);
        let locker = mode.locker(backend).map_err(|e| e.to_string())?;
        (Guard::Lock(Arc::new(locker)), Some(counts))
    };
    emit("READY", &id.to_string());

    let go = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("worker {id}: reading GO: {e}"))?;
    let (start, end) = parse_go(&go).map_err(|e| format!("worker {id}: {e}"))?;

    let ctx = Arc::new(Ctx {
        workload,
        guard,
        data,
        keys: (0..nkeys).map(|k| lock_key(workload, k)).collect(),
        counters: (0..nkeys)
            .map(|k| counter_name(&prefix, workload, k))
            .collect(),
        zipf: (workload == Workload::Zipf).then(|| Zipf::new(ZIPF_KEYS, ZIPF_S)),
        end,
    });
    let stats_before = match &ctx.guard {
        Guard::Lock(l) => Some(l.stats()),
        Guard::Mutexes(_) | Guard::Plain(_) => None,
    };
    tokio::time::sleep_until(start.into()).await;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let ctx = Arc::clone(&ctx);
            let seed = seed ^ (id << 32) ^ (t as u64).wrapping_mul(0x9E37_79B9);
            tokio::spawn(task_loop(ctx, seed))
        })
        .collect();
    let mut hist = new_histogram();
    let mut sections = 0;
    let mut section = Duration::ZERO;
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.await {
            Ok(out) => {
                sections += out.sections;
                section += out.section;
                if let Some(h) = &out.hist {
                    hist.add(h).map_err(|e| e.to_string())?;
                }
                records.extend(out.records);
                errors.extend(out.error);
            }
            Err(e) => errors.push(format!("task panicked: {e}")),
        }
    }
    let elapsed = start.elapsed();
    // A lease kept for the next local task (lease caching) must not outlive the
    // worker: release it before exiting, as a program should.
    if let Guard::Lock(l) = &ctx.guard {
        l.shutdown().await;
    }
    let stats = match (&ctx.guard, stats_before) {
        (Guard::Lock(l), Some(before)) => {
            let s = l.stats() - before;
            Some(LockStats {
                acquire_attempts: s.acquire_attempts,
                acquired: s.acquired,
                local_waits: s.local_waits,
                handoffs: s.handoffs,
                releases: s.releases,
                renewals: s.renewals,
                leases_lost: s.leases_lost,
                timeouts: s.timeouts,
                active_keys: l.stats().keys_in_use,
            })
        }
        _ => None,
    };
    let requests = match &ctx.guard {
        Guard::Plain(p) => [
            p.requests[0].load(Ordering::Relaxed),
            p.requests[1].load(Ordering::Relaxed),
            0,
            0,
        ],
        _ => counts.map_or([0; 4], |c| c.snapshot()),
    };
    let hist: Vec<[u64; 2]> = hist
        .iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect();
    Ok(WorkerResult {
        id,
        sections,
        section_us: section.as_micros() as u64,
        elapsed_us: micros(elapsed),
        requests,
        stats,
        hist,
        records,
        errors,
    })
}

async fn task_loop(ctx: Arc<Ctx>, seed: u64) -> TaskOut {
    let mut out = TaskOut::default();
    let mut hist = new_histogram();
    if let Err(e) = task_body(&ctx, seed, &mut out, &mut hist).await {
        out.error = Some(e);
    }
    out.hist = Some(hist);
    out
}

async fn task_body(
    ctx: &Ctx,
    seed: u64,
    out: &mut TaskOut,
    hist: &mut Histogram<u64>,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut conn = ctx.data.clone();
    while Instant::now() < ctx.end {
        let k = ctx.zipf.as_ref().map_or(0, |z| z.sample(&mut rng));
        let t0 = Instant::now();
        match &ctx.guard {
            Guard::Lock(locker) => {
                let guard = locker
                    .lock(&ctx.keys[k])
                    .await
                    .map_err(|e| format!("lock: {e}"))?;
                hist.record(micros(t0.elapsed())).ok();
                let (c, start, end) = timed_section(ctx, &mut conn, k, out).await?;
                let f = guard.fencing_token();
                out.records.push([k as u64, c, f.epoch, f.seq, start, end]);
                guard.release().await.map_err(|e| format!("release: {e}"))?;
            }
            Guard::Mutexes(mutexes) => {
                let guard = mutexes[k].lock().await;
                hist.record(micros(t0.elapsed())).ok();
                let (c, start, end) = timed_section(ctx, &mut conn, k, out).await?;
                out.records.push([k as u64, c, 0, 0, start, end]);
                drop(guard);
            }
            Guard::Plain(plain) => {
                let token = plain.lock(k, t0 + WAIT_TIMEOUT).await?;
                hist.record(micros(t0.elapsed())).ok();
                let (c, start, end) = timed_section(ctx, &mut conn, k, out).await?;
                out.records.push([k as u64, c, 0, 0, start, end]);
                plain.unlock(k, &token).await?;
            }
        }
        out.sections += 1;
    }
    Ok(())
}

/// [`critical_section`], its duration added to `out.section` (the key's busy time:
/// the lock's own acquire and release are outside it). Returns the value read and
/// the section's start and end in unix µs: the worker processes share the machine's
/// clock, so the coordinator can measure the gap between two processes' sections.
async fn timed_section(
    ctx: &Ctx,
    conn: &mut redis::aio::MultiplexedConnection,
    k: usize,
    out: &mut TaskOut,
) -> Result<(u64, u64, u64), String> {
    let (t, start) = (Instant::now(), unix_us());
    let c = critical_section(ctx, conn, k).await?;
    let took = t.elapsed();
    out.section += took;
    Ok((c, start, start + micros(took)))
}

/// GET the counter, SET it incremented (two round trips on the data connection),
/// then hold if the workload says so. Returns the value read.
async fn critical_section(
    ctx: &Ctx,
    conn: &mut redis::aio::MultiplexedConnection,
    k: usize,
) -> Result<u64, String> {
    let name = &ctx.counters[k];
    let c: Option<u64> = redis::cmd("GET")
        .arg(name)
        .query_async(conn)
        .await
        .map_err(|e| format!("GET {name}: {e}"))?;
    let c = c.unwrap_or(0);
    redis::cmd("SET")
        .arg(name)
        .arg(c + 1)
        .query_async::<()>(conn)
        .await
        .map_err(|e| format!("SET {name}: {e}"))?;
    if ctx.workload == Workload::HotkeyHold {
        tokio::time::sleep(HOLD).await;
    }
    Ok(c)
}
