//! Phase 3, the paused client: a holder stopped past its lease, the next holder,
//! and the late fenced write that must be refused.

use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey};
use tokio::time::Instant;

use super::subject::{Release, Subject};
use crate::report::Check;

/// The paused instance's lease TTL.
pub(super) const PAUSED_TTL: Duration = Duration::from_secs(1);

/// The paused-client phase (module docs, phase 3): `paused` takes the key and
/// writes, then is paused; `next` takes the key; `paused` resumes and writes
/// late. Returns the verdict; at most `budget` plus one release.
pub(crate) async fn paused_client(
    paused: &dyn Subject,
    next: &dyn Subject,
    mut data: redis::aio::MultiplexedConnection,
    prefix: &str,
    budget: Duration,
) -> Check {
    const ID: &str = "paused-client";
    let deadline = Instant::now() + budget;
    let key = "paused".to_owned();
    let not_run = |what: String| {
        Check::warn(
            ID,
            format!("not finished: {what}"),
            "give selfcheck more --seconds; see `lockflight doctor`",
        )
    };
    let resource = match FencedKey::new(format!("{prefix}:{{paused}}:resource")) {
        Ok(resource) => resource,
        Err(e) => return not_run(e.to_string()),
    };
    let first = match tokio::time::timeout_at(deadline, paused.acquire(key.clone())).await {
        Ok(Ok(held)) => held,
        Ok(Err(e)) => return not_run(format!("the first holder's acquire failed: {e}")),
        Err(_) => return not_run("the first holder's acquire timed out".into()),
    };
    let mut violations = Vec::new();
    match resource.set(&mut data, first.token, "first").await {
        Ok(Fenced::Applied(())) => {}
        Ok(Fenced::Stale { last, .. }) => violations.push(format!(
            "the live holder's write (token {}) was refused: the resource had {last}",
            first.token
        )),
        Err(e) => return not_run(format!("the first fenced write failed: {e}")),
    }
    paused.pause(true);
    let second = tokio::time::timeout_at(deadline, next.acquire(key)).await;
    let told = (first.is_lost)();
    let second = match second {
        Ok(Ok(held)) => held,
        other => {
            paused.pause(false);
            let _ = first.release.await;
            return match other {
                Ok(Err(e)) => not_run(format!("the next holder's acquire failed: {e}")),
                _ => Check::fail(
                    ID,
                    format!(
                        "the key of a holder paused past its {PAUSED_TTL:?} lease was not free within {budget:?}"
                    ),
                    "report the run with its output; `lockflight inspect` shows what holds the key",
                ),
            };
        }
    };
    if second.token <= first.token {
        violations.push(format!(
            "the next holder's token {} is not greater than the paused holder's {}",
            second.token, first.token
        ));
    }
    if !told {
        violations.push(
            "the paused holder's guard did not report its loss by the time the next holder had the key"
                .into(),
        );
    }
    match resource.set(&mut data, second.token, "next").await {
        Ok(Fenced::Applied(())) => {}
        Ok(Fenced::Stale { last, .. }) => violations.push(format!(
            "the next holder's write (token {}) was refused: the resource had {last}",
            second.token
        )),
        Err(e) => violations.push(format!("the next holder's fenced write failed: {e}")),
    }
    paused.pause(false);
    // The paused holder resumes and writes late.
    match resource.set(&mut data, first.token, "late").await {
        Ok(Fenced::Stale { .. }) => {}
        Ok(Fenced::Applied(())) => violations.push(format!(
            "the paused holder's late write (token {}) was applied after the next holder's ({})",
            first.token, second.token
        )),
        Err(e) => violations.push(format!("the late fenced write failed: {e}")),
    }
    match first.release.await {
        Release::Lost => {}
        Release::Done => violations.push(
            "the paused holder's release reported success after the next holder took the key"
                .into(),
        ),
        Release::Failed(e) => violations.push(format!("the paused holder's release failed: {e}")),
    }
    let _ = second.release.await;
    if violations.is_empty() {
        Check::pass(
            ID,
            format!(
                "a holder paused past its {PAUSED_TTL:?} lease was told of its loss; the next holder's token {} > {}; the late fenced write was refused",
                second.token, first.token
            ),
        )
    } else {
        Check::fail(
            ID,
            violations.join("; "),
            "check the server's clock and `lockflight doctor`; report the run with its output",
        )
    }
}
