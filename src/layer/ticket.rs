//! What [`LockLayer::lock_in_handler`](super::LockLayer::lock_in_handler) leaves in
//! a request for the handler's [`Locked`](super::Locked) extractor: the key, and a
//! place for the guard, which the layer's response future then owns.
// Without the `axum` feature there is no `Locked` extractor to take the lock.
#![cfg_attr(not(feature = "axum"), allow(dead_code))]

use std::fmt;
use std::sync::{Arc, Mutex};

use super::edge;
use crate::error::{Error, Result};
use crate::guard::{LockGuard, LockInfo};
use crate::key::LockKey;
use crate::locker::{LockOptions, Locker};
use crate::reentry;

/// The lock a request may take once, from its handler. Cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct Ticket(Arc<Inner>);

struct Inner {
    locker: Locker,
    key: LockKey,
    options: LockOptions,
    state: Mutex<State>,
}

/// Where the ticket is; it only moves forward.
enum State {
    /// Nobody asked for the lock yet.
    Open,
    /// The extractor is waiting for it (or was dropped while waiting).
    Acquiring,
    /// Held; the guard until the response future takes it.
    Held(Option<LockGuard>),
    /// The extractor ran and refused the request (its body, or the lock failed).
    Refused,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("key", &self.0.key)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    pub(crate) fn new(locker: Locker, key: LockKey, options: LockOptions) -> Self {
        Ticket(Arc::new(Inner {
            locker,
            key,
            options,
            state: Mutex::new(State::Open),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn key(&self) -> &LockKey {
        &self.0.key
    }

    /// Takes the lock, once. The caller runs inside the layer's holder scope of the
    /// key; the acquire itself runs outside it.
    ///
    /// Cancel safe: a dropped call leaves the ticket `Acquiring` (the request is
    /// being dropped with it) and the lock call releases whatever it got.
    pub(crate) async fn acquire(&self) -> Result<LockInfo> {
        {
            let mut state = self.state();
            if !matches!(*state, State::Open) {
                return Err(Error::InvalidConfig {
                    reason:
                        "the lock of this request was asked for twice (one Locked<_> per handler)"
                            .into(),
                });
            }
            *state = State::Acquiring;
        }
        let inner = &self.0;
        let locker = &inner.locker;
        let got = reentry::without(
            locker.id(),
            &inner.key,
            edge::acquire(locker, inner.key.clone(), inner.options),
        )
        .await;
        let mut state = self.state();
        match got {
            Ok(guard) => {
                let info = guard.info();
                *state = State::Held(Some(guard));
                Ok(info)
            }
            Err(e) => {
                *state = State::Refused;
                Err(e)
            }
        }
    }

    /// The extractor refused the request before asking for the lock.
    pub(crate) fn refuse(&self) {
        let mut state = self.state();
        if matches!(*state, State::Open) {
            *state = State::Refused;
        }
    }

    /// The guard, once the extractor holds it (only the first call gets it).
    pub(crate) fn take_guard(&self) -> Option<LockGuard> {
        match &mut *self.state() {
            State::Held(guard) => guard.take(),
            _ => None,
        }
    }

    /// Whether nothing ever asked for the lock (no `Locked<_>` extractor ran).
    pub(crate) fn untouched(&self) -> bool {
        matches!(*self.state(), State::Open)
    }
}
