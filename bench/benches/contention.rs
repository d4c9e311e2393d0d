//! The contention benchmark's binary: see the `bench` library (bench/src/lib.rs)
//! for what it measures, the knobs and the correctness oracles.
//!
//! ```text
//! cargo bench -p bench --bench contention                        # default run
//! LOCKFLIGHT_BENCH_SMOKE=1 cargo bench -p bench --bench contention   # CI-sized
//! ```
//!
//! It is also the worker process: the coordinator re-executes this binary with
//! [`bench::WORKER_ENV`] set.

use bench::{Config, WORKER_ENV, run, worker_main};

fn this_binary() -> std::process::Command {
    std::process::Command::new(std::env::current_exe().expect("the bench binary's path"))
}

fn main() {
    if std::env::var_os(WORKER_ENV).is_some() {
        worker_main();
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: smoke only.
    let benching = std::env::args().any(|a| a == "--bench");
    let cfg = Config::from_env(this_binary, !benching);
    match run(&cfg) {
        Ok(report) => {
            println!("{}", report.markdown);
            eprintln!(
                "results: {}, {}{}",
                cfg.out_dir.join("results.jsonl").display(),
                cfg.out_dir.join("results.md").display(),
                if report.chart.is_some() {
                    format!(", {}", cfg.out_dir.join("contention.svg").display())
                } else {
                    String::new()
                }
            );
        }
        Err(e) => {
            eprintln!("\n*** lockflight contention bench FAILED ***\n{e}");
            std::process::exit(1);
        }
    }
}
