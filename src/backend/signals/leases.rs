//! The leases this instance holds, by token, and the two messages that end one
//! at once: a takeover (a forced release deleted it) and a restart of the server
//! that granted it.

use std::fmt;
use std::sync::{Arc, Weak};

use dashmap::DashMap;

use super::Signals;
use crate::backend::LeaseToken;
use crate::key::LockKey;

/// The leases of one instance that a takeover can name, by token.
pub(super) type Registrations = DashMap<LeaseToken, Weak<dyn Losable>>;

/// A lease held by this instance, as the [`Signals`] knows it: what a
/// takeover message ([`Signals::take_over`]) does to it. The locker's leases
/// implement it (`lease/mod.rs`); the registry keeps only a `Weak` reference, so
/// it never keeps a lease alive.
pub(crate) trait Losable: Send + Sync {
    /// The backend deleted this lease behind its holder's back (an operator's
    /// forced release): it is lost, now.
    fn taken_over(&self);
    /// The server that granted this lease restarted without its data (or was
    /// flushed): it is lost, now.
    fn restarted(&self);
    /// The key of the lease.
    fn key(&self) -> &LockKey;
}

/// A lease's registration for takeovers ([`Signals::register`]); dropping it
/// ends the registration, unless a newer lease of the same token replaced it.
pub(crate) struct Registration {
    token: LeaseToken,
    lease: Weak<dyn Losable>,
    map: Arc<Registrations>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.map
            .remove_if(&self.token, |_, lease| Weak::ptr_eq(lease, &self.lease));
    }
}

impl Signals {
    /// Registers `lease`, held under `token`, for [`take_over`](Self::take_over)
    /// until the returned handle is dropped. A later registration of the same
    /// token (a re-grant: an acquire asked again after an answer that came too
    /// late) replaces this one, and dropping this handle then leaves it in place.
    pub(crate) fn register(&self, token: LeaseToken, lease: Weak<dyn Losable>) -> Registration {
        self.registered.insert(token, Weak::clone(&lease));
        Registration {
            token,
            lease,
            map: Arc::clone(&self.registered),
        }
    }

    /// The backend deleted the lease `token` of this instance on an operator's
    /// order (a forced release; a backend calls it on a takeover message): the
    /// lease registered under `token`, if one is, is marked lost at once, with a
    /// reason that says so. Other leases, of the same key too, are not touched.
    /// Returns `false` if no live lease of this instance holds `token` (it was
    /// released meanwhile, or the token is not this instance's).
    ///
    /// A token names one lease at the backend (a token is never granted again
    /// once a release of it was sent), so a late message never reaches a later
    /// lease.
    pub fn take_over(&self, token: LeaseToken) -> bool {
        // Upgraded outside the map's shard lock: marking a lease lost wakes its
        // observers.
        let lease = self
            .registered
            .get(&token)
            .map(|entry| Weak::clone(entry.value()));
        match lease.and_then(|lease| lease.upgrade()) {
            Some(lease) => {
                lease.taken_over();
                true
            }
            None => false,
        }
    }

    /// The backend's server restarted without its data (a backend calls it when
    /// it hears a new life of its server: `redis/life.rs`): every lease
    /// registered here whose key `lost_there` names (on a Cluster, those of the
    /// restarted slot) is marked lost at once, with a reason that says so.
    /// Returns how many live leases were.
    pub fn restarted(&self, lost_there: impl Fn(&LockKey) -> bool) -> usize {
        // Collected first: marking a lease lost wakes its observers, outside the
        // map's shard locks.
        let leases: Vec<_> = self
            .registered
            .iter()
            .filter_map(|entry| entry.value().upgrade())
            .filter(|lease| lost_there(lease.key()))
            .collect();
        for lease in &leases {
            lease.restarted();
        }
        leases.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    /// A lease marked by `taken_over`.
    #[derive(Default)]
    struct Marked(std::sync::atomic::AtomicBool);

    impl Losable for Marked {
        fn taken_over(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
        fn restarted(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
        fn key(&self) -> &LockKey {
            static KEY: std::sync::LazyLock<LockKey> =
                std::sync::LazyLock::new(|| LockKey::from("marked"));
            &KEY
        }
    }

    impl Marked {
        fn is_marked(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A takeover reaches exactly the lease registered under its token; a newer
    /// registration of the same token replaces the older one (whose handle then
    /// leaves it in place); a dropped registration or lease is not reached.
    #[test]
    fn a_takeover_marks_exactly_the_lease_of_its_token() {
        let reg = Signals::new();
        let (t1, t2) = (LeaseToken::for_instance(1), LeaseToken::for_instance(1));
        let (first, other) = (Arc::new(Marked::default()), Arc::new(Marked::default()));
        let weak = |m: &Arc<Marked>| Arc::downgrade(m) as Weak<dyn Losable>;
        let h1 = reg.register(t1, weak(&first));
        let h2 = reg.register(t2, weak(&other));
        assert!(
            !reg.take_over(LeaseToken::for_instance(1)),
            "nobody's token"
        );
        assert!(reg.take_over(t1));
        assert!(first.is_marked() && !other.is_marked(), "only t1's lease");

        // t1 granted again to a new lease (an inherited token): the old handle's
        // drop leaves the new registration.
        let renewed = Arc::new(Marked::default());
        let h3 = reg.register(t1, weak(&renewed));
        drop(h1);
        assert!(reg.take_over(t1));
        assert!(renewed.is_marked());
        drop(h3);
        assert!(!reg.take_over(t1), "the registration went with its handle");

        // A lease dropped while registered is not reached.
        drop(other);
        assert!(!reg.take_over(t2));
        drop(h2);
        assert!(reg.registered.is_empty());
    }
}
