//! An inner service's error, shared by every caller of a flight
//! ([`SharedResponseLayer`](super::SharedResponseLayer),
//! [`IdempotencyLayer`](super::IdempotencyLayer)).

use std::fmt;
use std::sync::Arc;

/// One error given to every caller of a flight: each gets this, whose
/// `Display`, `Debug` and `source` are the inner error's.
#[derive(Clone)]
pub(crate) struct SharedError(pub(crate) Arc<dyn std::error::Error + Send + Sync>);

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
