//! What the lock layer needs of a request: a place for its [`LockInfo`], a name
//! for its route in logs, and (for the in-handler mode) its HTTP extensions.
//!
//! The trait is defined here, below the service that uses it; its implementation
//! for `http::Request` is on the HTTP side (`http/request.rs`).

use crate::guard::LockInfo;

/// A request that can carry the [`LockInfo`] of the lock it runs under:
/// `http::Request<B>` (the info goes into its extensions). Public but unnameable
/// outside the crate: the layers serve HTTP requests.
pub trait WithLockInfo {
    /// Attaches `info` to the request.
    fn set_lock_info(&mut self, info: LockInfo);

    /// Names the request's route in logs (never its data): for HTTP the method and
    /// the matched route template (`POST /accounts/{id}/debit`), or the path where
    /// no router has matched one. The default says only "a request".
    fn route(&self) -> String {
        "a request".to_owned()
    }

    /// The request's HTTP extensions, where
    /// [`LockLayer::lock_in_handler`](super::LockLayer::lock_in_handler) leaves what
    /// the handler's [`Locked`](super::Locked) extractor needs to take the lock. The
    /// default has none, and then the in-handler mode refuses every request.
    fn http_extensions(&mut self) -> Option<&mut http::Extensions> {
        None
    }
}
