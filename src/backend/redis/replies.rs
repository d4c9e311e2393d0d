//! Decoding the scripts' replies.

use std::time::Duration;

use redis::Value;

use super::unexpected;
use crate::backend::{Acquire, Released, Renewal};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

/// A count of waiting instances (negative or oversized values are clamped).
pub(super) fn waiting(v: &Value) -> u32 {
    match v {
        Value::Int(n) => u32::try_from((*n).max(0)).unwrap_or(u32::MAX),
        _ => 0,
    }
}

/// A fencing epoch: a positive integer, else the reply is malformed.
pub(super) fn decode_epoch(key: &LockKey, v: &Value) -> Result<u64> {
    match v {
        Value::Int(n) if *n > 0 => Ok(*n as u64),
        _ => Err(Error::backend(
            key,
            Phase::Acquiring,
            format!("malformed epoch {v:?} in the acquire reply"),
        )),
    }
}

/// The optional last element of a release or leave reply: a refused `PUBLISH`.
pub(super) fn refused_publish(rest: &[Value]) -> Option<Option<String>> {
    match rest {
        [] => Some(None),
        [Value::BulkString(b)] => Some(Some(String::from_utf8_lossy(b).into_owned())),
        [Value::SimpleString(s)] => Some(Some(s.clone())),
        _ => None,
    }
}

/// The reply of `lua/acquire.lua`; `max_wait` bounds the retry time of `Busy`.
pub(super) fn decode_acquire(key: &LockKey, reply: &Value, max_wait: Duration) -> Result<Acquire> {
    let foreign = |detail: &str| Error::ForeignValue {
        key: key.clone(),
        phase: Phase::Acquiring,
        detail: detail.into(),
    };
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1), epoch, others, rest @ ..] => Ok(Acquire::Acquired {
                epoch: decode_epoch(key, epoch)?,
                waiting: waiting(others),
                // Fair mode: the earliest other waiter's age in µs (-1: none).
                earliest_other: match rest {
                    [Value::Int(us)] => u64::try_from(*us).ok().map(Duration::from_micros),
                    _ => None,
                },
            }),
            [Value::Int(0), Value::Int(wait_ms), _] => Ok(Acquire::Busy {
                retry_in: Duration::from_millis(u64::try_from(*wait_ms).unwrap_or(0)).min(max_wait),
            }),
            [Value::Int(-1)] => Err(foreign("the lock key holds a value that is not a string")),
            [Value::Int(-2)] => Err(foreign("the lock key holds a string without a TTL")),
            // Only a late copy of an acquire meets its own release record: the
            // lease's holder had already released it, and nothing was written.
            [Value::Int(-3)] => Err(Error::LeaseLost {
                key: key.clone(),
                phase: Phase::Acquiring,
                reason: "the lease token was already released; a released token is never \
                         granted again"
                    .into(),
            }),
            _ => Err(unexpected(key, Phase::Acquiring, reply)),
        },
        _ => Err(unexpected(key, Phase::Acquiring, reply)),
    }
}

/// The reply of `lua/release.lua`, and the error of a refused wake-up `PUBLISH`.
pub(super) fn decode_release(key: &LockKey, reply: &Value) -> Result<(Released, Option<String>)> {
    if let Value::Array(items) = reply
        && let [Value::Int(released @ (0 | 1)), others, rest @ ..] = items.as_slice()
        && let Some(refused) = match rest {
            // The key was granted to the next instance: `[error or nil, 1]`.
            [Value::Nil, Value::Int(1)] => Some(None),
            [error, Value::Int(1)] => refused_publish(std::slice::from_ref(error)),
            rest => refused_publish(rest),
        }
    {
        let released = Released {
            released: *released == 1,
            waiting: waiting(others),
        };
        return Ok((released, refused));
    }
    Err(unexpected(key, Phase::Releasing, reply))
}

/// The reply of `lua/renew_lock.lua`.
pub(super) fn decode_renewal(key: &LockKey, reply: &Value) -> Result<Renewal> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1), others] => Ok(Renewal::Renewed {
                waiting: waiting(others),
            }),
            [Value::Int(0), _] => Ok(Renewal::NotOwner),
            _ => Err(unexpected(key, Phase::Renewing, reply)),
        },
        _ => Err(unexpected(key, Phase::Renewing, reply)),
    }
}

/// The reply of `lua/leave.lua`: whether the instance left, and the error of a
/// refused wake-up `PUBLISH`.
pub(super) fn decode_leave(key: &LockKey, reply: &Value) -> Result<(bool, Option<String>)> {
    if let Value::Array(items) = reply {
        match items.as_slice() {
            [Value::Int(1), _, rest @ ..] => {
                if let Some(refused) = refused_publish(rest) {
                    return Ok((true, refused));
                }
            }
            [Value::Int(0), _] => return Ok((false, None)),
            _ => {}
        }
    }
    Err(unexpected(key, Phase::Acquiring, reply))
}
