//! Scheduled jobs that run at most once per tick across replicas: each replica's
//! timer (a `tokio::time::interval`, a cron crate: lockflight ships none) calls
//! [`Locker::run_exclusive`] at the tick, and only the replica that takes the
//! job's lock runs the work; the others get [`Tick::Skipped`].
//!
//! The lock is held for at most `at_most` (the lease is renewed while the work
//! runs, never past it, and its loss is signalled to the work) and at least
//! `at_least` from its grant **in the server's time**: a replica whose clock runs
//! behind fires the same tick late and finds the lock still held. Neither bound
//! reads a wall clock; both are durations the server applies (the lease's TTL),
//! measured here on the monotonic clock from the grant's reply, which arrives
//! after the server granted.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockflight::Result<()> {
//! use std::time::Duration;
//! use lockflight::job::{JobOptions, Tick};
//! use lockflight::{Locker, MemoryBackend};
//!
//! let locker = Locker::builder(MemoryBackend::new()).build()?;
//! let options = JobOptions::new(Duration::from_secs(60)).at_least(Duration::from_secs(30));
//! let tick = locker
//!     .run_exclusive("nightly-report", options, |lease| async move {
//!         // Fence the job's writes with lease.fencing_token().
//!         lease.fencing_token()
//!     })
//!     .await?;
//! assert!(matches!(tick, Tick::Ran(_)));
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease::{FencingToken, Loss, LossSignal, drift};
use crate::locker::Locker;
use crate::settings::LockOptions;

/// How long a job's lock is held: at most `at_most` from its grant (the work is
/// told of the loss then), and at least `at_least` (kept after the work returns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobOptions {
    at_most: Duration,
    at_least: Duration,
}

impl JobOptions {
    /// A job whose lock is held at most `at_most` and released as soon as the
    /// work returns.
    pub fn new(at_most: Duration) -> JobOptions {
        JobOptions {
            at_most,
            at_least: Duration::ZERO,
        }
    }

    /// Keeps the lock until `at_least` from its grant, however early the work
    /// returns: longer than the spread of the replicas' clocks, so that a replica
    /// firing the same tick late finds it held.
    pub fn at_least(mut self, at_least: Duration) -> JobOptions {
        self.at_least = at_least;
        self
    }

    fn validate(&self, key: &LockKey) -> Result<()> {
        let problem = if self.at_most.is_zero() {
            Some("at_most is zero")
        } else if self.at_least > self.at_most {
            Some("at_least is longer than at_most")
        } else {
            None
        };
        match problem {
            Some(reason) => Err(Error::config(format!("run_exclusive({key}): {reason}"))),
            None => Ok(()),
        }
    }
}

/// What [`Locker::run_exclusive`] did at one tick.
#[must_use = "a skipped tick did not run the work"]
#[derive(Debug, PartialEq, Eq)]
pub enum Tick<T> {
    /// This replica held the job's lock and ran the work, which returned this.
    Ran(T),
    /// Another replica (or another task of this process) holds the job's lock:
    /// the work did not run.
    Skipped,
}

/// What the work of a job is given: its lease's fencing token and loss.
#[derive(Clone, Debug)]
pub struct JobLease {
    key: LockKey,
    token: FencingToken,
    loss: LossSignal,
}

impl JobLease {
    /// The job's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The fencing token of the job's lease: fence the job's writes with it.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// Whether the lease is lost (its `at_most` passed, or it was taken over).
    pub fn is_lost(&self) -> bool {
        self.loss.is_lost()
    }

    /// Resolves when the lease is lost.
    pub fn lost(&self) -> Loss {
        self.loss.lost()
    }
}

impl Locker {
    /// Runs `work` for this tick of the job `key`, unless another replica (or
    /// another task of this process) holds the job's lock: then the tick is
    /// [`Tick::Skipped`], which is an outcome, not an error. The lock is taken
    /// without waiting, with a lease whose TTL is at least `at_least` (so that
    /// even a lease never renewed stays until then), renewed while the work runs
    /// and never past `at_most`; after the work returns it is kept until
    /// `at_least` from the grant, or released at once if that has passed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a zero `at_most` or an `at_least` longer than
    /// it; [`Error::InvalidKey`]; backend errors of the acquire (the work did not
    /// run). Once the work has run its output is returned as [`Tick::Ran`]
    /// whatever the end of the hold answers (a lease lost meanwhile was signalled
    /// to the work).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the work returns drops the work and releases
    /// the lock in the background, before `at_least`: the tick may run again
    /// elsewhere.
    pub async fn run_exclusive<F, Fut, T>(
        &self,
        key: impl Into<LockKey>,
        options: JobOptions,
        work: F,
    ) -> Result<Tick<T>>
    where
        F: FnOnce(JobLease) -> Fut,
        Fut: Future<Output = T>,
    {
        let key = key.into();
        options.validate(&key)?;
        // Never past `at_most` at the server either, and never shorter than
        // `at_least` (a lease that is never renewed stays that long).
        let ttl = self.lease_ttl().max(options.at_least).min(options.at_most);
        let lock = LockOptions {
            hold_limit: Some(options.at_most),
            ..LockOptions::new().try_only().lease_ttl(ttl)
        };
        let guard = match self.lock_with_options(key.clone(), lock).await {
            Ok(guard) => guard,
            Err(Error::Busy { .. }) => return Ok(Tick::Skipped),
            Err(e) => return Err(e),
        };
        // After the grant's reply, so no earlier than the server's grant: the
        // kept lease ends no earlier than `at_least` after it.
        let granted = Instant::now();
        let lease = JobLease {
            key,
            token: guard.fencing_token(),
            loss: guard.loss_signal(),
        };
        let output = work(lease).await;
        // With the drift allowance: the server's clock may run a little slower.
        let left = options.at_least.saturating_sub(granted.elapsed());
        let left = if left.is_zero() {
            left
        } else {
            left + drift(left)
        };
        let end = if left.is_zero() {
            guard.release().await
        } else {
            guard.keep_for(left).await
        };
        if let Err(e) = end {
            tracing::debug!(error = %e, "the end of a job's hold failed");
        }
        Ok(Tick::Ran(output))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{JobOptions, Tick};
    use crate::backend::MemoryBackend;
    use crate::error::Error;
    use crate::locker::Locker;

    /// Two replicas on one server fire the same tick, one of them late (its
    /// clock behind): the late one finds the lock kept until `at_least` and
    /// skips; after `at_least` the next tick runs.
    #[tokio::test(start_paused = true)]
    async fn a_late_replica_skips_the_tick_until_at_least_has_passed() {
        let backend = MemoryBackend::new();
        let a = Locker::builder(backend.clone()).build().unwrap();
        let b = Locker::builder(backend).build().unwrap();
        let options = JobOptions::new(Duration::from_secs(60)).at_least(Duration::from_secs(2));
        let work = |_| async { tokio::time::sleep(Duration::from_millis(100)).await };
        assert_eq!(
            a.run_exclusive("job", options, work).await.unwrap(),
            Tick::Ran(())
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            b.run_exclusive("job", options, work).await.unwrap(),
            Tick::Skipped
        );
        assert_eq!(
            a.run_exclusive("job", options, work).await.unwrap(),
            Tick::Skipped
        );
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(
            b.run_exclusive("job", options, work).await.unwrap(),
            Tick::Ran(())
        );
    }

    /// Work that overruns `at_most` is told its lease is lost, and another
    /// replica may run the job then, with a greater fencing token.
    #[tokio::test(start_paused = true)]
    async fn work_past_at_most_is_told_of_the_loss() {
        let backend = MemoryBackend::new();
        let ttl = Duration::from_secs(3);
        let a = Locker::builder(backend.clone())
            .lease_ttl(ttl)
            .build()
            .unwrap();
        let b = Locker::builder(backend).lease_ttl(ttl).build().unwrap();
        let options = JobOptions::new(Duration::from_secs(5));
        let (first, lost) = match a
            .run_exclusive("job", options, |lease| async move {
                lease.lost().await;
                // The server ends the lease within the drift allowance after its
                // holder's validity (a paused clock: exact).
                tokio::time::sleep(Duration::from_millis(100)).await;
                let token = lease.fencing_token();
                let second = b
                    .run_exclusive("job", options, |lease| async move { lease.fencing_token() })
                    .await
                    .unwrap();
                (token, second)
            })
            .await
            .unwrap()
        {
            Tick::Ran(out) => out,
            Tick::Skipped => panic!("skipped"),
        };
        let Tick::Ran(second) = lost else {
            panic!("the second replica skipped after the loss");
        };
        assert!(second > first);
    }

    #[tokio::test]
    async fn bad_options_are_refused_naming_the_key() {
        let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
        let bad = JobOptions::new(Duration::from_secs(1)).at_least(Duration::from_secs(2));
        let err = locker
            .run_exclusive("job", bad, |_| async {})
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
        assert!(err.to_string().contains("job"), "{err}");
    }
}
