//! [`KeyFrom`]: where in an HTTP request the lock key is.

#[cfg(feature = "axum")]
use axum::extract::FromRequestParts;
#[cfg(feature = "axum")]
use futures::FutureExt;

use crate::key::{KeyExtractor, LockKey, NoKey};

/// Where in an HTTP request the lock key is: a header, a path segment, or (feature
/// `axum`) a parameter of the matched route. A request without it has no key
/// ([`NoKey`]): the layers refuse it unless told to run it unlocked.
///
/// ```
/// use lockflight::LockKey;
/// use lockflight::layer::{KeyExtractor, KeyFrom};
///
/// let req = http::Request::builder()
///     .uri("/items/555/reserve")
///     .header("x-sku", "777")
///     .body(())
///     .unwrap();
/// let header = KeyFrom::header(http::HeaderName::from_static("x-sku"));
/// assert_eq!(header.extract(&req), Some(LockKey::from("777")));
/// assert_eq!(KeyFrom::path_segment(1).extract(&req), Some(LockKey::from("555")));
/// assert_eq!(KeyFrom::path_segment(7).extract(&req), None);
/// ```
#[derive(Clone, Debug)]
pub struct KeyFrom(Source);

#[derive(Clone, Debug)]
enum Source {
    Header(http::HeaderName),
    Segment(usize),
    #[cfg(feature = "axum")]
    Param(PathParam),
}

impl KeyFrom {
    /// The raw bytes of the header `name`.
    pub fn header(name: http::HeaderName) -> Self {
        KeyFrom(Source::Header(name))
    }

    /// Segment number `index` of the URI path (0-based after the leading `/`:
    /// `/items/{sku}` has `sku` at 1), as it appears in the URI (percent-encoded).
    pub fn path_segment(index: usize) -> Self {
        KeyFrom(Source::Segment(index))
    }

    /// The parameter `name` (`{name}` or `{*name}`) of the matched axum route,
    /// percent-decoded, as the handler's `Path` sees it (feature `axum`): right
    /// under `Router::nest` and in wildcards, and one key however the client
    /// spells the resource (`/accounts/alice` and `/accounts/%61lice` lock `alice`).
    ///
    /// The parameters exist once the router has matched a route: install the
    /// layer with `Router::route_layer`. Without them, or without the parameter,
    /// the route cannot yield a key ([`NoKey::route`], `500 invalid_config`); a
    /// value that is not UTF-8 once decoded is the client's fault
    /// ([`NoKey::client`], `400 invalid_key`).
    ///
    /// ```
    /// use lockflight::layer::{KeyExtractor, KeyFrom};
    ///
    /// let sku = KeyFrom::path_param("sku");
    /// // Outside a router there are no path parameters, hence no key.
    /// let mut req = http::Request::builder().uri("/items/555").body(()).unwrap();
    /// assert_eq!(sku.extract(&req), None);
    /// assert!(!sku.extract_key(&mut req).unwrap_err().is_client_error());
    /// ```
    #[cfg(feature = "axum")]
    pub fn path_param(name: &str) -> Self {
        KeyFrom(Source::Param(PathParam::new(name)))
    }
}

impl<B> KeyExtractor<http::Request<B>> for KeyFrom {
    /// As [`extract_key`](KeyExtractor::extract_key), without the reason (for a
    /// path parameter, through a copy of the request's extensions).
    fn extract(&self, req: &http::Request<B>) -> Option<LockKey> {
        match &self.0 {
            Source::Header(name) => req.headers().get(name).map(|v| LockKey::from(v.as_bytes())),
            Source::Segment(index) => req
                .uri()
                .path()
                .trim_start_matches('/')
                .split('/')
                .nth(*index)
                .filter(|s| !s.is_empty())
                .map(LockKey::from),
            #[cfg(feature = "axum")]
            Source::Param(param) => param.value_in(&mut req.extensions().clone()).ok(),
        }
    }

    fn extract_key(&self, req: &mut http::Request<B>) -> Result<LockKey, NoKey> {
        match &self.0 {
            Source::Header(name) => self
                .extract(req)
                .ok_or_else(|| NoKey::client(format!("no `{name}` header"))),
            Source::Segment(index) => self
                .extract(req)
                .ok_or_else(|| NoKey::client(format!("the path has no segment {index}"))),
            #[cfg(feature = "axum")]
            Source::Param(param) => param.value_in(req.extensions_mut()),
        }
    }
}

/// The key in a named parameter of the matched axum route (see
/// [`KeyFrom::path_param`]).
#[cfg(feature = "axum")]
#[derive(Clone, Debug)]
struct PathParam {
    name: String,
}

#[cfg(feature = "axum")]
impl PathParam {
    fn new(name: &str) -> Self {
        PathParam {
            name: name.to_owned(),
        }
    }

    /// The parameter's value from the router's parameters in `extensions`.
    fn value_in(&self, extensions: &mut http::Extensions) -> Result<LockKey, NoKey> {
        let mut parts = http::Request::new(()).into_parts().0;
        std::mem::swap(&mut parts.extensions, extensions);
        let params =
            axum::extract::RawPathParams::from_request_parts(&mut parts, &()).now_or_never();
        std::mem::swap(&mut parts.extensions, extensions);
        let params = match params {
            Some(Ok(params)) => params,
            Some(Err(
                axum::extract::rejection::RawPathParamsRejection::InvalidUtf8InPathParam(_),
            )) => {
                return Err(NoKey::client(format!(
                    "a path parameter is not UTF-8 once percent-decoded (the key is `{}`)",
                    self.name
                )));
            }
            _ => {
                return Err(NoKey::route(format!(
                    "no path parameters: the router has not matched a route yet \
                     (install the lock layer on the routes with Router::route_layer, not around \
                     the router) and the key is path parameter `{}`",
                    self.name
                )));
            }
        };
        let found = params.iter().find(|(name, _)| *name == self.name);
        match found {
            Some((_, value)) => Ok(LockKey::from(value)),
            None => {
                let names: Vec<&str> = params.iter().map(|(name, _)| name).collect();
                Err(NoKey::route(if names.is_empty() {
                    format!(
                        "the route has no path parameter `{}` (it has none: is the lock \
                         layer around a router instead of on its routes, with \
                         Router::route_layer?)",
                        self.name
                    )
                } else {
                    format!(
                        "the route has no path parameter `{}` (it has: {})",
                        self.name,
                        names.join(", ")
                    )
                }))
            }
        }
    }
}
