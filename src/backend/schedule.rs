//! The release schedule every lock kind follows, and what it asks of a backend;
//! the renewal watchdog's scan interval ([`tick`]).
//!
//! A release whose outcome is unknown (an I/O error, a reply that did not come
//! back in time: [`Error::is_indeterminate`](crate::Error)) is sent again with the
//! same token, at most [`RELEASE_ATTEMPTS`] times in all, each after a pause of
//! [`RELEASE_BACKOFF`] × the attempts so far, and never later than
//! [`RELEASE_WINDOW`] after the first attempt was sent (a release re-run in the
//! background after its caller dropped it continues the same schedule).
//!
//! A repeated release must report what the *first* attempt did. A backend whose
//! replies can be lost therefore records each release it performs, per lease (a
//! record per token, so what other instances do with the key meanwhile cannot
//! hide it), and keeps the record at least [`release_record_ttl`] of its longest
//! request: long enough for every attempt the schedule may still send, sent
//! within the window and applied within one request bound after it, plus a
//! margin for a request that lingers on the wire.

use std::time::Duration;

/// How many times one release is sent at most.
pub(crate) const RELEASE_ATTEMPTS: u32 = 3;

/// The pause before the n-th repetition of a release is n × this.
pub(crate) const RELEASE_BACKOFF: Duration = Duration::from_millis(20);

/// No repetition of a release is sent later than this after its first attempt.
pub(crate) const RELEASE_WINDOW: Duration = Duration::from_secs(5);

/// What a release record outlives the last possible attempt by: a request that
/// the server applies after the client gave up waiting for it.
const RECORD_MARGIN: Duration = Duration::from_secs(1);

/// How long a backend keeps the record of a release, when one of its requests
/// takes at most `request_bound` from being sent to being answered or abandoned.
pub(crate) fn release_record_ttl(request_bound: Duration) -> Duration {
    RELEASE_WINDOW + request_bound + RECORD_MARGIN
}

/// The scan interval for a renewal interval of `every`: a renewal starts at most
/// this late. [`LockerBuilder::build`](crate::LockerBuilder::build) requires
/// `every + tick(every)` to leave half of the lease's validity for the renewal's
/// round trip and retries.
pub(crate) fn tick(every: Duration) -> Duration {
    (every / 4).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_outlives_every_attempt_the_schedule_sends() {
        // Worst case: every attempt takes the full request bound, and the last
        // one is sent at the end of the window; it is applied within its bound.
        for bound in [Duration::from_millis(50), Duration::from_secs(2)] {
            let mut sent_at = Duration::ZERO;
            let mut last = Duration::ZERO;
            for n in 1..RELEASE_ATTEMPTS {
                sent_at += bound + RELEASE_BACKOFF * n;
                if sent_at > RELEASE_WINDOW {
                    break;
                }
                last = sent_at;
            }
            assert!(last + bound < release_record_ttl(bound));
            assert!(RELEASE_WINDOW + bound < release_record_ttl(bound));
        }
    }
}
