//! What every lock kind of a [`Locker`](crate::Locker) runs on: the backend, the
//! validated settings, the counters and the renewal watchdog.
//!
//! The exclusive lock ([`locker`](crate::locker)), the read-write locks
//! ([`rwlock`](crate::rwlock)) and the semaphores ([`semaphore`](crate::semaphore))
//! each keep their own per-key state next to one shared [`Engine`], so none of
//! them depends on another, nor on the `Locker` handle above them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::lease::renewal::Renewals;
use crate::settings::Config;
use crate::stats::StatsInner;

/// The backend and the machinery every lock kind of one locker shares.
pub(crate) struct Engine {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) config: Config,
    pub(crate) stats: Arc<StatsInner>,
    pub(crate) renewals: Arc<Renewals>,
}

impl Engine {
    /// An engine over `backend` with the validated `config`: fresh counters and a
    /// renewal watchdog (started with the first lease it watches).
    pub(crate) fn new(backend: Arc<dyn LockBackend>, config: Config) -> Engine {
        let stats = Arc::<StatsInner>::default();
        let renewals = Arc::new(
            Renewals::new(Arc::clone(&backend), config.renew_every, Arc::clone(&stats))
                .with_hold_limit(config.hold_limit),
        );
        Engine {
            backend,
            config,
            stats,
            renewals,
        }
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.backend)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// `start + wait`, or a far future when that overflows (a wait of `Duration::MAX`
/// waits as long as it takes, like [`tokio::time::sleep`]).
pub(crate) fn deadline_after(start: Instant, wait: Duration) -> Instant {
    start
        .checked_add(wait)
        .unwrap_or_else(|| start + Duration::from_secs(86_400 * 365 * 30))
}

/// Spawns `fut` on the current runtime, if there is one.
pub(crate) fn spawn_detached<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(fut);
    }
}
