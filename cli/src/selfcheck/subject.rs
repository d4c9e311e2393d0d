//! The lock under test ([`Subject`]), what it hands out, and lockflight itself as
//! one, connected directly or through the fault proxy.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::inspect::Inspector;
use lockflight::{Error, FencingToken, Handoff, LockGuard, Locker, RedisBackend};

use crate::proxy::FaultProxy;
use crate::redact;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a release reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// It removed the lease.
    Done,
    /// The lease was gone (expired, taken over).
    Lost,
    /// Another error.
    Failed(String),
}

/// A held critical section of the lock under test.
pub(crate) struct Held {
    pub(crate) token: FencingToken,
    /// Whether the lock has told its holder the lease is lost.
    pub(crate) is_lost: Box<dyn Fn() -> bool + Send + Sync>,
    pub(crate) release: BoxFuture<'static, Release>,
}

/// A lock under test: one per instance.
pub(crate) trait Subject: Send + Sync + 'static {
    /// Takes `key`, waiting for it.
    fn acquire(&self, key: String) -> BoxFuture<'_, Result<Held, String>>;
    /// Whether anything holds `key` now (read from the server).
    fn is_held(&self, key: String) -> BoxFuture<'_, Result<bool, String>>;
    /// Stops (`true`) or resumes all of this instance's traffic, as a stopped
    /// and continued process.
    fn pause(&self, paused: bool);
}

/// lockflight itself, connected directly or through a fault proxy.
pub(super) struct Lockflight {
    locker: Locker,
    inspector: Inspector,
    data: redis::aio::MultiplexedConnection,
    proxy: Option<Arc<FaultProxy>>,
}

impl Subject for Lockflight {
    fn acquire(&self, key: String) -> BoxFuture<'_, Result<Held, String>> {
        Box::pin(async move {
            let guard = self.locker.lock(key).await.map_err(|e| e.to_string())?;
            let token = guard.fencing_token();
            let guard: Arc<Mutex<Option<LockGuard>>> = Arc::new(Mutex::new(Some(guard)));
            let watched = Arc::clone(&guard);
            Ok(Held {
                token,
                is_lost: Box::new(move || {
                    watched
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_ref()
                        .is_some_and(LockGuard::is_lost)
                }),
                release: Box::pin(async move {
                    let guard = guard.lock().unwrap_or_else(|p| p.into_inner()).take();
                    match guard {
                        Some(guard) => match guard.release().await {
                            Ok(()) => Release::Done,
                            Err(Error::LeaseLost { .. }) => Release::Lost,
                            Err(e) => Release::Failed(e.to_string()),
                        },
                        None => Release::Failed("released twice".into()),
                    }
                }),
            })
        })
    }

    fn is_held(&self, key: String) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async move {
            let mut data = self.data.clone();
            self.inspector
                .key(&mut data, key)
                .await
                .map(|state| state.is_held())
                .map_err(|e| e.to_string())
        })
    }

    fn pause(&self, paused: bool) {
        if let Some(proxy) = &self.proxy {
            proxy.pause(paused);
        }
    }
}

/// The server's address of `url` (for the proxy), and the URL with the proxy's
/// port on 127.0.0.1 in its place (credentials and database kept).
pub(super) async fn through_proxy(
    url: &str,
) -> Result<(SocketAddr, impl Fn(u16) -> String), String> {
    let parsed = redis::parse_redis_url(url)
        .filter(|u| u.scheme() == "redis")
        .ok_or("only redis:// URLs (TCP without TLS) can be proxied")?;
    let host = parsed.host_str().ok_or("the URL has no host")?.to_owned();
    let port = parsed.port().unwrap_or(6379);
    let target = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} resolves to no address"))?;
    Ok((target, move |proxy_port: u16| {
        let mut via = parsed.clone();
        let _ = via.set_host(Some("127.0.0.1"));
        let _ = via.set_port(Some(proxy_port));
        via.to_string()
    }))
}

/// An instance on `url` (lease TTL `ttl`, waits at most `wait`); with a proxy,
/// without local handoff, so that every critical section sends its own acquire
/// and release through it.
pub(super) async fn instance(
    url: &str,
    prefix: &str,
    data: &redis::aio::MultiplexedConnection,
    ttl: Duration,
    wait: Duration,
    proxy: Option<Arc<FaultProxy>>,
) -> Result<Lockflight, String> {
    // Through a client of the command's own: a `rediss://` URL gets the
    // certificates of the `--tls-…` options.
    let client = crate::tls::client(url).map_err(|e| format!("bad URL {}: {e}", redact(url)))?;
    let backend = RedisBackend::from_client(client)
        .prefix(prefix)
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut locker = Locker::builder(backend).lease_ttl(ttl).wait_timeout(wait);
    if proxy.is_some() {
        locker = locker.handoff(Handoff::disabled());
    }
    let locker = locker.build().map_err(|e| e.to_string())?;
    Ok(Lockflight {
        locker,
        inspector: Inspector::new(prefix),
        data: data.clone(),
        proxy,
    })
}
