//! A first look at lockflight: many tasks increment one counter under one lock.
//!
//! With `REDIS_URL` set it locks in Redis; without it, it runs single-instance on the
//! in-process backend and says so.
//!
//! ```text
//! cargo run -p examples --example quickstart
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p examples --example quickstart
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockflight::{Handoff, Locker, MemoryBackend, RedisBackend};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let builder = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("locking in Redis at {url}");
            Locker::builder(RedisBackend::connect(&url).await?)
        }
        Err(_) => {
            println!("REDIS_URL is not set: running single-instance on the in-process backend");
            Locker::builder(MemoryBackend::new())
        }
    };
    for handoff in [Handoff::disabled(), Handoff::enabled()] {
        let locker = builder
            .clone()
            .wait_timeout(Duration::from_secs(30))
            .handoff(handoff)
            .build()?;
        let counter = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (locker, counter) = (locker.clone(), Arc::clone(&counter));
            tasks.push(tokio::spawn(async move {
                for _ in 0..50 {
                    let guard = locker.lock("quickstart:counter").await?;
                    // A read-modify-write that would lose updates without the lock.
                    let seen = counter.load(Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::Relaxed);
                    guard.release().await?;
                }
                Ok::<_, lockflight::Error>(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        let stats = locker.stats();
        println!(
            "handoff {:<5}: {} critical sections in {:?}, {} backend acquires, {} handoffs, {} releases",
            handoff.is_enabled(),
            counter.load(Ordering::Relaxed),
            started.elapsed(),
            stats.acquire_attempts,
            stats.handoffs,
            stats.releases,
        );
    }
    Ok(())
}
