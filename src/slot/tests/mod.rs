//! Exhaustive interleaving tests of the slot state machine.
//!
//! Every slot transition is one synchronous step under the slot's mutex, and the
//! async work of a task happens between its steps. So the behaviours of a few
//! concurrent tasks are exactly the interleavings of their steps. These tests
//! enumerate *all* of them (depth-first, replaying each schedule from scratch) for
//! small scenarios, and check after every step and at the end:
//!
//! * at most one task holds the key (one holder);
//! * a task that never gives up always ends up holding the key (no lost waiter,
//!   no lost grant);
//! * when every task is done, the slot map is empty and no background release is
//!   pending.
//!
//! With lease caching on, a release that finds nobody waiting keeps the lease,
//! and the timer that takes it back (`Action::Expire`) is one more step that can
//! run at any point after it: either the lease's linger task waking past its
//! deadline (`Slot::linger`; one task per lease, started by the caching that found
//! none running) or, for a contended caching, a timer of that caching alone
//! (`Slot::expire`). A stale timer (the lease was taken again meanwhile) must
//! change nothing, and no cached lease may be left without a timer.
//!
//! Waiters' deadlines are the slot watcher's: the model keeps a clock, gives the
//! tasks that may give up a deadline each (1, 2, 3 s: they can time out) and the
//! patient ones a deadline the clock never reaches, and makes the watcher's wake
//! one more step (`Action::Watch`) that can run at any point while a watcher runs:
//! at its alarm (the clock moves there and the due waiters are dropped), or, once
//! its slot has no waiter, early (as when the slot going idle wakes it), to end.
//! Once per schedule the watcher may instead be dropped with its runtime
//! (`Action::WatchDropped`): every waiter is dropped, and a waiter whose
//! deadline has not passed joins again. A dropped waiter observes it
//! (`Action::Observe`) at any later point, racing every other step.

mod caching;
mod deadlines;
mod races;
mod wakes;
mod world;
