//! What lockflight's own benches share (included with `#[path]`): how long and how
//! large a run is, and the runtime they run on.

/// How long and how large a run is, as `(secs, p, t)`: `LOCKFLIGHT_BENCH_SECS` per
/// measurement (default 3 s) with P = 4 instances × T = 64 tasks under `cargo
/// bench`; a short smoke run (0.3 s, 2 × 4) when `cargo test --benches` runs it.
pub(crate) fn scale() -> (f64, usize, usize) {
    if std::env::args().any(|a| a == "--bench") {
        (bench_secs(3.0), 4, 64)
    } else {
        (bench_secs(0.3), 2, 4)
    }
}

/// `LOCKFLIGHT_BENCH_SECS`, or `default` when it is not set (or not a number).
pub(crate) fn bench_secs(default: f64) -> f64 {
    std::env::var("LOCKFLIGHT_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The benches' runtime: 2 Tokio worker threads.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
