//! The scale curves: how lockflight's cost grows with distinct keys, local
//! waiters, held leases and instances (see `bench::scale`, which documents each
//! curve and its `LOCKFLIGHT_SCALE_*` knobs).
//!
//! ```text
//! cargo bench -p bench --bench scale
//! LOCKFLIGHT_SCALE_KEYS_MAX=1000000 cargo bench -p bench --bench scale
//! ```

fn main() {
    // `cargo test --benches` runs benches without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let knobs = bench::scale::Knobs::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let curves = match runtime.block_on(bench::scale::run(&knobs)) {
        Ok(curves) => curves,
        Err(e) => {
            eprintln!("\n*** lockflight scale bench FAILED ***\n{e}");
            std::process::exit(1);
        }
    };
    let heading = format!(
        "### lockflight scale curves — {}",
        std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map_or_else(String::new, |d| d.trim().to_owned())
    );
    match bench::scale::write(&curves, &knobs.out_dir, &heading) {
        Ok(md) => {
            println!("{md}");
            eprintln!("written to {}", knobs.out_dir.display());
        }
        Err(e) => {
            eprintln!("\n*** lockflight scale bench: writing the report FAILED ***\n{e}");
            std::process::exit(1);
        }
    }
}
