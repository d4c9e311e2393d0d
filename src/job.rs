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
//! after the server granted. The [scheduled jobs](crate::guide::scheduled_jobs)
//! page of the guide says what happens at each event.
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

use crate::backend::WhenBusy;
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease::acquire::Call;
use crate::lease::{FencingToken, Loss, LossSignal, drift};
use crate::locker::{LockGuard, Locker};
use crate::settings::ttl_in_bounds;

/// How long a job's lock is held: at most `at_most` from its grant (the work is
/// told of the loss then), and at least `at_least` (kept after the work returns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
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
    /// The one attempt of a job's tick: no wait, a lease whose TTL is at least
    /// `at_least` (so that even a lease never renewed stays that long) and at
    /// most `at_most`, and `at_most` as the call's hold limit, so no renewal
    /// carries the lease past it either.
    fn job_call(&self, key: &LockKey, options: JobOptions) -> Result<Call> {
        options.validate(key)?;
        let ttl = self.lease_ttl().max(options.at_least).min(options.at_most);
        // A lease shorter than `at_most` is at least the locker's, which fits
        // its renewal interval; one of `at_most` is never renewed.
        ttl_in_bounds(ttl).map_err(|reason| {
            Error::config(format!(
                "run_exclusive({key}): at_most {:?} and at_least {:?} make a lease of {ttl:?}: {reason}",
                options.at_most, options.at_least
            ))
        })?;
        Ok(Call {
            hold_limit: Some(options.at_most),
            ..Call::new(self.wait_timeout(), ttl, WhenBusy::Return)
        })
    }

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
    /// [`Error::InvalidConfig`] for a zero `at_most`, an `at_least` longer than
    /// it, or a lease TTL they make outside the lease TTL's bounds;
    /// [`Error::InvalidKey`]; [`Error::Reentrant`] when this task already holds
    /// the key's lock; backend errors of the acquire (the work did not run). Once the work has run its output is returned as [`Tick::Ran`]
    /// whatever the end of the hold answers (a lease lost meanwhile was signalled
    /// to the work).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the work returns drops the work; the tick
    /// still counts as run here: the lock is kept until `at_least` from its grant
    /// (or released, if that has passed) in the background, as if the work had
    /// returned.
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
        let call = self.job_call(&key, options)?;
        let guard = match self.acquire(key.clone(), call).await {
            Ok(guard) => guard,
            Err(Error::Busy { .. }) => {
                self.counters().job_skipped();
                return Ok(Tick::Skipped);
            }
            Err(e) => return Err(e),
        };
        self.counters().job_ran();
        let hold = Hold {
            guard: Some(guard),
            // After the grant's reply, so no earlier than the server's grant:
            // the kept lease ends no earlier than `at_least` after it.
            granted: Instant::now(),
            at_least: options.at_least,
        };
        let lease = JobLease {
            key,
            token: hold.guard().fencing_token(),
            loss: hold.guard().loss_signal(),
        };
        let output = work(lease).await;
        if let Err(e) = hold.end().await {
            tracing::debug!(error = %e, "the end of a job's hold failed");
        }
        Ok(Tick::Ran(output))
    }
}

/// A job's lease while its work runs. Its end keeps the lease at the backend
/// until `at_least` from the grant, or releases it there once that has passed;
/// dropped with a cancelled tick, it ends the same way in the background, so a
/// cancelled tick still counts as this tick's run.
struct Hold {
    guard: Option<LockGuard>,
    granted: Instant,
    at_least: Duration,
}

impl Hold {
    fn guard(&self) -> &LockGuard {
        self.guard.as_ref().expect("held until its end")
    }

    async fn end(mut self) -> Result<()> {
        let guard = self.guard.take().expect("held until its end");
        end_hold(guard, self.granted, self.at_least).await
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let (granted, at_least) = (self.granted, self.at_least);
            // Without a runtime the guard is dropped here, and ends as any
            // dropped guard does.
            let _ = crate::runtime::spawn(async move {
                if let Err(e) = end_hold(guard, granted, at_least).await {
                    tracing::debug!(error = %e, "the end of a cancelled job's hold failed");
                }
            });
        }
    }
}

/// Keeps `guard`'s lease until `at_least` after `granted`, with the drift
/// allowance (the server's clock may run a little slower), or releases it at the
/// backend if that has passed: never handed on or cached, so the next tick takes
/// a lease of its own.
async fn end_hold(guard: LockGuard, granted: Instant, at_least: Duration) -> Result<()> {
    let left = at_least.saturating_sub(granted.elapsed());
    if left.is_zero() {
        guard.release_at_backend().await
    } else {
        guard.keep_for(left + drift(left)).await
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

    /// A tick never runs on a lease this process keeps cached for its other
    /// users of the key (granted for another call, with another hold limit):
    /// the cached lease goes back to the backend and the tick takes its own.
    #[tokio::test]
    async fn a_tick_takes_a_lease_of_its_own_never_a_cached_one() {
        // A linger no busy machine outlasts (a paused clock would skip it).
        let locker = Locker::builder(MemoryBackend::new())
            .cache_leases_for(Duration::from_secs(600))
            .build()
            .unwrap();
        // A key locked again within the linger of its release is warm: one of
        // its next releases leaves the lease cached (no backend release).
        let mut cached = None;
        for _ in 0..5 {
            let guard = locker.lock("job").await.unwrap();
            let token = guard.fencing_token();
            let before = locker.stats();
            guard.release().await.unwrap();
            if (locker.stats() - before).releases == 0 {
                cached = Some(token);
                break;
            }
        }
        let cached_token = cached.expect("a lease of the warm key was cached");
        let before_job = locker.stats();
        let options = JobOptions::new(Duration::from_secs(60));
        let tick = locker
            .run_exclusive("job", options, |lease| async move { lease.fencing_token() })
            .await
            .unwrap();
        let Tick::Ran(token) = tick else {
            panic!("the tick was skipped")
        };
        assert!(token > cached_token, "{token:?} after {cached_token:?}");
        let delta = locker.stats() - before_job;
        assert_eq!((delta.acquire_attempts, delta.jobs_run), (1, 1));
        // Nor does the tick leave its lease cached: the next takes its own.
        let Tick::Ran(next) = locker
            .run_exclusive("job", options, |lease| async move { lease.fencing_token() })
            .await
            .unwrap()
        else {
            panic!("the next tick was skipped")
        };
        assert!(next > token);
    }

    /// A tick whose future is dropped while its work runs still counts as run:
    /// the lock stays until `at_least`, and a skipped tick is counted.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_tick_keeps_the_lock_until_at_least() {
        let backend = MemoryBackend::new();
        let a = Locker::builder(backend.clone()).build().unwrap();
        let b = Locker::builder(backend).build().unwrap();
        let options = JobOptions::new(Duration::from_secs(60)).at_least(Duration::from_secs(10));
        let work = |_| std::future::pending::<()>();
        let cancelled = tokio::time::timeout(
            Duration::from_secs(1),
            a.run_exclusive("job", options, work),
        )
        .await;
        assert!(cancelled.is_err(), "the work never returns");
        let before = b.stats();
        let skipped = b.run_exclusive("job", options, |_| async {}).await.unwrap();
        assert_eq!(skipped, Tick::Skipped);
        assert_eq!((b.stats() - before).jobs_skipped, 1);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let ran = b.run_exclusive("job", options, |_| async {}).await.unwrap();
        assert_eq!(ran, Tick::Ran(()));
    }

    /// A lease outside the lease TTL's bounds is refused, naming the call, the
    /// key and the bounds.
    #[tokio::test]
    async fn a_lease_out_of_bounds_is_refused_naming_run_exclusive() {
        let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
        let tiny = JobOptions::new(Duration::from_micros(1));
        let err = locker
            .run_exclusive("nightly", tiny, |_| async {})
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("run_exclusive(nightly)"), "{text}");
        assert!(text.contains("at_most"), "{text}");
    }
}
