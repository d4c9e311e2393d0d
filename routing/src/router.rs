//! A tower service that routes each request to an inner service by its key.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::{Context, Poll};

use lockflight::LockKey;
use lockflight::layer::KeyExtractor;
use pin_project::pin_project;
use tower::BoxError;
use tower::util::{Oneshot, ServiceExt};
use tower_service::Service;

use super::{Rendezvous, RoutingError};

/// Routes each request to one of several inner services by the request's
/// [`LockKey`] (from a [`KeyExtractor`]: a closure `Fn(&Req) -> Option<LockKey>`,
/// [`KeyFrom`](lockflight::layer::KeyFrom)), so that all requests for one key meet on one
/// instance. Routing never replaces the lock: see the [module
/// documentation](super#routing-makes-the-lock-cheap-it-never-replaces-it).
///
/// Members are chosen by weighted [`Rendezvous`] hashing over their names: routers with
/// the same members send every key to the same member, and a membership change moves only
/// the keys of the member removed, marked down, added or marked up. Membership lives
/// behind a [`RouterHandle`] shared by all clones and may change at any time; a request
/// is routed by the membership when [`call`](Service::call) runs and stays with that
/// member. A request without a key goes to the up members in turn, or fails after
/// [`reject_keyless`](Self::reject_keyless).
///
/// `poll_ready` is always ready; the [`ResponseFuture`] drives a clone of the chosen member
/// (hence `S: Clone`: keep it cheap) with [`ServiceExt::oneshot`], so a member not ready
/// delays only its own requests: put concurrency limits inside the members.
///
/// Errors are [`BoxError`]s: the inner service's, or a [`RoutingError`]
/// ([`NoMembers`](RoutingError::NoMembers) when no member is up, [`NoKey`](RoutingError::NoKey);
/// recover with `downcast_ref`); never a panic. With an inner error type of exactly
/// `BoxError`, awaiting the future directly in a `Send` async block may not compile
/// (rust-lang/rust#110338): use a concrete error type, or box the future in a plain function.
///
/// ```
/// use std::convert::Infallible;
/// use lockflight::LockKey;
/// use lockflight_routing::KeyRouter;
/// use tower::{service_fn, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let instance = |name: &'static str| service_fn(move |_req: String| async move {
///     Ok::<_, Infallible>(name)
/// });
/// let router = KeyRouter::new(|req: &String| req.strip_prefix("sku=").map(LockKey::from));
/// let members = router.handle();
/// members.add("instance-a", instance("instance-a"));
/// members.add("instance-b", instance("instance-b"));
///
/// let first = router.clone().oneshot("sku=555".to_string()).await?;
/// let again = router.clone().oneshot("sku=555".to_string()).await?;
/// assert_eq!(first, again); // one key, one instance
/// assert_eq!(members.route("555").as_deref(), Some(first));
///
/// members.mark_down(first); // its keys move to the other instance …
/// let moved = router.clone().oneshot("sku=555".to_string()).await?;
/// assert_ne!(moved, first);
/// members.mark_up(first); // … and come back
/// assert_eq!(router.oneshot("sku=555".to_string()).await?, first);
/// # Ok(())
/// # }
/// ```
pub struct KeyRouter<S, E> {
    extractor: E,
    members: RouterHandle<S>,
    reject_keyless: bool,
}

impl<S, E> KeyRouter<S, E> {
    /// A router with no members yet, taking keys with `extractor`. Add members
    /// through [`handle`](Self::handle).
    pub fn new(extractor: E) -> Self {
        RouterHandle::new().router(extractor)
    }

    /// Fails keyless requests with [`RoutingError::NoKey`] instead of spreading them
    /// round robin.
    pub fn reject_keyless(mut self) -> Self {
        self.reject_keyless = true;
        self
    }

    /// A handle to this router's membership, shared with its clones.
    pub fn handle(&self) -> RouterHandle<S> {
        self.members.clone()
    }
}

impl<S, E: Clone> Clone for KeyRouter<S, E> {
    fn clone(&self) -> Self {
        KeyRouter {
            extractor: self.extractor.clone(),
            members: self.members.clone(),
            reject_keyless: self.reject_keyless,
        }
    }
}

impl<S, E: fmt::Debug> fmt::Debug for KeyRouter<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRouter")
            .field("extractor", &self.extractor)
            .field("members", &self.members)
            .field("reject_keyless", &self.reject_keyless)
            .finish()
    }
}

impl<S, E, Req> Service<Req> for KeyRouter<S, E>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    E: KeyExtractor<Req>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req>;

    /// Always ready: readiness is checked per call, on the chosen member (see the
    /// type's documentation).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // The extractor is user code: run it before taking the lock.
        let key = self.extractor.extract(&req);
        let chosen = match &key {
            Some(key) => self.members.service_for(key),
            None if self.reject_keyless => Err(RoutingError::NoKey),
            None => self.members.next_service(),
        };
        let state = match chosen {
            Ok(service) => State::Routed(service.oneshot(req)),
            Err(error) => State::Failed(Some(error)),
        };
        ResponseFuture { state }
    }
}

/// The response future of [`KeyRouter`]: the chosen member's service driven to
/// readiness and called ([`Oneshot`]), or the routing error.
///
/// `Send` when the inner service, its future and the request are.
#[pin_project]
pub struct ResponseFuture<S: Service<Req>, Req> {
    #[pin]
    state: State<S, Req>,
}

#[pin_project(project = StateProj)]
enum State<S: Service<Req>, Req> {
    Routed(#[pin] Oneshot<S, Req>),
    Failed(Option<RoutingError>),
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Routed(inner) => inner.poll(cx).map_err(Into::into),
            StateProj::Failed(error) => Poll::Ready(Err(error
                .take()
                .expect("ResponseFuture polled after completion")
                .into())),
        }
    }
}

impl<S: Service<Req>, Req> fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Routed(_) => "Routed",
            State::Failed(_) => "Failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

/// The shared, changeable membership of one or more [`KeyRouter`]s.
///
/// Cheap to clone; all clones and all routers made from them see the same members.
/// Members are named; a name's UTF-8 bytes are what [`Rendezvous`] hashes, so give
/// every instance the same name in every gateway. Each member has a weight (1.0
/// unless added with [`add_weighted`](Self::add_weighted)) and is up or down; only
/// up members receive requests.
///
/// Every method takes a short-lived `std::sync::RwLock` guard (never held across an
/// `.await`, never while user code runs), so it is fine to call from async code and
/// concurrently with routing.
pub struct RouterHandle<S> {
    membership: Arc<Membership<S>>,
}

/// The members behind a [`RouterHandle`], shared by its clones.
struct Membership<S> {
    members: RwLock<Members<S>>,
    /// Round-robin position for keyless requests.
    next: AtomicUsize,
}

struct Members<S> {
    up: Rendezvous<Slot<S>>,
    down: HashMap<String, (Slot<S>, f64)>,
}

/// A member: its name (what is hashed) and its service.
struct Slot<S> {
    name: String,
    service: S,
}

impl<S> AsRef<[u8]> for Slot<S> {
    fn as_ref(&self) -> &[u8] {
        self.name.as_bytes()
    }
}

impl<S> Clone for RouterHandle<S> {
    fn clone(&self) -> Self {
        RouterHandle {
            membership: Arc::clone(&self.membership),
        }
    }
}

impl<S> Default for RouterHandle<S> {
    fn default() -> Self {
        RouterHandle {
            membership: Arc::new(Membership {
                members: RwLock::new(Members {
                    up: Rendezvous::new(),
                    down: HashMap::new(),
                }),
                next: AtomicUsize::new(0),
            }),
        }
    }
}

impl<S> fmt::Debug for RouterHandle<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.members()).finish()
    }
}

impl<S> RouterHandle<S> {
    /// An empty membership.
    pub fn new() -> Self {
        Self::default()
    }

    /// A router over this membership, taking keys with `extractor`. Routers with
    /// different extractors can share one membership.
    pub fn router<E>(&self, extractor: E) -> KeyRouter<S, E> {
        KeyRouter {
            extractor,
            members: self.clone(),
            reject_keyless: false,
        }
    }

    /// Adds an up member with weight 1.0, or replaces the service of the member with
    /// this name (keeping its weight and its up or down mark), returning the service
    /// it replaced.
    pub fn add(&self, name: impl Into<String>, service: S) -> Option<S> {
        let name = name.into();
        let mut members = self.write();
        if let Some((slot, _)) = members.down.get_mut(&name) {
            return Some(std::mem::replace(&mut slot.service, service));
        }
        let weight = members.up.weight(name.as_bytes()).unwrap_or(1.0);
        members
            .up
            .add(Slot { name, service }, weight)
            .ok()
            .flatten()
            .map(|old| old.service)
    }

    /// Adds an up member with `weight` (its share of keys is `weight / Σ weights`),
    /// or replaces the service and weight of the member with this name (keeping its
    /// up or down mark), returning the service it replaced.
    ///
    /// # Errors
    ///
    /// [`RoutingError::InvalidWeight`] when `weight` is not finite or not greater
    /// than zero; nothing changes then.
    pub fn add_weighted(
        &self,
        name: impl Into<String>,
        service: S,
        weight: f64,
    ) -> Result<Option<S>, RoutingError> {
        if !(weight.is_finite() && weight > 0.0) {
            return Err(RoutingError::InvalidWeight(weight));
        }
        let name = name.into();
        let mut members = self.write();
        if let Some((slot, w)) = members.down.get_mut(&name) {
            *w = weight;
            return Ok(Some(std::mem::replace(&mut slot.service, service)));
        }
        Ok(members
            .up
            .add(Slot { name, service }, weight)?
            .map(|old| old.service))
    }

    /// Removes the member with this name, up or down, returning its service. Only
    /// its keys move, spreading over the remaining up members.
    pub fn remove(&self, name: &str) -> Option<S> {
        let mut members = self.write();
        if let Some(slot) = members.up.remove(name) {
            return Some(slot.service);
        }
        members.down.remove(name).map(|(slot, _)| slot.service)
    }

    /// Marks the member with this name down: it keeps its place in the membership
    /// but receives no requests, and its keys spread over the up members. Returns
    /// whether it was up.
    pub fn mark_down(&self, name: &str) -> bool {
        let mut members = self.write();
        let Some(weight) = members.up.weight(name) else {
            return false;
        };
        let Some(slot) = members.up.remove(name) else {
            return false;
        };
        members.down.insert(slot.name.clone(), (slot, weight));
        true
    }

    /// Marks the member with this name up again: exactly the keys it had before it
    /// went down come back to it. Returns whether it was down.
    pub fn mark_up(&self, name: &str) -> bool {
        let mut members = self.write();
        let Some((slot, weight)) = members.down.remove(name) else {
            return false;
        };
        // The weight was checked when the member was added, so this cannot fail.
        members.up.add(slot, weight).is_ok()
    }

    /// The name of the member `key` is routed to now, or `None` when no member is
    /// up.
    pub fn route(&self, key: impl AsRef<[u8]>) -> Option<String> {
        self.read().up.pick(key).map(|slot| slot.name.clone())
    }

    /// Every member as `(name, up)`, sorted by name.
    pub fn members(&self) -> Vec<(String, bool)> {
        let members = self.read();
        let mut all: Vec<(String, bool)> = members
            .up
            .iter()
            .map(|(slot, _)| (slot.name.clone(), true))
            .chain(members.down.keys().map(|name| (name.clone(), false)))
            .collect();
        all.sort();
        all
    }

    fn read(&self) -> RwLockReadGuard<'_, Members<S>> {
        // Membership is consistent after every statement that changes it, so a
        // panic elsewhere while a guard was held leaves nothing half done.
        self.membership
            .members
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Members<S>> {
        self.membership
            .members
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<S: Clone> RouterHandle<S> {
    fn service_for(&self, key: &LockKey) -> Result<S, RoutingError> {
        self.read()
            .up
            .pick(key.as_bytes())
            .map(|slot| slot.service.clone())
            .ok_or(RoutingError::NoMembers)
    }

    fn next_service(&self) -> Result<S, RoutingError> {
        let members = self.read();
        let len = members.up.len();
        if len == 0 {
            return Err(RoutingError::NoMembers);
        }
        let i = self.membership.next.fetch_add(1, Ordering::Relaxed) % len;
        members
            .up
            .iter()
            .nth(i)
            .map(|(slot, _)| slot.service.clone())
            .ok_or(RoutingError::NoMembers)
    }
}
