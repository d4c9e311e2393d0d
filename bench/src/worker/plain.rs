//! The honest baseline of the `plain` mode: a plain Redis lock without lockflight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockflight::backend::LeaseToken;

/// The honest baseline: a plain Redis lock as the usual libraries write it, on
/// redis-rs. `SET <name> <random token> NX PX 30000`; while busy, sleep 1 ms and try
/// again; release with a Lua compare-and-delete (`EVALSHA`). No coalescing, no
/// queue, no wake-ups, no fencing.
pub(crate) struct PlainLock {
    pub(super) conn: redis::aio::MultiplexedConnection,
    pub(super) names: Vec<String>,
    /// `[acquire attempts, releases]`
    pub(super) requests: [AtomicU64; 2],
}

static PLAIN_RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    )
});

impl PlainLock {
    const TTL_MS: u64 = 30_000;
    const RETRY: Duration = Duration::from_millis(1);

    /// Takes the lock of key `k`; returns its token.
    pub(super) async fn lock(&self, k: usize, deadline: Instant) -> Result<String, String> {
        let token = LeaseToken::random().to_hex();
        let mut conn = self.conn.clone();
        loop {
            self.requests[0].fetch_add(1, Ordering::Relaxed);
            let ok: Option<String> = redis::cmd("SET")
                .arg(&self.names[k])
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(Self::TTL_MS)
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("plain SET NX: {e}"))?;
            if ok.is_some() {
                return Ok(token);
            }
            if Instant::now() > deadline {
                return Err("plain lock: timed out".into());
            }
            tokio::time::sleep(Self::RETRY).await;
        }
    }

    pub(super) async fn unlock(&self, k: usize, token: &str) -> Result<(), String> {
        self.requests[1].fetch_add(1, Ordering::Relaxed);
        let mut conn = self.conn.clone();
        let deleted: i64 = PLAIN_RELEASE
            .key(&self.names[k])
            .arg(token)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("plain release: {e}"))?;
        if deleted == 1 {
            Ok(())
        } else {
            Err("plain release: the lock was no longer ours".into())
        }
    }
}
