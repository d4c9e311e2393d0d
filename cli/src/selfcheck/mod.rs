//! `lockflight selfcheck`: runs, under a private key prefix and bounded in time,
//! the parts of lockflight's fault matrix that are safe on a user's deployment,
//! against the user's server, and reports violations. Three phases share the
//! time budget:
//!
//! 1. **many waiters**: 2 instances × 8 tasks on 3 keys;
//! 2. **lost replies**: the same workload, with the instances connected through a
//!    local proxy ([`FaultProxy`], loopback, ephemeral port) that cuts a
//!    connection right after forwarding some requests (acquires, releases,
//!    renewals, queue calls alike), so the server applies them and the client
//!    never gets the reply;
//! 3. **a paused client**: an instance with a 1 s lease takes a key and writes a
//!    fenced resource, then all its traffic stops (the proxy holds it back, as a
//!    stopped process); another instance takes the key, then the paused one
//!    resumes and writes late.
//!
//! What is checked, over the phases:
//!
//! * exclusion: no two critical sections of a key overlap (an in-process
//!   occupancy count per key);
//! * the fenced-order oracle: each key's tokens strictly increase in the order
//!   the critical sections ran, and a fenced write (`FencedKey`) of a live holder
//!   is never refused;
//! * lost updates: a read-modify-write counter in Redis (GET, pause, SET) ends
//!   equal to the number of critical sections;
//! * truthful release: a release reports the lease lost only if its holder had
//!   already been told so (a lost reply is no loss);
//! * nothing left locked: once the instances are idle, no key is held;
//! * the paused client: the next holder gets a greater token, its fenced write
//!   lands, the paused holder's late fenced write is refused, and the paused
//!   holder's guard reports the loss (by the time the next holder has the key)
//!   and its release says so.
//!
//! Not run here: killed connections by the server (`CLIENT KILL` would need
//! rights the application's user should not have) and failovers.
//!
//! The engine takes any [`Subject`] (a lock under test), so the tests point it
//! at deliberately broken locks and check that it finds the violations.

mod paused;
mod subject;
#[cfg(test)]
mod tests;
mod workload;

use std::sync::Arc;
use std::time::Duration;

use crate::proxy::FaultProxy;
use crate::report::{Check, Verdict, plural, print_checks};
use crate::{EXIT_FAILED, connect, progress, redact};
use paused::{PAUSED_TTL, paused_client};
use subject::{Subject, instance, through_proxy};
use workload::{TASKS_PER_INSTANCE, cleanup, exercise};

/// Critical sections per task in the many-waiters phase, and under lost replies.
const ROUNDS: usize = 40;
const ROUNDS_LOST_REPLIES: usize = 15;
/// Under lost replies: the chance (‰) that a forwarded request loses its reply,
/// and at most how many do.
const CUT_PER_MILLE: u32 = 100;
const CUT_BUDGET: u64 = 12;

/// `lockflight selfcheck`.
pub(crate) async fn run(url: &str, budget: Duration, json: bool) -> Result<u8, String> {
    let data = connect(url).await?;
    let prefix = format!("lockflight-selfcheck-{:x}", rand::random::<u64>());
    let result = phases(url, &prefix, &data, budget, json).await;
    let mut conn = data;
    cleanup(&mut conn, &prefix).await;
    let checks = result?;
    Ok(
        match print_checks("selfcheck", &redact(url), &checks, json) {
            Verdict::Fail => EXIT_FAILED,
            _ => 0,
        },
    )
}

/// The three phases; the many waiters get 45 % of the budget, lost replies
/// 35 %, the paused client 20 % but at least 3 s (each workload then waits at
/// most 5 s for its keys to be free).
async fn phases(
    url: &str,
    prefix: &str,
    data: &redis::aio::MultiplexedConnection,
    budget: Duration,
    json: bool,
) -> Result<Vec<Check>, String> {
    let total = (2 * TASKS_PER_INSTANCE * (ROUNDS + ROUNDS_LOST_REPLIES)) as u64 + 1;
    let bar = progress(total, json);
    let counted = bar.clone();
    let count = move || counted.inc(1);

    bar.set_message("many waiters");
    let mut subjects: Vec<Arc<dyn Subject>> = Vec::new();
    for _ in 0..2 {
        subjects.push(Arc::new(
            instance(url, prefix, data, Duration::from_secs(5), budget, None).await?,
        ));
    }
    let mut findings = exercise(
        subjects,
        data.clone(),
        prefix,
        ROUNDS,
        budget.mul_f64(0.45),
        count.clone(),
    )
    .await;

    bar.set_message("lost replies");
    let mut checks = Vec::new();
    match through_proxy(url).await {
        Ok((target, via)) => {
            let proxy = Arc::new(FaultProxy::start(target).await.map_err(|e| e.to_string())?);
            let mut subjects: Vec<Arc<dyn Subject>> = Vec::new();
            for _ in 0..2 {
                subjects.push(Arc::new(
                    instance(
                        &via(proxy.port()),
                        prefix,
                        data,
                        Duration::from_secs(5),
                        budget,
                        Some(Arc::clone(&proxy)),
                    )
                    .await?,
                ));
            }
            // Armed only once the instances are connected.
            proxy.lose_replies(CUT_PER_MILLE, CUT_BUDGET);
            let mut faulted = exercise(
                subjects,
                data.clone(),
                prefix,
                ROUNDS_LOST_REPLIES,
                budget.mul_f64(0.35),
                count,
            )
            .await;
            // Operations that failed here failed because of the cuts this
            // phase makes itself: reported with the phase, not as the server's.
            let injected = std::mem::take(&mut faulted.errors).len();
            findings.absorb(faulted);
            proxy.lose_replies(0, 0);
            let cuts = proxy.cuts();
            checks.push(if cuts > 0 {
                Check::pass(
                    "lost-replies",
                    format!(
                        "{} cut right after a request (its reply lost) while the instances worked; {} because of those cuts, as expected",
                        plural(cuts, "connection was", "connections were"),
                        plural(injected, "operation failed", "operations failed")
                    ),
                )
            } else {
                Check::warn(
                    "lost-replies",
                    "no reply was lost (too few requests in the time given)",
                    "give selfcheck more --seconds",
                )
            });

            bar.set_message("a paused client");
            let pausable = Arc::new(FaultProxy::start(target).await.map_err(|e| e.to_string())?);
            let paused = instance(
                &via(pausable.port()),
                prefix,
                data,
                PAUSED_TTL,
                budget,
                Some(Arc::clone(&pausable)),
            )
            .await?;
            let next = instance(url, prefix, data, Duration::from_secs(5), budget, None).await?;
            let rest = budget.mul_f64(0.2).max(Duration::from_secs(3));
            checks.push(paused_client(&paused, &next, data.clone(), prefix, rest).await);
            bar.inc(1);
        }
        Err(why) => {
            for id in ["lost-replies", "paused-client"] {
                checks.push(Check::warn(
                    id,
                    format!("not run: {why}"),
                    "run selfcheck with a redis:// URL",
                ));
            }
        }
    }
    bar.finish_and_clear();
    let mut all = findings.checks();
    all.extend(checks);
    Ok(all)
}
