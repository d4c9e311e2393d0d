//! The leader record: [`LeaderInfo`], and its encoding at the backend.
//!
//! `<epoch:20 digits><seq:20 digits>:<since in ms>:<identity>`: the term first, as
//! 40 digits, so that the backend compares terms as strings.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::lease::FencingToken;

/// Who leads an election: read from the leader record by
/// [`Election::leader`](super::Election::leader) and
/// [`Election::observe`](super::Election::observe).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The identity the leader campaigned with.
    pub identity: String,
    /// The leader's term: its lease's fencing token.
    pub term: FencingToken,
    /// When the leader gained leadership, by its own wall clock.
    pub since: SystemTime,
}

/// The record of `info`.
pub(super) fn encode(info: &LeaderInfo) -> Vec<u8> {
    let since = info
        .since
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!(
        "{:020}{:020}:{since}:{}",
        info.term.epoch, info.term.seq, info.identity
    )
    .into_bytes()
}

/// The leader a record names; `None` for a record this version cannot read.
pub(crate) fn decode(record: &[u8]) -> Option<LeaderInfo> {
    let text = std::str::from_utf8(record).ok()?;
    let (epoch, rest) = (text.get(..20)?, text.get(20..)?);
    let (seq, rest) = (rest.get(..20)?, rest.get(20..)?);
    let (since, identity) = rest.strip_prefix(':')?.split_once(':')?;
    Some(LeaderInfo {
        identity: identity.to_owned(),
        term: FencingToken::new(epoch.parse().ok()?, seq.parse().ok()?),
        since: UNIX_EPOCH + Duration::from_millis(since.parse().ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_to_what_was_encoded_and_orders_by_term() {
        let info = LeaderInfo {
            identity: "scheduler:7".into(),
            term: FencingToken::new(42, 3),
            since: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        };
        let record = encode(&info);
        assert_eq!(decode(&record), Some(info.clone()));
        let later = encode(&LeaderInfo {
            term: FencingToken::new(42, 4),
            ..info
        });
        assert!(later[..40] > record[..40]);
        assert_eq!(decode(b"garbage"), None);
    }
}
