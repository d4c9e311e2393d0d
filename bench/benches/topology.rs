//! The topology table alone: the hot-key workload on one server, a Redis Cluster
//! and Sentinel, all started on loopback (see `bench::topology`). The contention
//! bench measures the same table after its points.
//!
//! ```text
//! cargo bench -p bench --bench topology
//! LOCKFLIGHT_BENCH_SECS=3 cargo bench -p bench --bench topology
//! ```

fn main() {
    // `cargo test --benches` runs benches without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let secs = std::env::var("LOCKFLIGHT_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(bench::topology::measure(secs)) {
        Ok(rows) => println!("{}", bench::topology::markdown(&rows, secs)),
        Err(e) => {
            eprintln!("\n*** lockflight topology bench FAILED ***\n{e}");
            std::process::exit(1);
        }
    }
}
