//! Who an instance is: the card it keeps while it runs.

use redis::aio::ConnectionLike;

use super::inspector::Inspector;
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

/// Who an instance is, from the card it keeps at `<prefix>:inst:<id>` while it
/// runs (rewritten every minute, expiring 3 minutes after its process stopped).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceCard {
    /// The instance id.
    pub id: String,
    /// The name its service gave it (`RedisBackendBuilder::instance_name`).
    pub name: Option<String>,
    /// Its host name.
    pub host: Option<String>,
    /// Its process id.
    pub pid: Option<u32>,
    /// When it connected, by its own clock (ms since the Unix epoch).
    pub started_ms: Option<u64>,
    /// The lockflight version it runs.
    pub version: Option<String>,
}

impl InstanceCard {
    /// Reads a card's text: `field=value` lines; unknown fields and malformed lines
    /// are skipped.
    fn parse(id: &str, text: &str) -> InstanceCard {
        let mut card = InstanceCard {
            id: id.to_owned(),
            ..InstanceCard::default()
        };
        for (field, value) in text.lines().filter_map(|l| l.split_once('=')) {
            match field {
                "name" => card.name = Some(value.to_owned()),
                "host" => card.host = Some(value.to_owned()),
                "pid" => card.pid = value.parse().ok(),
                "started_ms" => card.started_ms = value.parse().ok(),
                "lockflight" => card.version = Some(value.to_owned()),
                _ => {}
            }
        }
        card
    }
}

impl std::fmt::Display for InstanceCard {
    /// `name (host, pid N)`, with the parts the card has.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(host) = &self.host {
            parts.push(host.clone());
        }
        if let Some(pid) = self.pid {
            parts.push(format!("pid {pid}"));
        }
        match (&self.name, parts.is_empty()) {
            (Some(name), true) => write!(f, "{name}"),
            (Some(name), false) => write!(f, "{name} ({})", parts.join(", ")),
            (None, false) => write!(f, "{}", parts.join(", ")),
            (None, true) => write!(f, "instance {}", self.id),
        }
    }
}

impl Inspector {
    /// The card of the instance `id` (16 hex digits, as
    /// [`LeaseState::instance`](super::LeaseState::instance) and
    /// [`WaiterState::instance`](super::WaiterState::instance) give it): who it
    /// is. `None` when it has no card: its process stopped more than 3 minutes
    /// ago, or it runs a lockflight without cards.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `id` is not 16 hex digits; otherwise as
    /// [`Inspector::key`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn instance<C>(&self, conn: &mut C, id: &str) -> Result<Option<InstanceCard>>
    where
        C: ConnectionLike + Send,
    {
        if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::config(format!(
                "instance id {id:?} is not 16 hex digits"
            )));
        }
        let name = format!("{}:inst:{id}", self.prefix);
        let text: Option<String> = redis::cmd("GET")
            .arg(&name)
            .query_async(conn)
            .await
            .map_err(|e| {
                crate::fence::redis_error(&LockKey::from(name.clone()), Phase::Inspecting, e)
            })?;
        Ok(text.map(|t| InstanceCard::parse(id, &t)))
    }
}

#[cfg(test)]
mod tests {
    use super::InstanceCard;

    #[test]
    fn a_card_reads_its_fields_and_skips_others() {
        let card = InstanceCard::parse(
            "00000000c0ffee00",
            "name=billing=7\nhost=web-3\npid=42\nstarted_ms=x\nnew=1\nno equals sign\n",
        );
        assert_eq!(card.name.as_deref(), Some("billing=7"));
        assert_eq!(card.host.as_deref(), Some("web-3"));
        assert_eq!(card.pid, Some(42));
        assert_eq!(card.started_ms, None);
        assert_eq!(card.to_string(), "billing=7 (web-3, pid 42)");
        let bare = InstanceCard::parse("00000000c0ffee00", "");
        assert_eq!(bare.to_string(), "instance 00000000c0ffee00");
    }
}
