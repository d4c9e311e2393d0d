//! Revocations: another instance queued for a key whose mutex lease this
//! instance keeps cached ([`Revocation`]).

use super::Signals;
use super::keyed::KeySignal;
use crate::key::LockKey;

/// Interest in the revocations of one key's cached mutex lease
/// ([`Signals::watch_revocation`]); dropping it ends the interest.
#[derive(Debug)]
pub struct Revocation(KeySignal);

impl Clone for Revocation {
    /// A handle that has seen what this one has: a revocation this one has not
    /// seen yet is new to the clone too.
    fn clone(&self) -> Self {
        Revocation(self.0.clone())
    }
}

impl Revocation {
    /// Whether a revocation came since this handle was made (or since the one
    /// it was cloned from last awaited [`revoked`](Self::revoked)).
    pub fn is_revoked(&self) -> bool {
        self.0.has_changed()
    }

    /// Resolves at the first revocation of the key since this handle was made.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a revocation that came while no call was waiting is seen by
    /// the next call.
    pub async fn revoked(&mut self) {
        self.0.changed().await;
    }
}

impl Signals {
    /// Starts watching for revocations of this instance's mutex lease of `key`:
    /// every [`revoke`](Self::revoke) of `key` from now on is seen by the handle,
    /// also one that comes before the handle is awaited. The locker takes the
    /// handle before it asks for a lease it may cache
    /// ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)), so a revocation that comes
    /// while the lease is in use is seen too.
    pub fn watch_revocation(&self, key: &LockKey) -> Revocation {
        Revocation(KeySignal::watch(&self.revocations, key))
    }

    /// Another instance queued for the mutex of `key` while this instance holds
    /// its lease: ends the caching of that lease if it is cached here (a backend
    /// calls it on a revocation message). Returns `false` if no
    /// [`Revocation`] handle watches `key`.
    pub fn revoke(&self, key: &[u8]) -> bool {
        KeySignal::send(&self.revocations, key)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A revocation before the handle is awaited is kept; a `revoked()` dropped
    /// before it resolved loses nothing (the next call sees the revocation); other
    /// keys' revocations are not seen; the entry goes with the last handle.
    #[tokio::test]
    async fn revocations_are_kept_across_dropped_waits_and_entries_are_removed() {
        let short = Duration::from_millis(20);
        let reg = Signals::new();
        let key = LockKey::from("k");
        assert!(!reg.revoke(b"k"), "nobody watches yet");
        let mut early = reg.watch_revocation(&key);
        assert!(reg.revoke(b"k"));
        tokio::time::timeout(short, early.revoked())
            .await
            .expect("a revocation before the first poll is kept");

        let mut late = reg.watch_revocation(&key);
        assert!(
            tokio::time::timeout(short, late.revoked()).await.is_err(),
            "an earlier revocation is not seen by a later handle"
        );
        assert!(!reg.revoke(b"other"), "another key");
        assert!(tokio::time::timeout(short, late.revoked()).await.is_err());
        // Revoked while no call waits (the previous one was dropped).
        assert!(reg.revoke(b"k"));
        tokio::time::timeout(short, late.revoked())
            .await
            .expect("seen by the next call");

        drop((early, late));
        assert!(!reg.revoke(b"k"), "the entry went with the last handle");
    }
}
