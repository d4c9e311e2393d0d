//! Row 7: a seeded **nemesis soak**.
//!
//! 3 instances × 8 tasks with handoff on, plus a 4th instance of 4 tasks on a
//! runtime of its own, take a hot key (half the time) or one of 16
//! Zipf-distributed keys, and write to a fenced resource. A nemesis meanwhile
//! stops Redis (SIGSTOP for up to 2 × TTL), kills and restarts it empty, kills
//! client and pub/sub connections, and **freezes the 4th instance** for up to
//! 2 × TTL: it blocks the only thread of that instance's runtime, so none of its
//! tasks, timers or renewals run — a paused holder process, in process. A few
//! holders also stall for up to 2 × TTL between their check and their write
//! while their runtime runs on (their lease is renewed meanwhile).
//!
//! The seed is printed; `LOCKFLIGHT_SOAK_SEED=<seed>` replays its schedule (the
//! timing of a real server is not replayable), `LOCKFLIGHT_SOAK_SECS=60` runs the
//! long form (default 15 s).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lockflight::{Error, Handoff, Locker};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use tokio::task::JoinSet;

use crate::oracle::{Fence, History};
use crate::{
    IDLE, TTL, Tally, assert_no_lock_left, backend_at, join_all, kind, lock_granted, serial,
    wait_idle, within,
};
use testkit::nemesis::{Zipf, client_kill};
use testkit::{RedisServer, unique_prefix};

const LOCKERS: usize = 3;
const TASKS: usize = 8;
/// Tasks of the instance that the nemesis freezes.
const FROZEN_TASKS: usize = 4;
const ZIPF_KEYS: usize = 16;
const WAIT: Duration = Duration::from_secs(2);
const DEFAULT_SECS: u64 = 15;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

struct Shared {
    history: Arc<History>,
    fence: Fence,
    errors: Tally,
    stop: AtomicBool,
    /// Holders that may still stall between check and write.
    stalls_left: AtomicU32,
    zipf: Zipf,
}

async fn worker(locker: Locker, name: String, seed: u64, shared: Arc<Shared>) {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..1_000_000 {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let key = if rng.random_bool(0.5) {
            "hot".to_owned()
        } else {
            format!("z{}", shared.zipf.rank(rng.random::<f64>()))
        };
        let call = Instant::now();
        let Some(guard) = lock_granted(locker.lock(key.as_str()).await, &shared.errors) else {
            continue;
        };
        let mut held = shared.history.granted(&key, name.clone(), call, &guard);
        let stall = rng.random_ratio(1, 200)
            && shared
                .stalls_left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
        if stall {
            // A holder paused between its check and its write.
            let pause = Duration::from_millis(rng.random_range(0..2 * TTL.as_millis() as u64));
            if held.still_valid(&guard) {
                tokio::time::sleep(pause).await;
                let ok = held.write_unchecked(&shared.fence);
                shared.errors.add(if ok {
                    "stall: write accepted"
                } else {
                    "stall: write fenced"
                });
            } else {
                shared.errors.add("stall: saw the loss");
            }
        } else {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..5))).await;
            held.write(&guard, &shared.fence);
        }
        let lost_before = guard.is_lost();
        let call = held.finish().call;
        if rng.random_ratio(1, 10) {
            drop(guard); // released (or handed on) in the background
            continue;
        }
        match guard.release().await {
            Ok(()) => {}
            Err(e @ Error::Backend { .. }) => shared.errors.add(format!("release: {}", kind(&e))),
            Err(Error::LeaseLost { .. }) => shared.errors.add(if lost_before {
                "release: LeaseLost (seen lost before)"
            } else if shared
                .history
                .data_lost_since(call.checked_sub(2 * TTL).unwrap_or(call))
            {
                "release: LeaseLost (data lost)"
            } else {
                "release: LeaseLost (not seen lost: a lost reply?)"
            }),
            Err(e) => panic!("release failed with {e:?}"),
        }
    }
}

/// The instance that the nemesis freezes: a thread running a current-thread
/// runtime with its own locker and workers.
struct Freezable {
    locker: Locker,
    freeze: tokio::sync::mpsc::UnboundedSender<Duration>,
    thread: std::thread::JoinHandle<()>,
}

impl Freezable {
    async fn start(url: String, prefix: String, seed: u64, shared: Arc<Shared>) -> Freezable {
        let (locker_tx, locker_rx) = tokio::sync::oneshot::channel();
        let (freeze, mut freezes) = tokio::sync::mpsc::unbounded_channel::<Duration>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the frozen instance's runtime");
            runtime.block_on(async move {
                let locker = Locker::builder(backend_at(&url, &prefix).await)
                    .lease_ttl(TTL)
                    .wait_timeout(WAIT)
                    .handoff(Handoff::enabled())
                    .build()
                    .unwrap();
                let _ = locker_tx.send(locker.clone());
                let mut tasks = JoinSet::new();
                for t in 0..FROZEN_TASKS {
                    tasks.spawn(worker(
                        locker.clone(),
                        format!("frozen/{t}"),
                        seed.wrapping_add(1000 + t as u64),
                        Arc::clone(&shared),
                    ));
                }
                loop {
                    tokio::select! {
                        Some(d) = freezes.recv() => {
                            // Blocks the runtime's only thread: everything stops.
                            std::thread::sleep(d);
                        }
                        joined = tasks.join_next() => match joined {
                            None => break,
                            Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                            Some(_) => {}
                        },
                    }
                }
                // Let background releases finish on this runtime.
                crate::wait_idle(std::slice::from_ref(&locker), IDLE).await;
            });
        });
        let locker = within(
            Duration::from_secs(20),
            "the frozen instance's start",
            locker_rx,
        )
        .await
        .expect("the frozen instance started");
        Freezable {
            locker,
            freeze,
            thread,
        }
    }

    async fn join(self) {
        let thread = self.thread;
        let joined = within(
            Duration::from_secs(60),
            "the frozen instance's thread",
            tokio::task::spawn_blocking(move || thread.join()),
        )
        .await
        .expect("join the frozen instance's thread");
        if let Err(panic) = joined {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Zero fenced-order violations, no overlap (except after Redis lost its data),
/// no grant of a lost lease, only typed errors, and no lock key left once every
/// task stopped and the TTLs passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_soak() {
    let _serial = serial().await;
    let seed = env_u64("LOCKFLIGHT_SOAK_SEED").unwrap_or_else(rand::random);
    let secs = env_u64("LOCKFLIGHT_SOAK_SECS").unwrap_or(DEFAULT_SECS);
    println!("soak: seed {seed} (LOCKFLIGHT_SOAK_SEED={seed} replays it), {secs} s");
    let server = Arc::new(RedisServer::start());
    let prefix = unique_prefix("soak");
    let shared = Arc::new(Shared {
        history: History::new(),
        fence: Fence::default(),
        errors: Tally::default(),
        stop: AtomicBool::new(false),
        stalls_left: AtomicU32::new(u32::try_from(secs).unwrap_or(u32::MAX)),
        zipf: Zipf::new(ZIPF_KEYS, 1.1),
    });
    let mut lockers = Vec::new();
    for _ in 0..LOCKERS {
        lockers.push(
            Locker::builder(backend_at(&server.url(), &prefix).await)
                .lease_ttl(TTL)
                .wait_timeout(WAIT)
                .handoff(Handoff::enabled())
                .build()
                .unwrap(),
        );
    }
    let frozen = Freezable::start(server.url(), prefix.clone(), seed, Arc::clone(&shared)).await;
    let mut tasks = JoinSet::new();
    for (li, locker) in lockers.iter().enumerate() {
        for t in 0..TASKS {
            let task_seed = seed.wrapping_add((li * TASKS + t + 1) as u64);
            tasks.spawn(worker(
                locker.clone(),
                format!("{li}/{t}"),
                task_seed,
                Arc::clone(&shared),
            ));
        }
    }

    // The nemesis: one fault at a time, each bounded.
    let actions = Tally::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x006e_656d_6573_6973);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last_restart = Instant::now();
    for _ in 0..10_000 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
        if Instant::now() >= deadline {
            break;
        }
        match rng.random_range(0..100) {
            0..20 => {
                let pause =
                    Duration::from_millis(rng.random_range(100..=2 * TTL.as_millis() as u64));
                server.pause();
                tokio::time::sleep(pause).await;
                server.resume();
                actions.add("pause redis");
            }
            20..32 if last_restart.elapsed() >= Duration::from_secs(3) => {
                shared.history.data_loss();
                server.kill();
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
                let server = Arc::clone(&server);
                tokio::task::spawn_blocking(move || server.restart())
                    .await
                    .unwrap();
                last_restart = Instant::now();
                actions.add("kill + restart redis");
            }
            32..52 => {
                let mut con = server.connection().await;
                if client_kill(&mut con, "normal", Duration::from_secs(1))
                    .await
                    .is_some()
                {
                    actions.add("kill client connections");
                }
            }
            52..65 => {
                let mut con = server.connection().await;
                if client_kill(&mut con, "pubsub", Duration::from_secs(1))
                    .await
                    .is_some()
                {
                    actions.add("kill pub/sub connections");
                }
            }
            65..85 => {
                let pause =
                    Duration::from_millis(rng.random_range(100..=2 * TTL.as_millis() as u64));
                if frozen.freeze.send(pause).is_ok() {
                    tokio::time::sleep(pause).await;
                    actions.add("freeze an instance");
                }
            }
            _ => actions.add("nothing"),
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    within(Duration::from_secs(60), "the tasks", join_all(tasks)).await;
    let frozen_locker = frozen.locker.clone();
    frozen.join().await;
    lockers.push(frozen_locker);
    wait_idle(&lockers, IDLE).await;
    assert_no_lock_left(&server, &prefix, 3 * TTL).await;

    let verdict = shared.history.check();
    let handoffs: u64 = lockers.iter().map(|l| l.stats().handoffs).sum();
    let lost: u64 = lockers.iter().map(|l| l.stats().leases_lost).sum();
    println!("soak: seed {seed}: {}", verdict.summary());
    println!("soak: nemesis {:?}", actions.snapshot());
    println!(
        "soak: {handoffs} handoffs, {lost} leases lost; errors and events {:?}",
        shared.errors.snapshot()
    );
    verdict.assert_clean(&format!("soak with seed {seed}"));
    assert!(verdict.sections > 0, "no progress at all");
}
