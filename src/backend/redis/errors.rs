//! How Redis errors become lockflight errors.

use std::fmt;
use std::sync::Arc;

use redis::{ErrorKind, RedisError, Value};

use crate::error::{Error, Phase};
use crate::key::LockKey;

/// A failed `connect` check: what was checked, and the server's answer.
#[derive(Debug)]
pub(super) struct CheckFailed {
    pub(super) check: String,
    pub(super) source: RedisError,
}

impl fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.source)
    }
}

impl std::error::Error for CheckFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A wrong or missing password: the handshake's `AUTH` failed, or a command was
/// answered `NOAUTH` / `WRONGPASS`.
pub(super) fn is_auth_failure(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

/// `Error::Connect` for a failure while `doing` something at connect time; an
/// authentication failure says so (the password is never part of the message).
pub(super) fn connect_error(target: &str, doing: &str, e: RedisError) -> Error {
    let check = if is_auth_failure(&e) {
        format!("authentication failed ({doing})")
    } else {
        doing.to_owned()
    };
    Error::Connect {
        target: target.to_owned(),
        source: Arc::new(CheckFailed { check, source: e }),
    }
}

/// Which [`Error`] a Redis error maps to; see [`map_err`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Mapping {
    /// The ACL refused a command, a key or a channel.
    NoPermission,
    /// `WRONGTYPE`: a value lockflight did not write.
    Foreign,
    /// A refusal that retrying at once will not change, with the server's code.
    Refused(String),
    /// I/O, a timeout, a dropped connection, a server loading, busy or failing over.
    Transient,
}

pub(super) fn mapping(e: &RedisError) -> Mapping {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return Mapping::Transient;
    }
    if e.kind() == ErrorKind::AuthenticationFailed {
        // A reconnection whose AUTH was refused (the password changed).
        return Mapping::Refused("WRONGPASS".into());
    }
    match e.code() {
        Some("NOPERM") => Mapping::NoPermission,
        // Redis 7.0 answers an ACL refusal inside a script with ERR, and so does
        // Valkey 9.1 ("ACL failure in script: User … has no permissions to run …").
        Some("ERR")
            if e.detail().is_some_and(|d| {
                d.starts_with("The user executing the script can't")
                    || d.starts_with("ACL failure in script")
            }) =>
        {
            Mapping::NoPermission
        }
        Some("WRONGTYPE") => Mapping::Foreign,
        // A cluster in flux: a redirect still unresolved after the cluster client's
        // retries (a failover or a migration in progress) is retried by the caller.
        Some("LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "MOVED" | "ASK") => {
            Mapping::Transient
        }
        Some(code) => Mapping::Refused(code.to_owned()),
        // Client-side: a protocol error (the connection is replaced), a lost reply.
        None => Mapping::Transient,
    }
}

/// The error of a failed lock operation: `NOPERM` → [`Error::NoPermission`];
/// `WRONGTYPE` → [`Error::ForeignValue`]; `OOM`, `READONLY`, `NOSCRIPT` (after the
/// reload), `ERR` (a script error), `MISCONF`, `NOAUTH`, `WRONGPASS` and other server
/// refusals → [`Error::Refused`]; I/O, timeouts, dropped connections, `LOADING`,
/// `BUSY`, `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`, `MOVED`, `ASK` →
/// [`Error::Backend`] (transient).
pub(crate) fn map_err(key: &LockKey, phase: Phase, e: RedisError) -> Error {
    let key = key.clone();
    match mapping(&e) {
        Mapping::NoPermission => Error::NoPermission {
            key,
            phase,
            source: Arc::new(e),
        },
        Mapping::Foreign => Error::ForeignValue {
            key,
            phase,
            // Without the script's location that Redis appends.
            detail: e
                .detail()
                .and_then(|d| d.split(" script: ").next())
                .unwrap_or("a value of another type")
                .to_owned(),
        },
        Mapping::Refused(code) => Error::Refused {
            key,
            phase,
            code,
            source: Arc::new(e),
        },
        Mapping::Transient => Error::Backend {
            key,
            phase,
            source: Arc::new(e),
        },
    }
}

pub(super) fn warn_refused_publish(key: &LockKey, operation: &str, error: &str) {
    tracing::warn!(
        %key,
        error,
        "{operation}: the server refused the wake-up PUBLISH; the next instance was not woken and falls back to its timer"
    );
}

pub(super) fn unexpected(key: &LockKey, phase: Phase, reply: &Value) -> Error {
    Error::backend(key, phase, format!("unexpected script reply {reply:?}"))
}
