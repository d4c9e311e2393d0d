//! The backend's health as one [`Locker`] sees it: a cheap probe for readiness
//! checks ([`Locker::check_backend`]), and the outage state the HTTP edge keeps, so
//! that an unreachable backend is told apart from a busy lock, logged once when it
//! starts and once when it ends, and counted.
//!
//! # Invariants
//!
//! 1. The state is *available* until a failure is reported, and *unavailable* from
//!    then until a success is reported; each transition is seen by exactly one
//!    reporter (an atomic swap), which logs it.
//! 2. A transition to *unavailable* is logged at `WARN` at most once per
//!    [`WARN_EVERY`]; one that is not (a flapping backend) is logged at `DEBUG` and
//!    counted into the next `WARN`. A recovery is logged at `WARN` exactly when the
//!    outage it ends was, so the log never shows a start without its end.
//! 3. At most one probe per locker is in flight for the edge; callers that arrive
//!    meanwhile wait for its outcome, and an outcome younger than [`PROBE_FRESH`]
//!    is reused instead of probing again.
//!
//! # Lock order
//!
//! `probe` (async) before `log` (sync, never held across an `.await`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::Locker;
use crate::backend::LeaseToken;
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

/// The least time between two `WARN`s of outages starting.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);
/// How long the edge reuses a probe's outcome.
pub(crate) const PROBE_FRESH: Duration = Duration::from_secs(1);
/// How long the edge's probe waits for the backend's answer.
pub(crate) const EDGE_PROBE_WITHIN: Duration = Duration::from_secs(1);

/// The key the probe asks about. The probe only reads it (a renewal of a token
/// that owns nothing changes nothing).
fn probe_key() -> LockKey {
    LockKey::from("lockflight:health")
}

/// The backend's health as one locker saw it last.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Whether the last report was a failure (invariant 1).
    down: AtomicBool,
    log: Mutex<OutageLog>,
    /// The edge's probe in flight, and the last outcome with its time.
    probe: tokio::sync::Mutex<Option<(Instant, Result<Duration>)>>,
}

#[derive(Debug, Default)]
struct OutageLog {
    /// When the current outage started.
    since: Option<Instant>,
    /// Failures reported during the current outage.
    failures: u64,
    /// Whether the current outage was logged at `WARN` (its end will be).
    warned: bool,
    /// The last `WARN` of an outage starting.
    last_warn: Option<Instant>,
    /// Outages that started without a `WARN` since the last one.
    unwarned: u64,
}

impl Health {
    /// A request reached the backend and was answered.
    pub(crate) fn succeeded(&self) {
        if !self.down.load(Ordering::Acquire) || !self.down.swap(false, Ordering::AcqRel) {
            return;
        }
        #[cfg(feature = "metrics")]
        metrics::gauge!("lockflight_backend_available").set(1.0);
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let lasted = log.since.take().map(|s| s.elapsed()).unwrap_or_default();
        let failures = std::mem::take(&mut log.failures);
        if std::mem::take(&mut log.warned) {
            tracing::warn!(
                outage = ?lasted,
                failures,
                "lock backend available again"
            );
        } else {
            tracing::debug!(outage = ?lasted, failures, "lock backend available again");
        }
    }

    /// A request did not reach the backend, or got no answer: `error` says how.
    pub(crate) fn failed(&self, error: &Error) {
        #[cfg(feature = "metrics")]
        metrics::counter!("lockflight_backend_errors_total").increment(1);
        let started = !self.down.swap(true, Ordering::AcqRel);
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.failures += 1;
        if !started {
            return;
        }
        #[cfg(feature = "metrics")]
        metrics::gauge!("lockflight_backend_available").set(0.0);
        let now = Instant::now();
        log.since = Some(now);
        let quiet = log
            .last_warn
            .is_some_and(|at| now.saturating_duration_since(at) < WARN_EVERY);
        if quiet {
            log.unwarned += 1;
            log.warned = false;
            tracing::debug!(%error, "lock backend unavailable");
            return;
        }
        let unwarned = std::mem::take(&mut log.unwarned);
        log.last_warn = Some(now);
        log.warned = true;
        tracing::warn!(
            %error,
            unwarned_outages = unwarned,
            "lock backend unavailable: guarded requests answer 503 lock_backend_unavailable \
             until it answers again"
        );
    }
}

/// The backend's health.
impl Locker {
    /// Asks the backend one cheap question and says how long the answer took: for
    /// readiness checks.
    ///
    /// The question is one request that reads a single key and writes nothing (a
    /// renewal of a random token that owns nothing), so it needs no rights beyond
    /// the ones locking needs. Its outcome also feeds the outage state the lock layer
    /// keeps (a `WARN` when the backend becomes unavailable and when it is back, and
    /// with the `metrics` feature the counter `lockflight_backend_errors_total` and
    /// the gauge `lockflight_backend_available`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use std::time::Duration;
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let round_trip = locker.check_backend(Duration::from_millis(500)).await?;
    /// assert!(round_trip < Duration::from_millis(500));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] when the backend does not answer within `within` (or the
    /// request fails: no connection, a dropped connection), or whatever definite
    /// error the backend answers ([`Error::NoPermission`], [`Error::Refused`] from a
    /// read-only replica, [`Error::QuorumNotReached`] from Redlock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the request writes nothing, so dropping the future loses
    /// nothing but its answer (the outage state is not updated).
    pub async fn check_backend(&self, within: Duration) -> Result<Duration> {
        let outcome = self.probe(within).await;
        match &outcome {
            Ok(_) => self.shared.health.succeeded(),
            Err(e) => self.shared.health.failed(e),
        }
        outcome
    }

    async fn probe(&self, within: Duration) -> Result<Duration> {
        let key = probe_key();
        let started = Instant::now();
        let ask =
            self.shared
                .engine
                .backend
                .renew(&key, LeaseToken::random(), Duration::from_secs(1));
        match tokio::time::timeout(within, ask).await {
            Ok(Ok(_)) => Ok(started.elapsed()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::backend(
                &key,
                Phase::Acquiring,
                format!("health probe: no answer within {within:?}"),
            )),
        }
    }

    /// Whether the backend answers, for the edge: one probe per locker at a time,
    /// its outcome reused for [`PROBE_FRESH`]. `Err` is the probe's error.
    ///
    /// Cancel safe: a dropped caller releases the probe slot, and the next caller
    /// probes again.
    pub(crate) async fn backend_answers(&self) -> Result<()> {
        let mut last = self.shared.health.probe.lock().await;
        if let Some((at, outcome)) = last.as_ref()
            && at.elapsed() < PROBE_FRESH
        {
            return outcome.as_ref().map(drop).map_err(Clone::clone);
        }
        let outcome = self.check_backend(EDGE_PROBE_WITHIN).await;
        let answer = outcome.as_ref().map(drop).map_err(Clone::clone);
        *last = Some((Instant::now(), outcome));
        answer
    }

    /// The outage state the edge keeps.
    pub(crate) fn health(&self) -> &Health {
        &self.shared.health
    }
}
