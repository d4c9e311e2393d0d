//! The histograms documented on [`Stats`](crate::stats::Stats), through the
//! `metrics` facade (feature `metrics`); no-ops without the feature, which then
//! read no clock either: the wait and hold times are taken here, from the
//! instants the callers pass, and a guard's grant time is a [`Since`] that is
//! empty without the feature.

use tokio::time::Instant;

use super::LeaseKind;

/// When a hold began, for [`hold`]: the time of the grant with the `metrics`
/// feature, nothing without it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Since {
    #[cfg(feature = "metrics")]
    at: Instant,
}

impl Since {
    /// Now (the clock is read only with the `metrics` feature).
    pub(crate) fn now() -> Since {
        Since {
            #[cfg(feature = "metrics")]
            at: Instant::now(),
        }
    }
}

/// The `kind` label: what was held (four values, so the cardinality stays
/// bounded).
#[cfg(feature = "metrics")]
fn label(kind: LeaseKind) -> &'static str {
    match kind {
        LeaseKind::Mutex => "lock",
        LeaseKind::Read => "read",
        LeaseKind::Write => "write",
        LeaseKind::Permit => "permit",
    }
}

/// A call that asked at `asked` was granted a lease of `kind` now.
pub(crate) fn wait(kind: LeaseKind, asked: Instant) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lockflight_wait_seconds", "kind" => label(kind))
        .record(asked.elapsed().as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, asked);
}

/// A holder that was granted a lease of `kind` at `granted` gives it up now.
pub(crate) fn hold(kind: LeaseKind, granted: Since) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lockflight_hold_seconds", "kind" => label(kind))
        .record(granted.at.elapsed().as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, granted);
}

/// A lease of `kind` was renewed `n` times before its final release.
pub(crate) fn renewals(kind: LeaseKind, n: u32) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lockflight_lease_renewals", "kind" => label(kind)).record(f64::from(n));
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, n);
}
