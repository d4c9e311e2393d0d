//! The instance card: who an instance is, as an operator knows it.
//!
//! A lease token names its instance by a random 64-bit id (`LeaseToken::for_instance`).
//! So that `lockflight inspect` can say which process holds a key, each instance
//! writes a card at `<prefix>:inst:<id>` (the name of its channel, as a key): lines
//! `field=value` with the name the service gave (`RedisBackendBuilder::instance_name`),
//! the host name, the process id, when it connected (its own clock, ms since the Unix
//! epoch) and lockflight's version. `connect` writes it and a task rewrites it every
//! [`REFRESH`], with a TTL of three periods, so the card of a process that is gone
//! expires within [`TTL`]. One `SET` per instance per minute: no lock operation waits
//! for it. The card is for operators only, so a refused write (a read-only replica,
//! `OOM` under `noeviction`, an ACL without the key) never fails `connect`: it is
//! logged and tried again after [`RETRY`].

use std::sync::Weak;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use super::Inner;

/// How often a live instance rewrites its card.
pub(super) const REFRESH: Duration = Duration::from_secs(60);

/// The card's TTL: three refresh periods.
pub(super) const TTL: Duration = Duration::from_secs(180);

/// How soon a refused write is tried again.
pub(super) const RETRY: Duration = Duration::from_secs(10);

/// The longest instance name, in bytes.
pub(super) const MAX_NAME: usize = 200;

/// The card's text for this process.
pub(super) fn text(name: Option<&str>) -> String {
    let mut text = String::new();
    if let Some(name) = name {
        text.push_str(&format!("name={name}\n"));
    }
    if let Some(host) = hostname() {
        text.push_str(&format!("host={host}\n"));
    }
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    text.push_str(&format!(
        "pid={}\nstarted_ms={started}\nlockflight={}\n",
        std::process::id(),
        env!("CARGO_PKG_VERSION")
    ));
    text
}

/// Why `name` cannot be an instance name, if it cannot: it is written on one line
/// of the card.
pub(super) fn invalid_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > MAX_NAME {
        Some("is longer than 200 bytes")
    } else if name.chars().any(char::is_control) {
        Some("contains a control character")
    } else {
        None
    }
}

/// The machine's host name (Linux: `/proc/sys/kernel/hostname`; else `HOSTNAME`).
fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())?;
    let name = name.trim();
    (!name.is_empty() && !name.chars().any(char::is_control)).then(|| name.to_owned())
}

/// `SET <card> <text> PX <TTL>`.
pub(super) fn write_cmd(inner: &Inner) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(&inner.channel)
        .arg(&inner.card)
        .arg("PX")
        .arg(TTL.as_millis() as u64);
    cmd
}

/// Writes the card; a failure is logged. Whether it was written.
pub(super) async fn write(inner: &Inner) -> bool {
    match inner.conn.query(&write_cmd(inner)).await {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(card = %inner.channel, error = %e, "writing the instance card failed");
            false
        }
    }
}

/// Rewrites the card every [`REFRESH`] (after a failure, [`RETRY`]) until `stop`
/// or the backend is gone. `written`: whether `connect` wrote it.
pub(super) async fn refresh(inner: Weak<Inner>, stop: CancellationToken, mut written: bool) {
    loop {
        let wait = if written { REFRESH } else { RETRY };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let Some(i) = inner.upgrade() else { return };
        written = tokio::select! {
            _ = stop.cancelled() => return,
            w = write(&i) => w,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_control_characters_or_no_text_are_refused() {
        assert_eq!(invalid_name("billing-7"), None);
        assert_eq!(invalid_name(""), Some("is empty"));
        assert_eq!(invalid_name("a\nb"), Some("contains a control character"));
        assert_eq!(
            invalid_name(&"x".repeat(201)),
            Some("is longer than 200 bytes")
        );
    }

    #[test]
    fn the_card_has_one_field_per_line() {
        let text = text(Some("billing 7"));
        assert!(text.starts_with("name=billing 7\n"), "{text}");
        assert!(
            text.contains(&format!("\npid={}\n", std::process::id())),
            "{text}"
        );
        assert!(text.ends_with(&format!("lockflight={}\n", env!("CARGO_PKG_VERSION"))));
    }
}
