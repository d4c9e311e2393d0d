//! The `lockflight` command against real Redis servers started by the tests:
//! `doctor`'s verdicts on deliberately misconfigured servers, `inspect` and `list`
//! on held keys, `release --force` fencing out the old holder, `selfcheck` on
//! lockflight.
//!
//! One test binary (`cli`), a module per subcommand.

use std::time::Duration;

#[path = "../support/mod.rs"]
mod support;

mod doctor;
mod inspect;
mod release;
mod selfcheck;

use lockflight::{Locker, RedisBackend};
use support::args;

async fn locker(url: &str, prefix: &str, ttl: Duration) -> Locker {
    locker_and_instance(url, prefix, ttl).await.0
}

/// A locker and its backend's instance id.
async fn locker_and_instance(url: &str, prefix: &str, ttl: Duration) -> (Locker, String) {
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .unwrap();
    let instance = backend.instance_id().to_owned();
    let locker = Locker::builder(backend)
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    (locker, instance)
}

/// Runs the binary with `args`; returns the exit code and stdout.
async fn lockflight_text(list: &[&str]) -> (i32, String) {
    let (code, stdout, _) = support::lockflight_output(args(list), Vec::new()).await;
    (code, stdout)
}

/// `--help` (and `-h`) lists every exit code the command uses, 0 to 4.
#[tokio::test]
async fn help_lists_every_exit_code() {
    for flag in ["--help", "-h"] {
        let (code, text) = lockflight_text(&[flag]).await;
        assert_eq!(code, 0, "{text}");
        let listed = text
            .split("Exit codes:")
            .nth(1)
            .unwrap_or_else(|| panic!("no exit codes in `lockflight {flag}`: {text}"));
        for exit in 0..=4 {
            assert!(
                listed
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{exit}  "))),
                "exit code {exit} in `lockflight {flag}`: {text}"
            );
        }
    }
}
