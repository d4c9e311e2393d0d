//! The single-process scenarios: an uncontended lock + release (exactly 2 round
//! trips), and the wake-up of a waiting instance after a remote release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockflight::{LockKey, Locker, RedisBackend};

use super::Run;
use super::verify::commandstats;
use crate::config::Mode;
use crate::report::{Uncontended, Wake};
use testkit::{Counting, Counts};

/// A locker of `mode` on its own `RedisBackend` (subscribed), counting its requests.
async fn counting_locker(
    url: &str,
    prefix: &str,
    mode: Mode,
) -> Result<(Locker, RedisBackend, Arc<Counts>), String> {
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let (counting, counts) = Counting::new(backend.clone());
    let locker = mode.locker(counting).map_err(|e| e.to_string())?;
    Ok((locker, backend, counts))
}

pub(super) async fn measure_uncontended(
    run: &mut Run<'_>,
    mode: Mode,
) -> Result<Uncontended, String> {
    let prefix = run.prefix();
    let (locker, _backend, counts) = counting_locker(&run.url, &prefix, mode).await?;
    // A key of its own per pair: the cost of taking a key nobody holds (a key
    // locked again at once is a cached lease's handoff, with no request at all).
    let key = |i: usize| LockKey::from(format!("uncontended:{i}"));
    for i in 0..10 {
        locker
            .lock(key(i))
            .await
            .map_err(|e| e.to_string())?
            .release()
            .await
            .map_err(|e| e.to_string())?;
    }
    let reps = run.cfg.uncontended_reps;
    let (mut min, mut max) = (u64::MAX, 0);
    let mut latency = Vec::with_capacity(reps);
    let before = commandstats(&mut run.admin).await?;
    for i in 0..reps {
        let n0 = counts.total();
        let t0 = Instant::now();
        let g = locker.lock(key(10 + i)).await.map_err(|e| e.to_string())?;
        g.release().await.map_err(|e| e.to_string())?;
        latency.push(t0.elapsed().as_micros() as i64);
        let n = counts.total() - n0;
        min = min.min(n);
        max = max.max(n);
    }
    let after = commandstats(&mut run.admin).await?;
    let server: u64 = after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, &c)| c.saturating_sub(before.get(name).copied().unwrap_or(0)))
        .sum();
    Ok(Uncontended {
        mode,
        reps,
        min_requests: min,
        max_requests: max,
        latency_us: latency,
        server_per_pair: server as f64 / reps.max(1) as f64,
    })
}

pub(super) async fn measure_wake(run: &mut Run<'_>) -> Result<Wake, String> {
    let prefix = run.prefix();
    let (a, _, _) = counting_locker(&run.url, &prefix, Mode::Coalesced).await?;
    let (b, b_backend, b_counts) = counting_locker(&run.url, &prefix, Mode::Coalesced).await?;
    let b = Arc::new(b);
    let key = LockKey::from("wake");
    let queue = format!("{prefix}:{{wake}}:wq");
    let b_id = b_backend.instance_id().to_owned();
    let reps = run.cfg.wake_reps;
    let mut wake = Vec::with_capacity(reps);
    let b_before = b_counts.total();
    for _ in 0..reps {
        let guard = a.lock(&key).await.map_err(|e| e.to_string())?;
        let (bb, k) = (Arc::clone(&b), key.clone());
        let waiter = tokio::spawn(async move {
            let g = bb.lock(&k).await;
            (g, Instant::now())
        });
        // B waits in lock(): its queue entry exists and it has had time to park.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let queued: Option<String> = redis::cmd("ZSCORE")
                .arg(&queue)
                .arg(&b_id)
                .query_async(&mut run.admin)
                .await
                .map_err(|e| e.to_string())?;
            if queued.is_some() {
                break;
            }
            if Instant::now() > deadline {
                return Err("wake-up scenario: B never queued".into());
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
        guard.release().await.map_err(|e| e.to_string())?;
        let released = Instant::now();
        let (g, woke) = waiter.await.map_err(|e| e.to_string())?;
        let g = g.map_err(|e| format!("wake-up scenario: B's lock(): {e}"))?;
        wake.push(if woke >= released {
            (woke - released).as_micros() as i64
        } else {
            -((released - woke).as_micros() as i64)
        });
        g.release().await.map_err(|e| e.to_string())?;
    }
    let b_requests = b_counts.total() - b_before;
    let mut ping = Vec::with_capacity(reps);
    for _ in 0..reps.max(100) {
        let t0 = Instant::now();
        redis::cmd("PING")
            .query_async::<String>(&mut run.admin)
            .await
            .map_err(|e| e.to_string())?;
        ping.push(t0.elapsed().as_micros() as i64);
    }
    Ok(Wake {
        reps,
        wake_us: wake,
        ping_us: ping,
        // Per repetition B also released once (not part of the wait).
        b_requests_per_rep: b_requests as f64 / reps.max(1) as f64 - 1.0,
    })
}
