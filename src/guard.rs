//! What a task holds: [`LockGuard`] (or a [`MultiGuard`] over several keys), the
//! [`FencingToken`] it carries, and how it learns of a loss: [`LossSignal`] and
//! the [`Loss`] future. [`LockInfo`] is what guarded work receives.
//!
//! The read-write guards ([`ReadGuard`](crate::rwlock::ReadGuard),
//! [`WriteGuard`](crate::rwlock::WriteGuard)) and semaphore
//! [`Permit`](crate::semaphore::Permit)s carry the same [`LossSignal`], [`Loss`]
//! future and [`FencingToken`]s.

// The guards are defined with what they hold: the lease's view with the lease
// (`lease::view`), the guards with their lock (`locker`, `multi`). This module
// is only their public path: it sits above `multi`, and the crate's own code
// below it imports the defining modules, so its imports run down.
pub use crate::lease::{FencingToken, LockInfo, Loss, LossSignal};
pub use crate::locker::LockGuard;
pub use crate::multi::MultiGuard;
