//! What the test proxies share: a loopback listener, one relayed connection to the
//! target per client, connection counts, and abrupt resets.
//!
//! A proxy supplies only its [`Pumps`] (how bytes move in each direction); the
//! [`Relay`] accepts, connects, counts and resets.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A boxed future (the harness needs no `futures` crate for it).
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How one proxy moves bytes between a client and the server.
pub(crate) trait Pumps: Send + Sync + 'static {
    /// Resolves when a new connection may be connected through (a black hole
    /// holds new connections until it is turned off).
    fn passable(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Moves bytes both ways until either direction ends (or fails).
    fn run<'a>(
        &'a self,
        from_client: ReadHalf<'a>,
        to_client: WriteHalf<'a>,
        from_server: ReadHalf<'a>,
        to_server: WriteHalf<'a>,
    ) -> BoxFuture<'a, ()>;
}

/// Connection bookkeeping of one relay.
#[derive(Debug)]
struct Conns {
    target: SocketAddr,
    resets: watch::Sender<u64>,
    open: AtomicUsize,
    accepted: AtomicU64,
}

/// A listener on 127.0.0.1 relaying every client to `target` through a proxy's
/// `Pumps`. Dropping it stops the listener and aborts every connection task
/// (the sockets close). Must be created inside a tokio runtime.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    conns: Arc<Conns>,
    accept_task: JoinHandle<()>,
}

impl Relay {
    /// Listens on a free port of 127.0.0.1 and relays to `target`.
    pub(crate) fn start(target: SocketAddr, pumps: Arc<impl Pumps>) -> Relay {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy on 127.0.0.1:0");
        std_listener
            .set_nonblocking(true)
            .expect("set the proxy listener non-blocking");
        let addr = std_listener.local_addr().expect("proxy local_addr");
        let listener = TcpListener::from_std(std_listener).expect("register the proxy listener");
        let conns = Arc::new(Conns {
            target,
            resets: watch::Sender::new(0),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&conns), pumps));
        Relay {
            addr,
            conns,
            accept_task,
        }
    }

    /// `redis://127.0.0.1:PROXYPORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where it relays to.
    pub fn target(&self) -> SocketAddr {
        self.conns.target
    }

    /// Closes every connection open now, abruptly (TCP RST to both the client
    /// and the server). Returns at once; the connections close within
    /// moments (see [`open_connections`](Self::open_connections)). Later
    /// connections work normally.
    pub fn reset_all(&self) {
        self.conns.resets.send_modify(|generation| *generation += 1);
    }

    /// The number of client connections open through the proxy.
    pub fn open_connections(&self) -> usize {
        self.conns.open.load(Ordering::SeqCst)
    }

    /// The number of client connections accepted since the start.
    pub fn accepted(&self) -> u64 {
        self.conns.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The accept task owns the JoinSet of connection tasks: aborting it
        // drops the set, which aborts every connection task.
        self.accept_task.abort();
    }
}

/// Decrements the open-connection count when a connection task ends.
struct OpenGuard(Arc<Conns>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept_loop(listener: TcpListener, conns: Arc<Conns>, pumps: Arc<impl Pumps>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    conns.accepted.fetch_add(1, Ordering::SeqCst);
                    conns.open.fetch_add(1, Ordering::SeqCst);
                    let guard = OpenGuard(Arc::clone(&conns));
                    // Subscribed now: only resets from now on close it.
                    let resets = conns.resets.subscribe();
                    let pumps = Arc::clone(&pumps);
                    connections.spawn(async move {
                        relay(client, guard.0.target, resets, &*pumps).await;
                        drop(guard);
                    });
                }
                // E.g. out of file descriptors: wait a little, go on.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn relay(
    mut client: TcpStream,
    target: SocketAddr,
    mut resets: watch::Receiver<u64>,
    pumps: &impl Pumps,
) {
    let _ = client.set_nodelay(true);
    let connect = async {
        pumps.passable().await;
        TcpStream::connect(target).await
    };
    let mut server = tokio::select! {
        connected = connect => match connected {
            Ok(server) => server,
            Err(_) => {
                // Like a refused connection: close the client abruptly.
                let _ = client.set_zero_linger();
                return;
            }
        },
        _ = resets.changed() => {
            let _ = client.set_zero_linger();
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let was_reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        tokio::select! {
            _ = pumps.run(client_read, client_write, server_read, server_write) => false,
            _ = resets.changed() => true,
        }
    };
    if was_reset {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
    // Dropping the sockets closes both sides (RST if reset).
}
