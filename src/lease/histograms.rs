//! The histograms documented on [`Stats`](crate::stats::Stats), through the
//! `metrics` facade (feature `metrics`); no-ops without the feature.

use std::time::Duration;

use super::LeaseKind;

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

/// A call was granted a lease of `kind` after waiting `d`.
pub(crate) fn wait(kind: LeaseKind, d: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lockflight_wait_seconds", "kind" => label(kind)).record(d.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, d);
}

/// A holder held a lease of `kind` for `d`.
pub(crate) fn hold(kind: LeaseKind, d: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lockflight_hold_seconds", "kind" => label(kind)).record(d.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, d);
}

/// A lease of `kind` was renewed `n` times before its final release.
pub(crate) fn renewals(kind: LeaseKind, n: u32) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lockflight_lease_renewals", "kind" => label(kind)).record(f64::from(n));
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, n);
}
