//! CI smoke run of the contention benchmark (`benches/contention.rs`, harness in
//! the `bench` library).
//!
//! This test binary links the bench's harness. Its worker
//! processes re-execute *this* binary: the coordinator starts it with
//! `--exact contention_worker --include-ignored --nocapture` and the worker
//! environment variable, so only the ignored [`contention_worker`] runs there, reads
//! its spec from stdin and prints its protocol lines (marked `LFBENCH`; libtest's own
//! output is ignored). The run is the bench's smoke configuration: P = 2 processes ×
//! T = 4 tasks, 0.5 s per point, every workload and mode, against a private
//! `redis-server`. It fails on any correctness violation (lost update, fencing token
//! out of order, lease lost, timeout, leftover lock key or slot) and checks that an
//! uncontended lock + release is exactly 2 backend round trips, and that the hot key's
//! efficiency is in (0, 1.05] and its lock passed between processes (P ≥ 2, a lock
//! across processes).

use std::time::{Duration, Instant};

use bench::{Config, Mode, WORKER_ENV, Workload, run, worker_main};

fn worker_command() -> std::process::Command {
    let mut cmd =
        std::process::Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.args([
        "--exact",
        "contention_worker",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd
}

/// Not a test: a worker process of [`contention_smoke`] (does nothing when run
/// without the worker environment variable).
#[test]
#[ignore = "worker process of contention_smoke"]
fn contention_worker() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    worker_main();
}

#[test]
fn contention_smoke() {
    let started = Instant::now();
    let mut cfg = Config::smoke(worker_command);
    // Always a private server and the smoke shape, whatever the environment says.
    cfg.redis_url = None;
    let report = run(&cfg).unwrap_or_else(|e| panic!("contention smoke run: {e}"));

    let expected = cfg.workloads.len() * cfg.modes.len() * cfg.tasks.len();
    assert_eq!(report.points.len(), expected, "every point ran");
    for p in &report.points {
        assert!(
            p.sections > 0,
            "{} {}: no critical section",
            p.workload.name(),
            p.mode.name()
        );
        if p.workload == Workload::Zipf {
            continue;
        }
        // How busy the hot key was: no timing bound beyond what must hold (the
        // sections on one key never overlap, so their time fits in the elapsed time).
        let what = format!("{} {} P={}", p.workload.name(), p.mode.name(), p.procs);
        let efficiency = p
            .efficiency
            .unwrap_or_else(|| panic!("{what}: no efficiency"));
        assert!(
            efficiency > 0.0 && efficiency <= 1.05,
            "{what}: efficiency {efficiency} is not in (0, 1.05]"
        );
        if p.procs >= 2 && p.mode != Mode::Floor {
            let transfers = p.transfers_per_s.unwrap_or(0.0);
            assert!(
                transfers > 0.0,
                "{what}: the lock never passed between processes"
            );
        }
    }
    assert!(!report.uncontended.is_empty());
    for u in &report.uncontended {
        assert_eq!(
            (u.min_requests, u.max_requests),
            (2, 2),
            "uncontended lock + release ({}) must be exactly 2 round trips",
            u.mode.name()
        );
    }
    assert_eq!(report.wake.wake_us.len(), cfg.wake_reps);
    let took = started.elapsed();
    eprintln!("{}", report.markdown);
    assert!(
        took < Duration::from_secs(30),
        "the smoke run took {took:?}, more than 30 s"
    );
}
