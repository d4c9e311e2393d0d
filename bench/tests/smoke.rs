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
//! uncontended lock + release is exactly 2 backend round trips.

use std::time::{Duration, Instant};

use bench::{Config, WORKER_ENV, run, worker_main};

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
