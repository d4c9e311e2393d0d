//! A loopback TCP proxy that delays every chunk by a fixed one-way time in each
//! direction, to measure at a network-like round trip (`LOCKFLIGHT_BENCH_DELAY_US`;
//! 250 µs each way is a 0.5 ms round trip).
//!
//! Tokio's timer has a 1 ms granularity, so the proxy runs on plain threads: per
//! connection and direction, one thread reads and stamps chunks, another sleeps
//! until each chunk's due time (`std::thread::sleep`, precise to tens of µs on
//! Linux) and writes it on. Order within a direction is kept; `TCP_NODELAY` is
//! set on both sides so the proxy adds no Nagle delay of its own.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A running delay proxy; stops accepting when dropped (open connections end
/// when either side closes).
pub(crate) struct DelayProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards each connection to `target`,
    /// delaying every chunk by `one_way` in each direction.
    pub(crate) fn start(target: SocketAddr, one_way: Duration) -> std::io::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stopped.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(target) else {
                        continue;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                        continue;
                    };
                    pipe(client, s2, one_way);
                    pipe(server, c2, one_way);
                }
            })?;
        Ok(DelayProxy { addr, stop })
    }

    /// `redis://` URL of the proxy.
    pub(crate) fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        let _ = thread::Builder::new().name(name.into()).spawn(f);
    };
    spawn(
        "delay-read",
        Box::new(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            let _ = from.shutdown(Shutdown::Read);
        }),
    );
    spawn(
        "delay-write",
        Box::new(move || {
            while let Ok((due, chunk)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        }),
    );
}
