//! What an election tells the operator: tracing events and, with the `metrics`
//! feature, per election key (elections are few; their keys are labels):
//! `lockflight_leader` (1 while this process leads), `lockflight_leader_terms_total`
//! (terms this process won), `lockflight_elect_seconds` (from a campaign's start
//! to its leadership) and `lockflight_leader_changes_total` (new leaders an
//! `Election::observe` of this process saw after its first read).

use std::time::Duration;

use super::LeaderInfo;
use crate::key::LockKey;
use crate::lease::FencingToken;

pub(super) fn gained(key: &LockKey, info: &LeaderInfo, waited: Duration) {
    tracing::info!(
        %key,
        identity = %info.identity,
        term = %info.term,
        waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        "leadership gained"
    );
    #[cfg(feature = "metrics")]
    {
        let label = key.to_string();
        metrics::gauge!("lockflight_leader", "election" => label.clone()).set(1.0);
        metrics::counter!("lockflight_leader_terms_total", "election" => label.clone())
            .increment(1);
        metrics::histogram!("lockflight_elect_seconds", "election" => label)
            .record(waited.as_secs_f64());
    }
}

/// The lease was lost while leading (`cause`: its loss reason).
pub(super) fn lost(key: &LockKey, identity: &str, term: FencingToken, cause: &str) {
    tracing::warn!(%key, %identity, %term, %cause, "leadership lost");
    not_leading(key);
}

/// Given up: `how` is "resigned" or "dropped".
pub(super) fn ended(key: &LockKey, info: &LeaderInfo, how: &'static str) {
    tracing::info!(%key, identity = %info.identity, term = %info.term, how, "leadership given up");
    not_leading(key);
}

/// An observer saw a new leader (a new term) after its first read.
pub(super) fn leader_changed(_key: &LockKey) {
    #[cfg(feature = "metrics")]
    metrics::counter!("lockflight_leader_changes_total", "election" => _key.to_string())
        .increment(1);
}

fn not_leading(_key: &LockKey) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("lockflight_leader", "election" => _key.to_string()).set(0.0);
}
