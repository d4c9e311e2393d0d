//! What lockflight's own benches share (included with `#[path]`): how long and how
//! large a run is, and the runtime they run on.

/// How long and how large a run is: `LOCKFLIGHT_BENCH_SECS` per measurement
/// (default 3 s) with P = 4 instances × T = 64 tasks under `cargo bench`; a short
/// smoke run (0.3 s, 2 × 4) when `cargo test --benches` runs the bench.
pub(crate) struct Scale {
    pub(crate) secs: f64,
    pub(crate) instances: usize,
    pub(crate) tasks: usize,
}

impl Scale {
    pub(crate) fn from_args() -> Scale {
        let bench = std::env::args().any(|a| a == "--bench");
        let (instances, tasks) = if bench { (4, 64) } else { (2, 4) };
        Scale {
            secs: bench_secs(if bench { 3.0 } else { 0.3 }),
            instances,
            tasks,
        }
    }
}

/// `LOCKFLIGHT_BENCH_SECS`, or `default` when it is not set (or not a number).
pub(crate) fn bench_secs(default: f64) -> f64 {
    std::env::var("LOCKFLIGHT_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The benches' runtime: 2 Tokio worker threads, as on the machines the numbers
/// in the docs come from.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
