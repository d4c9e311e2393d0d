//! [`CountingProxy`]: counts RESP commands, delays, black-holes and resets traffic.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use tokio::net::tcp::{ReadHalf, WriteHalf};

use super::relay::{BoxFuture, Pumps, Relay};
use super::*;

// ---------------------------------------------------------------------------
// CountingProxy
// ---------------------------------------------------------------------------

/// A TCP proxy on 127.0.0.1 in front of a server, which counts the RESP
/// commands clients send through it and injects faults.
///
/// Every accepted connection opens its own connection to the target and is
/// served by a spawned task. Dropping the proxy stops the listener and aborts
/// every connection task (the sockets close). Must be created inside a tokio
/// runtime.
pub struct CountingProxy {
    relay: Relay,
    inner: Arc<ProxyInner>,
}

struct ProxyInner {
    commands: AtomicU64,
    delay_nanos: AtomicU64,
    blackhole: watch::Sender<bool>,
}

impl std::ops::Deref for CountingProxy {
    type Target = Relay;

    /// The address, the connection counts and `reset_all`.
    fn deref(&self) -> &Relay {
        &self.relay
    }
}

impl CountingProxy {
    /// A proxy in front of `server` (it keeps working across restarts, which
    /// keep the port).
    pub async fn start(server: &RedisServer) -> CountingProxy {
        CountingProxy::start_to(server.addr()).await
    }

    /// A proxy in front of any TCP address.
    pub async fn start_to(target: SocketAddr) -> CountingProxy {
        let inner = Arc::new(ProxyInner {
            commands: AtomicU64::new(0),
            delay_nanos: AtomicU64::new(0),
            blackhole: watch::Sender::new(false),
        });
        CountingProxy {
            relay: Relay::start(target, Arc::clone(&inner)),
            inner,
        }
    }

    /// A client for [`url`](Relay::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis::Client::open on the proxy's URL")
    }

    /// A client for [`url`](Relay::url) whose connections skip the `CLIENT
    /// SETINFO` handshake, so that [`commands`](Self::commands) counts only
    /// the test's own commands.
    pub fn quiet_client(&self) -> redis::Client {
        use redis::IntoConnectionInfo;
        let info = self
            .url()
            .into_connection_info()
            .expect("parse the proxy's URL");
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        redis::Client::open(info.set_redis_settings(settings))
            .expect("redis::Client::open on the proxy's address")
    }

    /// A new multiplexed connection through the proxy (10 s response timeout,
    /// 5 s connection timeout). Its handshake counts 2 commands (`CLIENT
    /// SETINFO` x 2).
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        connection_for(&self.client()).await
    }

    /// The number of complete RESP commands forwarded from clients to the
    /// server since the start or the last [`reset`](Self::reset). A command is
    /// counted just before its last byte is forwarded, so once its reply has
    /// arrived it is always included.
    pub fn commands(&self) -> u64 {
        self.inner.commands.load(Ordering::SeqCst)
    }

    /// Sets the command count to 0.
    pub fn reset(&self) {
        self.inner.commands.store(0, Ordering::SeqCst);
    }

    /// Delays every chunk forwarded from a client to the server by `delay`
    /// (`Duration::ZERO` turns it off).
    pub fn set_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.inner.delay_nanos.store(nanos, Ordering::SeqCst);
    }

    /// While on, nothing is forwarded in either direction and new connections
    /// are not connected through, but nothing is closed: like a network
    /// partition. Data that arrives meanwhile is held and delivered once it is
    /// turned off (as TCP would retransmit it).
    pub fn blackhole(&self, on: bool) {
        self.inner.blackhole.send_replace(on);
    }
}

impl std::fmt::Debug for CountingProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingProxy")
            .field("addr", &self.addr())
            .field("target", &self.target())
            .field("commands", &self.commands())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

impl Pumps for ProxyInner {
    fn passable(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            let mut blackhole = self.blackhole.subscribe();
            wait_passable(&mut blackhole).await;
        })
    }

    fn run<'a>(
        &'a self,
        from_client: ReadHalf<'a>,
        to_client: WriteHalf<'a>,
        from_server: ReadHalf<'a>,
        to_server: WriteHalf<'a>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            tokio::select! {
                _ = pump(from_client, to_server, true, self) => {}
                _ = pump(from_server, to_client, false, self) => {}
            }
        })
    }
}

/// Forwards `from` to `to` until end of file or an error. `to_server`:
/// count commands and apply the delay.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    to_server: bool,
    inner: &ProxyInner,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut counter = RespCommandCounter::default();
    let mut blackhole = inner.blackhole.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        wait_passable(&mut blackhole).await;
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if to_server {
            let delay = Duration::from_nanos(inner.delay_nanos.load(Ordering::SeqCst));
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        // Turned on while the read was pending: hold the data.
        wait_passable(&mut blackhole).await;
        if to_server {
            let complete = counter.feed(&buf[..n]);
            if complete > 0 {
                inner.commands.fetch_add(complete, Ordering::SeqCst);
            }
        }
        to.write_all(&buf[..n]).await?;
    }
}

async fn wait_passable(blackhole: &mut watch::Receiver<bool>) {
    // The sender lives in ProxyInner, which outlives every connection task.
    let _ = blackhole.wait_for(|on| !*on).await;
}
