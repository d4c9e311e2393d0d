//! Fault injection beyond the server's own `pause`/`kill`/`restart`: stopping and
//! continuing any process (a child holder), killing client connections, and a
//! Zipf sampler for skewed key choice.

use std::time::Duration;

use super::{process_state, send_signal, wait_for_state};

/// Stops process `pid` with `SIGSTOP` and waits (up to 2 s) until it is stopped.
/// Returns whether it is.
pub fn stop_process(pid: u32) -> bool {
    send_signal(pid, "STOP");
    wait_for_state(pid, |s| matches!(s, Some('T' | 't') | None));
    matches!(process_state(pid), Some('T' | 't'))
}

/// Continues process `pid` with `SIGCONT` and waits (up to 2 s) until it runs.
pub fn continue_process(pid: u32) {
    send_signal(pid, "CONT");
    wait_for_state(pid, |s| !matches!(s, Some('T' | 't')));
}

/// `CLIENT KILL TYPE <kind>` (`normal`, `pubsub`, …) on `con`, which is skipped
/// itself (`SKIPME yes`, the default). Returns how many connections were killed,
/// or `None` if the server did not answer within `timeout`.
pub async fn client_kill(
    con: &mut redis::aio::MultiplexedConnection,
    kind: &str,
    timeout: Duration,
) -> Option<i64> {
    let cmd = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg(kind)
        .clone();
    match tokio::time::timeout(timeout, cmd.query_async::<i64>(con)).await {
        Ok(Ok(n)) => Some(n),
        _ => None,
    }
}

/// Samples ranks `0..n` with probability proportional to `1 / (rank + 1)^s`.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The sampler over `n` ranks with exponent `s`; panics if `n` is 0.
    pub fn new(n: usize, s: f64) -> Zipf {
        assert!(n > 0, "Zipf over an empty range");
        let mut total = 0.0;
        let mut cdf = Vec::with_capacity(n);
        for rank in 0..n {
            total += 1.0 / ((rank + 1) as f64).powf(s);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Zipf { cdf }
    }

    /// The rank for a uniform sample `u` in `[0, 1)`.
    pub fn rank(&self, u: f64) -> usize {
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}
