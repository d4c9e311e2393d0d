//! The HTTP side of the layers: where a request's key is ([`KeyFrom`]), the
//! lock's info in an `http::Request`, and with the feature `axum` the problem
//! responses ([`Problem`], [`handle_error`], the layers' `handle_errors()`) and the
//! [`Locked`] extractor.
//!
//! It imports the layers and the service's lower pieces (the request trait, the
//! ticket, the edge's acquire); the service reaches it only through the
//! `WithLockInfo` trait, defined below the service.

#[cfg(feature = "axum")]
mod axum;
mod key_from;
#[cfg(feature = "axum")]
mod locked;
#[cfg(feature = "axum")]
mod problem;
mod request;

#[cfg(feature = "axum")]
pub use self::axum::handle_error;
#[cfg(feature = "axum")]
pub(crate) use self::axum::{ErrorHandler, error_handler};
pub use key_from::KeyFrom;
#[cfg(feature = "axum")]
pub use locked::Locked;
#[cfg(feature = "axum")]
pub use problem::{PROBLEM_JSON, Problem};
