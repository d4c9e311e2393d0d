//! Taking a lock at the HTTP edge: the layer's and the [`Locked`](super::Locked)
//! extractor's one way to acquire, which tells an unreachable backend apart from a
//! busy lock and keeps the locker's outage state.

use crate::error::{Class, Error, Phase, Result};
use crate::guard::LockGuard;
use crate::key::LockKey;
use crate::locker::{LockOptions, Locker};

/// Whether `e` says the backend could not be reached or did not answer.
pub(crate) fn is_outage(e: &Error) -> bool {
    matches!(e.class(), Class::Indeterminate | Class::NoQuorum)
}

/// Takes the lock of `key` with `options`.
///
/// A backend error fails as it is (and is reported to the locker's outage state).
/// A wait timeout while the backend does not answer a probe becomes
/// [`Error::Backend`]: the request waited for an outage, not for a holder.
///
/// Cancel safe, as [`Locker::lock_with_options`]; a dropped probe is probed again
/// by the next caller.
pub(crate) async fn acquire(
    locker: &Locker,
    key: LockKey,
    options: LockOptions,
) -> Result<LockGuard> {
    match locker.lock_with_options(key.clone(), options).await {
        Ok(guard) => {
            locker.health().succeeded();
            Ok(guard)
        }
        Err(e) if is_outage(&e) => {
            locker.health().failed(&e);
            Err(e)
        }
        Err(Error::Timeout {
            key,
            phase,
            waited,
            last_error,
        }) => match locker.backend_answers().await {
            Ok(()) => Err(Error::Timeout {
                key,
                phase,
                waited,
                last_error,
            }),
            Err(probe) => Err(Error::backend(
                &key,
                Phase::Acquiring,
                format!("no lock within {waited:?}, and the backend does not answer: {probe}"),
            )),
        },
        Err(e) => Err(e),
    }
}
