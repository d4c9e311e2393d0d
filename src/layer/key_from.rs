//! [`KeyFrom`]: where in an HTTP request the lock key is.

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
pub struct KeyFrom(Place);

#[derive(Clone, Debug)]
enum Place {
    Header(http::HeaderName),
    Segment(usize),
    #[cfg(feature = "axum")]
    Param(super::axum::PathParam),
}

impl KeyFrom {
    /// The raw bytes of the header `name`.
    pub fn header(name: http::HeaderName) -> Self {
        KeyFrom(Place::Header(name))
    }

    /// Segment number `index` of the URI path (0-based after the leading `/`:
    /// `/items/{sku}` has `sku` at 1), as it appears in the URI (percent-encoded).
    pub fn path_segment(index: usize) -> Self {
        KeyFrom(Place::Segment(index))
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
        KeyFrom(Place::Param(super::axum::PathParam::new(name)))
    }
}

impl<B> KeyExtractor<http::Request<B>> for KeyFrom {
    /// As [`extract_key`](KeyExtractor::extract_key), without the reason (for a
    /// path parameter, through a copy of the request's extensions).
    fn extract(&self, req: &http::Request<B>) -> Option<LockKey> {
        match &self.0 {
            Place::Header(name) => req.headers().get(name).map(|v| LockKey::from(v.as_bytes())),
            Place::Segment(index) => req
                .uri()
                .path()
                .trim_start_matches('/')
                .split('/')
                .nth(*index)
                .filter(|s| !s.is_empty())
                .map(LockKey::from),
            #[cfg(feature = "axum")]
            Place::Param(param) => param.value_in(&mut req.extensions().clone()).ok(),
        }
    }

    fn extract_key(&self, req: &mut http::Request<B>) -> Result<LockKey, NoKey> {
        match &self.0 {
            Place::Header(name) => self
                .extract(req)
                .ok_or_else(|| NoKey::client(format!("no `{name}` header"))),
            Place::Segment(index) => self
                .extract(req)
                .ok_or_else(|| NoKey::client(format!("the path has no segment {index}"))),
            #[cfg(feature = "axum")]
            Place::Param(param) => param.value_in(req.extensions_mut()),
        }
    }
}
