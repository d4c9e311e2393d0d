//! What the idempotency layer keeps of a request and a response: the request's
//! [`Fingerprint`] and the [`Stored`] response, with the bytes a backend keeps
//! for it (`encode`/`decode`).
//!
//! # Encoding
//!
//! Version byte `1`, the fingerprint (32 bytes), the status (u16, big-endian),
//! the number of headers (u16), each header as its name's length (u16), the
//! name, its value's length (u32) and the value; then the body, to the end. A
//! record that does not decode is refused as a foreign value, never replayed.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};

use crate::error::{Error, Phase};
use crate::key::LockKey;

/// The encoding's version byte.
const VERSION: u8 = 1;

/// SHA-256 of a request's method, path (with its query) and body: two requests
/// with one idempotency key are the same request when their fingerprints are
/// equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a request. Each part is prefixed by its length, so no
    /// two different triples hash the same bytes.
    pub(super) fn of(method: &http::Method, path: &str, body: &[u8]) -> Fingerprint {
        let mut hash = Sha256::new();
        for part in [method.as_str().as_bytes(), path.as_bytes(), body] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        Fingerprint(hash.finalize().into())
    }
}

/// A response as the layer shares it in the process and stores it: status,
/// headers and the whole body, with the fingerprint of the request that made it.
#[derive(Clone, Debug)]
pub(super) struct Stored {
    pub(super) fingerprint: Fingerprint,
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
}

impl Stored {
    /// The bytes a backend stores: only the headers named in `keep` (every value
    /// of each), in the order of `keep`.
    pub(super) fn encode(&self, keep: &[HeaderName]) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.body.len());
        out.push(VERSION);
        out.extend_from_slice(&self.fingerprint.0);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        let headers: Vec<(&HeaderName, &HeaderValue)> = keep
            .iter()
            .flat_map(|name| self.headers.get_all(name).iter().map(move |v| (name, v)))
            .take(usize::from(u16::MAX))
            .collect();
        out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
        for (name, value) in headers {
            let name = name.as_str().as_bytes();
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&self.body);
        out
    }

    /// The response `bytes` encode; a foreign value for `key` when they do not
    /// decode.
    pub(super) fn decode(key: &LockKey, bytes: Vec<u8>) -> Result<Stored, Error> {
        let foreign = |detail: &str| Error::ForeignValue {
            key: key.clone(),
            phase: Phase::Acquiring,
            detail: format!("the idempotency record does not decode: {detail}"),
        };
        let mut r = Reader {
            bytes: &bytes,
            at: 0,
        };
        if r.take(1).ok_or_else(|| foreign("empty"))? != [VERSION] {
            return Err(foreign("unknown version"));
        }
        let short = || foreign("too short");
        let fingerprint = Fingerprint(
            r.take(32)
                .ok_or_else(short)?
                .try_into()
                .map_err(|_| short())?,
        );
        let status = StatusCode::from_u16(r.u16().ok_or_else(short)?)
            .map_err(|_| foreign("not a status"))?;
        let mut headers = HeaderMap::new();
        for _ in 0..r.u16().ok_or_else(short)? {
            let n = usize::from(r.u16().ok_or_else(short)?);
            let name = HeaderName::from_bytes(r.take(n).ok_or_else(short)?)
                .map_err(|_| foreign("not a header name"))?;
            let n = r.u32().ok_or_else(short)? as usize;
            let value = HeaderValue::from_bytes(r.take(n).ok_or_else(short)?)
                .map_err(|_| foreign("not a header value"))?;
            headers.append(name, value);
        }
        let at = r.at;
        let body = Bytes::from(bytes).slice(at..);
        Ok(Stored {
            fingerprint,
            status,
            headers,
            body,
        })
    }
}

/// A cursor over a record's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_response_decodes_to_itself_with_the_kept_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert("date", HeaderValue::from_static("today"));
        let stored = Stored {
            fingerprint: Fingerprint::of(&http::Method::POST, "/pay?x=1", b"{}"),
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(b"{\"id\":7}"),
        };
        let keep = [
            HeaderName::from_static("content-type"),
            HeaderName::from_static("set-cookie"),
        ];
        let key = LockKey::from("k");
        let back = Stored::decode(&key, stored.encode(&keep)).unwrap();
        assert_eq!(back.fingerprint, stored.fingerprint);
        assert_eq!(back.status, StatusCode::CREATED);
        assert_eq!(back.body, stored.body);
        assert_eq!(back.headers.len(), 3);
        assert_eq!(back.headers.get_all("set-cookie").iter().count(), 2);
        assert!(back.headers.get("date").is_none(), "only the kept headers");
        let bytes = stored.encode(&keep);
        for cut in [0, 1, 20, 36, 40] {
            assert!(
                Stored::decode(&key, bytes[..cut].to_vec()).is_err(),
                "{cut}"
            );
        }
    }

    #[test]
    fn fingerprints_differ_by_each_part() {
        let base = Fingerprint::of(&http::Method::POST, "/a", b"x");
        assert_eq!(base, Fingerprint::of(&http::Method::POST, "/a", b"x"));
        assert_ne!(base, Fingerprint::of(&http::Method::PUT, "/a", b"x"));
        assert_ne!(base, Fingerprint::of(&http::Method::POST, "/b", b"x"));
        assert_ne!(base, Fingerprint::of(&http::Method::POST, "/a", b"y"));
        // Lengths keep the parts apart: moving a byte across a boundary differs.
        assert_ne!(
            Fingerprint::of(&http::Method::POST, "/ax", b""),
            Fingerprint::of(&http::Method::POST, "/a", b"x")
        );
    }
}
