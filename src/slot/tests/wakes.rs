//! A waiter is woken by every way out of the queue.

use std::sync::Arc;
use std::time::Duration;

use super::world::*;
use crate::slot::*;

/// Counts its wakes.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Wakes {
    fn new() -> Arc<Wakes> {
        Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)))
    }

    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Polls `place`'s wait once with this waker.
    fn poll(self: &Arc<Self>, place: &mut WaiterPlace) -> Poll<Option<Grant>> {
        let waker = Waker::from(Arc::clone(self));
        let mut granted = std::pin::pin!(place.granted());
        granted.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

/// A waiter that polled is woken by every step that takes it out of the queue,
/// and then finds what that step left it: a handed-off lease, leadership from a
/// failed leader or after a backend release, nothing at its deadline or at the
/// watcher's drop. A grant in flight survives the watcher's drop, and a place
/// dropped with its grant in flight passes the grant to the next waiter.
#[test]
fn every_way_out_of_the_queue_wakes_the_waiter() {
    let world = World::new(&[], true, None);
    let (map, fwd) = (&world.map, &world.dynfwd);
    let t0 = Instant::now();
    let wait = (t0, t0 + Duration::from_secs(1));
    let join = |key: &str| Slot::join(map, &LockKey::from(key), 8, wait, fwd);
    let leader = |key: &str| match join(key) {
        Join::Leader(slot) => slot,
        other => panic!("{other:?}"),
    };
    let waiter = |key: &str| match join(key) {
        Join::Wait(place) => place,
        other => panic!("{other:?}"),
    };
    let queued = |place: &mut WaiterPlace| {
        let wakes = Wakes::new();
        assert!(wakes.poll(place).is_pending());
        wakes
    };

    // A handoff.
    let slot = leader("handoff");
    let mut place = waiter("handoff");
    let wakes = queued(&mut place);
    slot.acquired();
    let held = lease(slot.key());
    assert_eq!(
        slot.release(&held, 0, true, None, None),
        ReleaseStep::HandedOff
    );
    assert_eq!(wakes.count(), 1);
    assert!(matches!(
        wakes.poll(&mut place),
        Poll::Ready(Some(Grant::Lease(_, 0)))
    ));
    assert!(
        wakes.poll(&mut place).is_pending(),
        "a place completes once"
    );

    // Leadership from a leader that failed.
    let slot = leader("abandon");
    let mut place = waiter("abandon");
    let wakes = queued(&mut place);
    assert_eq!(
        slot.abandon(map, Inheritance::default()),
        Abandon::Succeeded
    );
    assert_eq!(wakes.count(), 1);
    assert!(matches!(
        wakes.poll(&mut place),
        Poll::Ready(Some(Grant::Leadership(_)))
    ));

    // Leadership after a backend release.
    let slot = leader("released");
    let mut place = waiter("released");
    let wakes = queued(&mut place);
    slot.acquired();
    assert_eq!(
        slot.release(&held, 0, false, None, None),
        ReleaseStep::Backend
    );
    assert_eq!(wakes.count(), 0);
    assert_eq!(slot.released(map, Inheritance::default()), None);
    assert_eq!(wakes.count(), 1);
    assert!(matches!(
        wakes.poll(&mut place),
        Poll::Ready(Some(Grant::Leadership(_)))
    ));

    // The deadline.
    let slot = leader("timeout");
    let mut place = waiter("timeout");
    let wakes = queued(&mut place);
    assert_eq!(slot.time_out(t0), Some(wait.1));
    assert_eq!(wakes.count(), 0);
    assert_eq!(slot.time_out(wait.1), None);
    assert_eq!(wakes.count(), 1);
    assert!(matches!(wakes.poll(&mut place), Poll::Ready(None)));

    // The watcher's drop, with one waiter granted and one queued.
    let slot = leader("dropped");
    let mut granted = waiter("dropped");
    let mut queued_too = waiter("dropped");
    let (wakes, wakes_too) = (queued(&mut granted), queued(&mut queued_too));
    slot.acquired();
    assert_eq!(
        slot.release(&held, 0, true, None, None),
        ReleaseStep::HandedOff
    );
    slot.watch_dropped();
    assert_eq!((wakes.count(), wakes_too.count()), (1, 1));
    assert!(matches!(
        wakes.poll(&mut granted),
        Poll::Ready(Some(Grant::Lease(..)))
    ));
    assert!(matches!(wakes_too.poll(&mut queued_too), Poll::Ready(None)));

    // A place dropped with its grant in flight.
    let slot = leader("passed on");
    let first = waiter("passed on");
    let mut second = waiter("passed on");
    let wakes = queued(&mut second);
    slot.acquired();
    assert_eq!(
        slot.release(&held, 7, true, None, None),
        ReleaseStep::HandedOff
    );
    assert_eq!(wakes.count(), 0, "the grant went to the first waiter");
    drop(first);
    assert_eq!(wakes.count(), 1);
    assert!(matches!(
        wakes.poll(&mut second),
        Poll::Ready(Some(Grant::Lease(_, 7)))
    ));
}
