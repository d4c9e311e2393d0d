//! The one error type of lockflight.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::key::LockKey;

/// What a lock operation was doing when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Waiting in this process's local queue behind another task.
    WaitingLocally,
    /// Talking to the backend to acquire the lock (or waiting for its wake-up).
    Acquiring,
    /// Renewing a held lease.
    Renewing,
    /// Releasing a held lease.
    Releasing,
    /// Writing to a resource under a fencing token ([`fence`](crate::fence)).
    Writing,
    /// Reading a key's lock state, or force-releasing it (the `inspect` module,
    /// feature `inspect`).
    Inspecting,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::WaitingLocally => "waiting locally",
            Phase::Acquiring => "acquiring",
            Phase::Renewing => "renewing",
            Phase::Releasing => "releasing",
            Phase::Writing => "writing",
            Phase::Inspecting => "inspecting",
        })
    }
}

/// A boxed, cloneable error source (errors are shared by the callers of one flight).
pub(crate) type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in lockflight.
///
/// Every variant that concerns a lock names its key and, where it matters, the
/// [`Phase`]. The enum is `Clone` because the callers of one singleflight share one outcome.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not obtained within the wait timeout.
    ///
    /// When attempts during the wait failed rather than found the lock busy (too
    /// few replica acknowledgements, a quorum not reached, the backend not
    /// answering), `last_error` keeps the last such failure, so a wait that ran
    /// out because of a refusal says so (it is also the error's `source()`).
    #[error(
        "lock {key}: timed out after {waited:?} while {phase}{}",
        after(last_error)
    )]
    Timeout {
        /// The lock key.
        key: LockKey,
        /// Where the time ran out.
        phase: Phase,
        /// How long the caller waited.
        waited: Duration,
        /// The last failed attempt of the wait, if any attempt failed.
        #[source]
        last_error: Option<Box<Error>>,
    },
    /// The lease was lost (expired, taken over, or deleted) while it was held or
    /// being released; the guarded work must be assumed to have run unprotected.
    #[error("lock {key}: lease lost while {phase}: {reason}")]
    LeaseLost {
        /// The lock key.
        key: LockKey,
        /// Where the loss was noticed.
        phase: Phase,
        /// Why the lease is considered lost.
        reason: String,
    },
    /// The lock is held and the call asked not to wait
    /// ([`LockOptions::try_only`](crate::LockOptions::try_only)).
    #[error("lock {key}: busy, and the call does not wait")]
    Busy {
        /// The lock key.
        key: LockKey,
    },
    /// Too many tasks are already waiting locally for this key.
    #[error("lock {key}: overloaded, {waiters} tasks already wait locally (max_waiters)")]
    Overloaded {
        /// The lock key.
        key: LockKey,
        /// The configured bound that was reached.
        waiters: usize,
    },
    /// The running future already holds this lock (it runs inside
    /// [`Locker::with_lock`](crate::Locker::with_lock) or behind the lock layer for
    /// the same key): asking again would wait behind itself. Answered at once.
    #[error(
        "lock {key}: already held by the running future (inside with_lock or the lock layer); locking it again would wait behind itself"
    )]
    Reentrant {
        /// The lock key.
        key: LockKey,
    },
    /// The backend does not store this kind of lock (a read-write lock or a
    /// semaphore on a backend without them). Answered at once.
    #[error("lock {key}: the backend has no {what}")]
    Unsupported {
        /// The lock key.
        key: LockKey,
        /// The lock kind the backend lacks (`"read-write locks"`, `"semaphores"`).
        what: &'static str,
    },
    /// A semaphore was asked for with a number of permits other than the one fixed
    /// for its key at first use, which holds while any permit or waiter of the key
    /// lives ([`Semaphore`](crate::semaphore::Semaphore)). Answered at once, with
    /// nothing changed.
    #[error("semaphore {key}: it has {permits} permits, asked for with {requested}")]
    PermitMismatch {
        /// The semaphore key.
        key: LockKey,
        /// The number of permits fixed for the key.
        permits: u32,
        /// The number this call asked for.
        requested: u32,
    },
    /// The key cannot be used as a lock key.
    #[error("invalid lock key {key}: {reason}")]
    InvalidKey {
        /// The rejected key.
        key: LockKey,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting is impossible (zero TTL, renewal slower than the TTL, …).
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// The lock key holds a value lockflight did not write: a value of another type,
    /// or a string without a TTL. lockflight never overwrites it.
    #[error("lock {key}: the Redis key holds a foreign value while {phase}: {detail}")]
    ForeignValue {
        /// The lock key.
        key: LockKey,
        /// The operation that found it.
        phase: Phase,
        /// What was found.
        detail: String,
    },
    /// The server refused the command for lack of permission (ACL `NOPERM`).
    #[error("lock {key}: no permission while {phase}: {source}")]
    NoPermission {
        /// The lock key.
        key: LockKey,
        /// The operation that was refused.
        phase: Phase,
        /// The server's error.
        source: Source,
    },
    /// The server refused the command for a reason that retrying at once will not
    /// change: out of memory under `noeviction` (`OOM`), a read-only replica
    /// (`READONLY`), a script error. Reported at once, never retried until the
    /// deadline, except too few replica acknowledgements (`NOREPLICAS`, with
    /// `replica_ack`): a waiting acquire asks again within its wait, and its wait
    /// ends with this refusal or with an [`Error::Timeout`] that names it. A renewal refused with `READONLY` means the
    /// lease is lost.
    #[error(
        "lock {key}: the server refused the command while {phase}: {}",
        server_says(code, source)
    )]
    Refused {
        /// The lock key.
        key: LockKey,
        /// The operation that was refused.
        phase: Phase,
        /// The server's error code (`OOM`, `READONLY`, `ERR`, …).
        code: String,
        /// The server's error.
        source: Source,
    },
    /// The shared computation of [`Locker::singleflight`](crate::Locker::singleflight) (or the
    /// guarded work of another caller) panicked.
    #[error("lock {key}: the shared singleflight computation panicked")]
    Panicked {
        /// The lock key.
        key: LockKey,
    },
    /// A quorum backend ([`RedlockBackend`](crate::backend::RedlockBackend)) could not get a
    /// majority of its nodes to agree: too few nodes answered (down, unreachable,
    /// refusing) for a majority to be possible. Whatever the minority granted was
    /// released before this error was returned. Transient: a retry may succeed once
    /// enough nodes are back.
    #[error(
        "lock {key}: quorum not reached while {phase}: {granted} of the {needed} nodes needed agreed"
    )]
    QuorumNotReached {
        /// The lock key.
        key: LockKey,
        /// The operation.
        phase: Phase,
        /// How many nodes granted (or renewed) the lock.
        granted: usize,
        /// How many nodes are needed (a majority).
        needed: usize,
    },
    /// The backend could not be reached when it was set up.
    #[error("cannot connect to {target}: {source}")]
    Connect {
        /// The address (never the password).
        target: String,
        /// The underlying error.
        source: Source,
    },
    /// The backend failed: I/O, a protocol error, an unexpected reply.
    #[error("lock {key}: backend error while {phase}: {source}")]
    Backend {
        /// The lock key (empty for connection set-up).
        key: LockKey,
        /// The operation.
        phase: Phase,
        /// The underlying error.
        source: Source,
    },
}

/// The end of a [`Error::Timeout`] message: the last failed attempt, without
/// the key the message has already named.
fn after(last_error: &Option<Box<Error>>) -> String {
    let Some(e) = last_error else {
        return String::new();
    };
    match &**e {
        Error::Refused { code, source, .. } => {
            format!(
                "; the last attempt was refused: {}",
                server_says(code, source)
            )
        }
        Error::NoPermission { source, .. } => format!(
            "; the last attempt was refused for lack of permission: {}",
            server_says("NOPERM", source)
        ),
        Error::QuorumNotReached {
            granted, needed, ..
        } => format!(
            "; the last attempt reached no quorum: {granted} of the {needed} nodes needed agreed"
        ),
        Error::Backend { source, .. } | Error::Connect { source, .. } => {
            format!("; the last attempt failed: {source}")
        }
        other => format!("; the last attempt failed: {other}"),
    }
}

/// A server's error as `CODE: what it said`, once: redis-rs writes its own
/// code in front of the detail, quoted or not.
fn server_says(code: &str, source: &Source) -> String {
    let detail = match source.downcast_ref::<redis::RedisError>() {
        Some(e) => e.detail().map(str::to_owned),
        None => None,
    };
    let detail = detail.unwrap_or_else(|| {
        let text = source.to_string();
        let quoted = format!("\"{code}\"");
        let rest = text
            .strip_prefix(quoted.as_str())
            .or_else(|| text.strip_prefix(code))
            .map(|rest| rest.trim_start_matches([':', ' ']).to_owned());
        rest.unwrap_or(text)
    });
    format!("{code}: {detail}")
}

impl LockKey {
    /// Checks the key against the rules every backend relies on.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] when the key is empty, whitespace only, or longer
    /// than [`LockKey::MAX_LEN`].
    pub fn validate(&self) -> Result<()> {
        match self.problem() {
            Some(reason) => Err(Error::InvalidKey {
                key: self.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }
}

/// What an error says about the request that met it ([`Error::class`]): the one
/// classification every caller asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// The request may or may not have reached the backend (I/O, a dropped
    /// connection, a timeout waiting for the reply).
    Indeterminate,
    /// Too few Redlock nodes answered.
    NoQuorum,
    /// A grant written but not acknowledged by enough replicas (`NOREPLICAS`).
    Unacknowledged,
    /// The server refused at once (out of memory, read-only, an ACL refusal);
    /// a partly run script may have written.
    Refused,
    /// The lock was busy: a wait timed out, a try found it held, too many waiters.
    Contended,
    /// The lease was lost.
    Lost,
    /// A definite answer that retrying will not change (bad input, a foreign
    /// value, an unsupported kind, a panic in guarded work, a reentrant lock).
    Definite,
}

impl Error {
    /// The key this error is about, if any.
    pub fn key(&self) -> Option<&LockKey> {
        match self {
            Error::Timeout { key, .. }
            | Error::LeaseLost { key, .. }
            | Error::Overloaded { key, .. }
            | Error::InvalidKey { key, .. }
            | Error::ForeignValue { key, .. }
            | Error::NoPermission { key, .. }
            | Error::Refused { key, .. }
            | Error::Panicked { key }
            | Error::Reentrant { key }
            | Error::Busy { key }
            | Error::QuorumNotReached { key, .. }
            | Error::Unsupported { key, .. }
            | Error::PermitMismatch { key, .. }
            | Error::Backend { key, .. } => Some(key),
            Error::InvalidConfig { .. } | Error::Connect { .. } => None,
        }
    }

    /// Whether retrying the same operation later may succeed (timeouts, overload,
    /// backend I/O, a lost lease); `false` for bad input, foreign values,
    /// permissions and refusals.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.class(),
            Class::Indeterminate | Class::NoQuorum | Class::Contended | Class::Lost
        )
    }

    /// Whether the request may or may not have reached the backend: an I/O error,
    /// a timeout waiting for the reply, a dropped connection, a server failing over.
    /// Every lock operation is idempotent per token, so the lease protocol repeats
    /// such a request to learn what happened (a release; an acquire, whose retry
    /// finds the lock already its own) instead of guessing. Every other error is a
    /// definite answer: repeating the request at once would get the same one.
    pub(crate) fn is_indeterminate(&self) -> bool {
        self.class() == Class::Indeterminate
    }

    /// The one classification of errors: what every question asked of an error
    /// (transient? indeterminate? an outage at the edge? what an acquire does
    /// with its token, `lease::failure::Failure`) answers from.
    pub(crate) fn class(&self) -> Class {
        match self {
            Error::Backend { .. } | Error::Connect { .. } => Class::Indeterminate,
            Error::QuorumNotReached { .. } => Class::NoQuorum,
            Error::Refused { code, .. } if code == "NOREPLICAS" => Class::Unacknowledged,
            Error::Refused { .. } | Error::NoPermission { .. } => Class::Refused,
            Error::Timeout { .. } | Error::Busy { .. } | Error::Overloaded { .. } => {
                Class::Contended
            }
            Error::LeaseLost { .. } => Class::Lost,
            Error::InvalidConfig { .. }
            | Error::InvalidKey { .. }
            | Error::ForeignValue { .. }
            | Error::Panicked { .. }
            | Error::Reentrant { .. }
            | Error::Unsupported { .. }
            | Error::PermitMismatch { .. } => Class::Definite,
        }
    }

    /// A short, stable code for this error (`lock_timeout`, `lease_lost`, …): what
    /// an HTTP response or a metric label may carry instead of the message, which
    /// names the key and may quote the server. The codes change only in a breaking
    /// release.
    ///
    /// ```
    /// use lockflight::{Error, LockKey};
    ///
    /// let e = LockKey::from("").validate().unwrap_err();
    /// assert_eq!(e.code(), "invalid_key");
    /// ```
    pub fn code(&self) -> &'static str {
        match self {
            Error::Timeout { .. } => "lock_timeout",
            Error::LeaseLost { .. } => "lease_lost",
            Error::Overloaded { .. } => "lock_overloaded",
            Error::Busy { .. } => "lock_busy",
            Error::InvalidKey { .. } => "invalid_key",
            Error::InvalidConfig { .. } => "invalid_config",
            Error::ForeignValue { .. } => "foreign_value",
            Error::NoPermission { .. } => "no_permission",
            Error::Refused { .. } => "lock_refused",
            Error::Panicked { .. } => "panicked",
            Error::Reentrant { .. } => "lock_reentrant",
            Error::Connect { .. } => "lock_backend_unreachable",
            Error::Backend { .. } => "lock_backend_unavailable",
            Error::QuorumNotReached { .. } => "quorum_not_reached",
            Error::Unsupported { .. } => "lock_unsupported",
            Error::PermitMismatch { .. } => "permit_mismatch",
        }
    }

    /// A backend error for `key` in `phase`.
    pub fn backend(
        key: &LockKey,
        phase: Phase,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Backend {
            key: key.clone(),
            phase,
            source: Arc::from(source.into()),
        }
    }

    /// A [`Error::Timeout`] for `key` in `phase` after `waited`, with no failed
    /// attempt to report.
    pub(crate) fn timeout(key: &LockKey, phase: Phase, waited: Duration) -> Self {
        Error::Timeout {
            key: key.clone(),
            phase,
            waited,
            last_error: None,
        }
    }

    pub(crate) fn config(reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            reason: reason.into(),
        }
    }
}

/// `Result<T, lockflight::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Error, Phase};

    #[test]
    fn messages_show_the_key_as_written() {
        let busy = Error::Busy {
            key: "sku:1".into(),
        };
        assert_eq!(
            busy.to_string(),
            "lock sku:1: busy, and the call does not wait"
        );
        let timeout = Error::timeout(
            &"sku:1".into(),
            Phase::WaitingLocally,
            Duration::from_secs(5),
        );
        assert!(
            timeout.to_string().starts_with("lock sku:1: timed out"),
            "{timeout}"
        );
        assert!(!timeout.to_string().contains("LockKey"), "{timeout}");
    }
}
