use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project::pin_project;

use tower::BoxError;

/// The body of a [`SharedResponseService`](super::SharedResponseService) response: a shared,
/// buffered copy, or the inner service's own body.
#[pin_project(project = SharedBodyProj)]
#[derive(Debug)]
pub enum SharedBody<B> {
    /// A copy of the shared response's body.
    Shared(#[pin] Full<Bytes>),
    /// The inner service's body, untouched.
    Original(#[pin] B),
}

impl<B> Body for SharedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            SharedBodyProj::Shared(b) => b.poll_frame(cx).map_err(|never| match never {}),
            SharedBodyProj::Original(b) => b.poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SharedBody::Shared(b) => b.is_end_stream(),
            SharedBody::Original(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SharedBody::Shared(b) => b.size_hint(),
            SharedBody::Original(b) => b.size_hint(),
        }
    }
}
