//! The errors of the routing module.

use std::fmt;

/// Why a routing operation failed.
///
/// [`KeyRouter`](super::KeyRouter) returns these boxed in a
/// [`tower::BoxError`]; recover them with `err.downcast_ref::<RoutingError>()`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RoutingError {
    /// A node weight was zero, negative, infinite or NaN. Weights must be finite and
    /// greater than zero.
    InvalidWeight(f64),
    /// A bounded-load factor `c` was not a finite number greater than 1.
    InvalidLoadFactor(f64),
    /// The request had no key and the router rejects keyless requests
    /// (see [`KeyRouter::reject_keyless`](super::KeyRouter::reject_keyless)).
    NoKey,
    /// There was no member to route to: none was added, or every member is down.
    NoMembers,
}

impl fmt::Display for RoutingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoutingError::InvalidWeight(w) => write!(
                f,
                "invalid node weight {w}: weights must be finite and greater than zero"
            ),
            RoutingError::InvalidLoadFactor(c) => write!(
                f,
                "invalid bounded-load factor {c}: it must be finite and greater than 1"
            ),
            RoutingError::NoKey => f.write_str("the request has no routing key"),
            RoutingError::NoMembers => f.write_str("no routing member is available"),
        }
    }
}

impl std::error::Error for RoutingError {}
