//! Leader changes: an election's leader record changed, and its observers here
//! read it again ([`LeaderChange`]).

use super::Signals;
use super::keyed::KeySignal;
use crate::key::LockKey;

/// Interest in the changes of one election's leader record
/// ([`Signals::watch_leader`]); dropping it ends the interest.
#[derive(Debug)]
pub struct LeaderChange(KeySignal);

impl LeaderChange {
    /// The election key this handle observes.
    pub fn key(&self) -> &LockKey {
        &self.0.key
    }

    /// Resolves at the first announced change of the key's leader record (or
    /// [`wake_all`](Signals::wake_all)) since this handle was made or since
    /// the previous `changed` returned. Several changes before a call are seen
    /// as one.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change that came while no call was waiting is seen by the
    /// next call.
    pub async fn changed(&mut self) {
        self.0.changed().await;
    }
}

impl Signals {
    /// Starts observing the leader record of the election `key`: every
    /// [`leader_changed`](Self::leader_changed) of `key` and every
    /// [`wake_all`](Self::wake_all) from now on is seen by the handle, also one that
    /// comes before the handle is awaited. An observer takes the handle before it
    /// reads the record, so a change announced during the read is not missed.
    pub fn watch_leader(&self, key: &LockKey) -> LeaderChange {
        LeaderChange(KeySignal::watch(&self.leaders, key))
    }

    /// The leader record of the election `key` changed (a new leader, a new term,
    /// or none any more): its observers here read it again (a backend calls it on
    /// a leader message, or when its own write or deletion changed the record).
    /// Returns `false` if no [`LeaderChange`] handle watches `key`.
    pub fn leader_changed(&self, key: &[u8]) -> bool {
        KeySignal::send(&self.leaders, key)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A leader change before the handle is awaited is kept; several are seen as
    /// one; another key's are not seen; `wake_all` reaches every observer; the
    /// entry goes with the last handle.
    #[tokio::test]
    async fn leader_changes_reach_the_key_s_observers_and_wake_all_reaches_all() {
        let short = Duration::from_millis(20);
        let reg = Signals::new();
        let (key, other) = (LockKey::from("k"), LockKey::from("other"));
        assert!(!reg.leader_changed(b"k"), "nobody observes yet");
        let mut seen = reg.watch_leader(&key);
        let mut elsewhere = reg.watch_leader(&other);
        assert_eq!(seen.key(), &key);
        assert!(reg.leader_changed(b"k"));
        assert!(reg.leader_changed(b"k"));
        tokio::time::timeout(short, seen.changed())
            .await
            .expect("a change before the first poll is kept");
        assert!(
            tokio::time::timeout(short, seen.changed()).await.is_err(),
            "two changes before a call are one"
        );
        assert!(
            tokio::time::timeout(short, elsewhere.changed())
                .await
                .is_err(),
            "another key's change"
        );
        // A second observer of the key, made later, sees only later changes.
        let mut late = reg.watch_leader(&key);
        assert!(tokio::time::timeout(short, late.changed()).await.is_err());

        reg.wake_all();
        for handle in [&mut seen, &mut elsewhere, &mut late] {
            tokio::time::timeout(short, handle.changed())
                .await
                .expect("wake_all reaches every observer");
        }
        drop((seen, late));
        assert!(!reg.leader_changed(b"k"), "the entry went with its handles");
        assert!(reg.leader_changed(b"other"));
        drop(elsewhere);
        assert!(reg.leaders.is_empty());
    }
}
