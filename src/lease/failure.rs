//! The one classification of the errors that answer a lease request, shared by
//! the acquire loop ([`acquire`](super::acquire)) and the release job
//! ([`release`](super::release)).

use crate::error::{Class, Error};

/// What an error answering an acquire means for its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request may or may not have landed (I/O, a timeout, a quorum not
    /// reached): ask again with the same token, which the backend recognises as
    /// its own; until a definite answer the token stays armed for the cleanup.
    Retry,
    /// The server refused at once (out of memory, a read-only replica, too few
    /// replica acknowledgements, an ACL refusal): give up, but a partly run script
    /// (or an unacknowledged grant) may have written, so the token is released by
    /// the cleanup.
    Refused,
    /// A definite answer with nothing written (a foreign value, bad input, a
    /// mismatched semaphore): give up; there is nothing to clean up, because every
    /// script reads what can fail before it writes.
    Definite,
}

impl Failure {
    /// The one classification every kind's acquire loop uses. Too few replica
    /// acknowledgements (`NOREPLICAS`) is asked again like an indeterminate error:
    /// the grant was written, unacknowledged, and a replica that catches up within
    /// the caller's wait acknowledges the re-grant.
    pub(crate) fn of(e: &Error) -> Failure {
        match e.class() {
            Class::Indeterminate | Class::NoQuorum | Class::Unacknowledged => Failure::Retry,
            Class::Refused => Failure::Refused,
            Class::Contended | Class::Lost | Class::Definite => Failure::Definite,
        }
    }

    /// Whether `e` says that too few nodes answered (a quorum not reached, too few
    /// replica acknowledgements): retried by a waiting acquire, reported at once by
    /// a single attempt (`try_*`).
    pub(crate) fn unavailable(e: &Error) -> bool {
        matches!(e.class(), Class::NoQuorum | Class::Unacknowledged)
    }

    /// Whether the token may hold something at the backend after this error.
    pub(crate) fn may_have_written(self) -> bool {
        self != Failure::Definite
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::key::LockKey;

    #[test]
    fn one_classification_of_acquire_errors() {
        let key = LockKey::from("k");
        let io = Error::backend(&key, crate::error::Phase::Acquiring, "reset");
        assert_eq!(Failure::of(&io), Failure::Retry);
        let refused = Error::Refused {
            key: key.clone(),
            phase: crate::error::Phase::Acquiring,
            code: "OOM".into(),
            source: Arc::new(std::io::Error::other("oom")),
        };
        assert_eq!(Failure::of(&refused), Failure::Refused);
        assert!(Failure::of(&refused).may_have_written());
        let unacknowledged = Error::Refused {
            key: key.clone(),
            phase: crate::error::Phase::Acquiring,
            code: "NOREPLICAS".into(),
            source: Arc::new(std::io::Error::other("too few replicas")),
        };
        assert_eq!(Failure::of(&unacknowledged), Failure::Retry);
        assert!(Failure::unavailable(&unacknowledged));
        let bad = key_error();
        assert_eq!(Failure::of(&bad), Failure::Definite);
        assert!(!Failure::of(&bad).may_have_written());
    }

    fn key_error() -> Error {
        LockKey::from("").validate().unwrap_err()
    }
}
