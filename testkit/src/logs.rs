//! Capturing what lockflight logs, for tests that assert an event was (or was not)
//! logged.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

/// What a `tracing` subscriber writes on the current thread while its guard lives,
/// as plain text (one event per line, no colours).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Captures events at `INFO` and above on this thread until the guard drops.
    /// Use a current-thread runtime, so that spawned tasks log on this thread too.
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }

    /// How many captured lines contain every one of `needles` (a level such as
    /// `"WARN"` is one more needle).
    pub fn lines_with(&self, needles: &[&str]) -> usize {
        self.text()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .count()
    }
}
