//! A loopback TCP proxy for `selfcheck`'s faults, in front of the user's server:
//! it listens on an ephemeral port of 127.0.0.1 only, relays bytes unchanged
//! (it never parses nor stores them), and can
//!
//! * **lose replies**: after it forwarded a client's request, with a chance per
//!   request and up to a budget, it stops forwarding that connection's replies
//!   and cuts the connection 100 ms later, so the server has applied the request
//!   but the client never learns its result;
//! * **pause** its clients: while paused, nothing is forwarded either way (a
//!   stopped process, as the server sees it); what was held back flows on when
//!   the pause ends.
//!
//! Dropping the proxy closes the listener and every relayed connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// How long a doomed connection lives after the request whose reply it loses,
/// so that the server has applied it.
const CUT_AFTER: Duration = Duration::from_millis(100);

struct State {
    /// Chance, in thousandths, that a forwarded request loses its reply.
    cut_chance: AtomicU32,
    /// How many more replies may be lost.
    cut_budget: AtomicU64,
    /// How many connections were cut after a request.
    cuts: AtomicU64,
    paused: watch::Sender<bool>,
}

impl State {
    /// Whether the request just forwarded loses its reply.
    fn roll_cut(&self) -> bool {
        let chance = self.cut_chance.load(Ordering::Relaxed);
        if chance == 0 || rand::random::<u32>() % 1000 >= chance {
            return false;
        }
        let took = self
            .cut_budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if took {
            self.cuts.fetch_add(1, Ordering::SeqCst);
        }
        took
    }

    /// Returns once the proxy is not paused.
    async fn open(&self) {
        let mut paused = self.paused.subscribe();
        let _ = paused.wait_for(|p| !*p).await;
    }
}

/// The proxy; see the module docs.
pub(crate) struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 (an ephemeral port) to `target`.
    pub(crate) async fn start(target: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            cut_chance: AtomicU32::new(0),
            cut_budget: AtomicU64::new(0),
            cuts: AtomicU64::new(0),
            paused: watch::Sender::new(false),
        });
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            // Dropped with the task: every relay ends with the proxy.
            let mut relays = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
                        relays.spawn(relay(client, target, Arc::clone(&shared)));
                    }
                    Some(_) = relays.join_next(), if !relays.is_empty() => {}
                }
            }
        });
        Ok(FaultProxy { addr, state, task })
    }

    /// The port clients connect to (on 127.0.0.1).
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    /// From now on, each forwarded request loses its reply with a chance of
    /// `per_mille` / 1000, at most `budget` more times.
    pub(crate) fn lose_replies(&self, per_mille: u32, budget: u64) {
        self.state.cut_budget.store(budget, Ordering::SeqCst);
        self.state.cut_chance.store(per_mille, Ordering::SeqCst);
    }

    /// How many connections were cut after a request (replies lost).
    pub(crate) fn cuts(&self) -> u64 {
        self.state.cuts.load(Ordering::SeqCst)
    }

    /// Pauses (`true`) or resumes all traffic through the proxy.
    pub(crate) fn pause(&self, paused: bool) {
        self.state.paused.send_replace(paused);
    }
}

/// Relays one client connection to `target` until either side closes, the proxy
/// is dropped, or the connection is cut after a request.
async fn relay(client: TcpStream, target: SocketAddr, state: Arc<State>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    let mut doomed: Option<Instant> = None;
    loop {
        tokio::select! {
            n = client_rd.read(&mut up) => {
                let Ok(n @ 1..) = n else { return };
                state.open().await;
                if server_wr.write_all(&up[..n]).await.is_err() {
                    return;
                }
                if doomed.is_none() && state.roll_cut() {
                    doomed = Some(Instant::now() + CUT_AFTER);
                }
            }
            n = server_rd.read(&mut down) => {
                let Ok(n @ 1..) = n else { return };
                state.open().await;
                // A doomed connection's replies are lost.
                if doomed.is_none() && client_wr.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
            () = sleep_until(doomed) => return,
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
