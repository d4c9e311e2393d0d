//! [`SharedResponseLayer`]: concurrent identical reads share one response.
//!
//! [`SharedResponseLayer`] applies [`SharedResponseService`], whose response
//! future is [`future::ResponseFuture`]; `lockflight::layer` re-exports the layer
//! and the service.

pub mod future;
mod layer;
mod service;

pub use self::layer::SharedResponseLayer;
pub use self::service::SharedResponseService;
