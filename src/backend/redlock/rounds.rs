//! Round tokens: the token each acquire round asks the nodes with (see the module
//! docs' "Rounds").
//!
//! The locker names a lease by one token `T` from its first request to its final
//! release, and asks again with `T` after a busy answer, an indeterminate one, or
//! a grant that came too late. The nodes know the lease by the **round token** of
//! the round that was granted. [`RoundTokens`] keeps, per key and `T`, the round
//! token the next round asks with:
//!
//! * the previous round's, as long as no release of it was sent: that round was
//!   granted, or its future was dropped before it ended, and asking again with its
//!   token re-grants the lease it may hold (new epoch, TTL re-armed);
//! * a fresh one once a round ended without a grant: its token is retired
//!   ([`RoundTokens::retire`]) *before* the release of what it took is sent, so
//!   no later round asks with a token a release of which may be on the wire.
//!
//! So each round token follows the rule of "The order of requests" in
//! ARCHITECTURE.md on its own (never granted again once a release of it was sent,
//! every release of it writes its record), and a failed round's release that
//! lands late, after a later round was granted on that node, finds a lock held
//! under another token and deletes nothing.
//!
//! **Invariants.**
//!
//! 1. An entry (a lease token's current round token) exists from the round that
//!    made it until that round is retired (it ended without a grant: the release
//!    of what it took is sent, and the next round makes a new entry), until a
//!    definite answer to the lease's release ([`RoundTokens::forget`]), or until
//!    it is pruned (3). Without an entry, no round token of the lease is asked
//!    with again, renewed or released: its retired rounds' grants were released,
//!    and one whose release is lost expires with its TTL.
//! 2. A retired round token is never handed out again (a fresh token is random,
//!    128 bits).
//! 3. An entry is pruned only once its lease has expired on every node for longer
//!    than a release record lives (`until` + `margin`): by then the nodes answer
//!    a renewal or a release of it "not the owner", as the backend does for a
//!    token it does not know. Pruning keeps the map bounded when a lease's
//!    releases never get an answer.
//!
//! **Lock order.** One `std::sync::Mutex`, never held across an `.await`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::LeaseToken;
use crate::key::LockKey;

/// The map is pruned once it holds this many entries (and then at twice the
/// entries left after each pruning).
const PRUNE_FROM: usize = 1024;

/// The round tokens of the leases of one backend (shared by its clones).
pub(super) struct RoundTokens {
    /// How long past its last possible expiry an entry is kept.
    margin: Duration,
    map: Mutex<Map>,
}

struct Map {
    rounds: HashMap<(LockKey, LeaseToken), Round>,
    prune_at: usize,
}

#[derive(Clone, Copy)]
struct Round {
    token: LeaseToken,
    /// The latest a lease of `token` may expire at the nodes: the send of its
    /// last acquire or renewal plus the TTL.
    until: Instant,
}

impl RoundTokens {
    /// No round tokens yet; entries are kept `margin` past their last possible
    /// expiry.
    pub(super) fn new(margin: Duration) -> RoundTokens {
        RoundTokens {
            margin,
            map: Mutex::new(Map {
                rounds: HashMap::new(),
                prune_at: PRUNE_FROM,
            }),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, Map> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token of the acquire round of `lease` about to be sent, whose grant
    /// would expire at `until` at the latest: the previous round's if no release
    /// of it was sent, else a fresh one.
    pub(super) fn asking(&self, key: &LockKey, lease: LeaseToken, until: Instant) -> LeaseToken {
        let mut map = self.map();
        if map.rounds.len() >= map.prune_at {
            let margin = self.margin;
            let now = Instant::now();
            map.rounds.retain(|_, r| r.until + margin > now);
            map.prune_at = PRUNE_FROM.max(2 * map.rounds.len());
        }
        let round = map
            .rounds
            .entry((key.clone(), lease))
            .or_insert_with(|| Round {
                token: LeaseToken::random(),
                until,
            });
        round.until = round.until.max(until);
        round.token
    }

    /// The round that asked with `round` ended without a grant, and the release of
    /// what it took is about to be sent: the next round of `lease` asks with a
    /// fresh token.
    pub(super) fn retire(&self, key: &LockKey, lease: LeaseToken, round: LeaseToken) {
        let mut map = self.map();
        let entry = (key.clone(), lease);
        if map.rounds.get(&entry).is_some_and(|r| r.token == round) {
            map.rounds.remove(&entry);
        }
    }

    /// The round token the nodes know the lease `lease` by, if a round of it may
    /// hold something; with `until`, a renewal about to be sent may keep it at
    /// the nodes until then.
    pub(super) fn current(
        &self,
        key: &LockKey,
        lease: LeaseToken,
        until: Option<Instant>,
    ) -> Option<LeaseToken> {
        let mut map = self.map();
        let round = map.rounds.get_mut(&(key.clone(), lease))?;
        if let Some(until) = until {
            round.until = round.until.max(until);
        }
        Some(round.token)
    }

    /// The release of `lease` got a definite answer: its round token is done.
    pub(super) fn forget(&self, key: &LockKey, lease: LeaseToken) {
        self.map().rounds.remove(&(key.clone(), lease));
    }

    /// How many leases have a round token (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().rounds.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LockKey {
        LockKey::from("k")
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_reuses_its_token_until_it_is_retired() {
        let rounds = RoundTokens::new(Duration::from_secs(7));
        let (t, later) = (
            LeaseToken::random(),
            Instant::now() + Duration::from_secs(1),
        );
        let first = rounds.asking(&key(), t, later);
        assert_ne!(first, t, "the nodes never see the lease token");
        assert_eq!(
            rounds.asking(&key(), t, later),
            first,
            "no release was sent"
        );
        assert_eq!(rounds.current(&key(), t, None), Some(first));
        rounds.retire(&key(), t, first);
        assert_eq!(rounds.current(&key(), t, None), None);
        let second = rounds.asking(&key(), t, later);
        assert_ne!(
            second, first,
            "a retired round token is never asked with again"
        );
        // A stale retirement changes nothing.
        rounds.retire(&key(), t, first);
        assert_eq!(rounds.current(&key(), t, None), Some(second));
        rounds.forget(&key(), t);
        assert_eq!(rounds.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn only_entries_long_expired_are_pruned() {
        let margin = Duration::from_secs(7);
        let rounds = RoundTokens::new(margin);
        let ttl = Duration::from_secs(1);
        let expired: Vec<LeaseToken> = (0..PRUNE_FROM).map(|_| LeaseToken::random()).collect();
        for &t in &expired {
            rounds.asking(&key(), t, Instant::now() + ttl);
        }
        let renewed = expired[0];
        tokio::time::advance(ttl + margin).await;
        // A renewal sent now keeps one of them.
        rounds.current(&key(), renewed, Some(Instant::now() + ttl));
        tokio::time::advance(Duration::from_millis(1)).await;
        let fresh = LeaseToken::random();
        rounds.asking(&key(), fresh, Instant::now() + ttl);
        assert_eq!(
            rounds.len(),
            2,
            "the renewed lease and the new one are left"
        );
        assert!(rounds.current(&key(), renewed, None).is_some());
        assert!(rounds.current(&key(), expired[1], None).is_none());
    }
}
