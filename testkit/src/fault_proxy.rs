//! [`FaultProxy`]: a TCP proxy that parses the RESP traffic in both directions and
//! can lose the reply of chosen commands **after the server applied them** — the
//! ambiguous failure that a retrying client must reconcile.
//!
//! It forwards a matching command to the server, waits until the *first byte of
//! that command's reply* arrives (proof that the server ran it), forwards every
//! byte that came before that reply, and then closes both connections. The client
//! sees its connection drop with the command's outcome unknown.
//!
//! Replies are matched to commands by counting both streams (RESP2 and RESP3,
//! pipelined or not; RESP3 push messages are not replies). An *error* reply
//! (`-…` or `!…`) proves nothing was applied (e.g. `NOSCRIPT`), so it is
//! forwarded and the rule keeps its count.
//!
//! It can also lose the **request** itself ([`FaultProxy::drop_requests`]):
//! the bytes before the matching command are forwarded, the command is not, and
//! both connections close — the server never runs it.
//!
//! And it can **delay** a request past later ones ([`FaultProxy::delay_requests`]):
//! at the matching command the client's connection ends at once (the client sees
//! its request fail, indeterminate, and sends later ones on a new connection),
//! while the command itself reaches the server only after the delay, on the old
//! server connection, its reply discarded: a request held back on the wire and
//! overtaken by everything the client sends afterwards.
//!
//! Do not put rules on pub/sub connections: in RESP2 their messages cannot be
//! told apart from replies (rules made with [`evalsha_on`] never match there).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use tokio::net::tcp::{ReadHalf, WriteHalf};

use super::RedisServer;
use super::relay::{BoxFuture, Pumps, Relay};
use super::resp::{CommandParser, ReplyParser};

/// Decides whether a command (its arguments, the command name first) is one whose
/// reply is to be lost.
pub type CommandMatcher = Arc<dyn Fn(&[Vec<u8>]) -> bool + Send + Sync>;

/// Matches `EVALSHA <sha> <numkeys> <first key> …` with the given script hash
/// (lowercase hex, as redis-rs sends it) and first key of the script's own (after
/// the server's life, which a granting script is given first).
pub fn evalsha_on(sha: &[u8], first_key: &[u8]) -> CommandMatcher {
    let (sha, first_key) = (sha.to_vec(), first_key.to_vec());
    Arc::new(move |args: &[Vec<u8>]| {
        // EVALSHA sha numkeys key…: a granting script's first key is the
        // server's life (`<prefix>:life`), the script's own keys follow it.
        let own = match args.get(3) {
            Some(k) if k.ends_with(b":life") && args.len() > 4 => 4,
            _ => 3,
        };
        args.len() > 3
            && args[0].eq_ignore_ascii_case(b"EVALSHA")
            && args[1].eq_ignore_ascii_case(&sha)
            && args[own] == first_key
    })
}

/// Matches every command.
pub fn any_command() -> CommandMatcher {
    Arc::new(|_: &[Vec<u8>]| true)
}

/// See the [module docs](self).
///
/// Dropping the proxy stops the listener and closes every connection. Must be
/// created inside a tokio runtime.
pub struct FaultProxy {
    relay: Relay,
    inner: Arc<Inner>,
}

impl std::ops::Deref for FaultProxy {
    type Target = Relay;

    /// The address, the connection counts and `reset_all`.
    fn deref(&self) -> &Relay {
        &self.relay
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lose {
    Reply,
    Request,
    /// Delivered after this long, unanswered.
    Delay(std::time::Duration),
}

struct Rule {
    matcher: CommandMatcher,
    remaining: u64,
    lose: Lose,
    cleared: bool,
}

struct Inner {
    /// Rules by id.
    rules: Mutex<Vec<Rule>>,
    /// Commands seen since `record(true)`, in arrival order (all connections).
    recording: Mutex<Option<Vec<Vec<Vec<u8>>>>>,
    dropped: AtomicU64,
    dropped_requests: AtomicU64,
    /// Delayed requests the server has answered.
    delayed_applied: AtomicU64,
}

impl FaultProxy {
    /// A proxy in front of `server` (it keeps working across restarts).
    pub async fn start(server: &RedisServer) -> FaultProxy {
        FaultProxy::start_to(server.addr()).await
    }

    /// A proxy in front of any TCP address on this machine.
    pub async fn start_to(target: SocketAddr) -> FaultProxy {
        let inner = Arc::new(Inner {
            rules: Mutex::new(Vec::new()),
            recording: Mutex::new(None),
            dropped: AtomicU64::new(0),
            dropped_requests: AtomicU64::new(0),
            delayed_applied: AtomicU64::new(0),
        });
        FaultProxy {
            relay: Relay::start(target, Arc::clone(&inner)),
            inner,
        }
    }

    /// Loses the replies of the next `n` commands (on any connection) that
    /// `matcher` accepts, each after the server applied the command; see the
    /// [module docs](self). Rules add up; [`clear_rules`](Self::clear_rules)
    /// removes them.
    pub fn drop_replies(&self, matcher: CommandMatcher, n: u64) {
        self.add_rule(matcher, n, Lose::Reply);
    }

    /// Loses the next `n` commands (on any connection) that `matcher` accepts,
    /// before the server sees them: the connection closes instead.
    pub fn drop_requests(&self, matcher: CommandMatcher, n: u64) {
        self.add_rule(matcher, n, Lose::Request);
    }

    /// Delays the next `n` commands (on any connection) that `matcher` accepts by
    /// `delay`: the client's connection ends at once, and the command reaches the
    /// server `delay` later, unanswered; see the [module docs](self).
    pub fn delay_requests(&self, matcher: CommandMatcher, n: u64, delay: std::time::Duration) {
        self.add_rule(matcher, n, Lose::Delay(delay));
    }

    /// How many delayed requests the server has answered so far (applied them,
    /// or refused them with an error).
    pub fn delayed_applied(&self) -> u64 {
        self.inner.delayed_applied.load(Ordering::SeqCst)
    }

    fn add_rule(&self, matcher: CommandMatcher, n: u64, lose: Lose) {
        lock(&self.inner.rules).push(Rule {
            matcher,
            remaining: n,
            lose,
            cleared: false,
        });
    }

    /// Removes every rule (replies already marked to be lost are still lost).
    pub fn clear_rules(&self) {
        for rule in lock(&self.inner.rules).iter_mut() {
            rule.remaining = 0;
            rule.cleared = true;
        }
    }

    /// How many replies were lost so far (each closed one connection).
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::SeqCst)
    }

    /// How many requests were lost so far (each closed one connection).
    pub fn dropped_requests(&self) -> u64 {
        self.inner.dropped_requests.load(Ordering::SeqCst)
    }

    /// Starts (clearing what was recorded) or stops recording the commands.
    pub fn record(&self, on: bool) {
        *lock(&self.inner.recording) = on.then(Vec::new);
    }

    /// The commands recorded since `record(true)`.
    pub fn recorded(&self) -> Vec<Vec<Vec<u8>>> {
        lock(&self.inner.recording).clone().unwrap_or_default()
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr())
            .field("target", &self.target())
            .field("dropped", &self.dropped())
            .field("dropped_requests", &self.dropped_requests())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Commands of one connection whose replies are to be lost: command index → rule id
/// ([`DELAYED`] for the delayed command).
type Marked = Mutex<HashMap<u64, usize>>;

/// The rule id marking a delayed command, whose answer ends the connection.
const DELAYED: usize = usize::MAX;

/// A delayed command of one connection: its bytes and its delay.
type Held = Mutex<Option<(Vec<u8>, std::time::Duration)>>;

/// A command as RESP (an array of bulk strings), as clients send it.
fn resp(command: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", command.len()).into_bytes();
    for arg in command {
        out.extend(format!("${}\r\n", arg.len()).into_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

impl Pumps for Inner {
    fn run<'a>(
        &'a self,
        from_client: ReadHalf<'a>,
        to_client: WriteHalf<'a>,
        from_server: ReadHalf<'a>,
        to_server: WriteHalf<'a>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let marked = Marked::default();
            let held = Held::default();
            let detach = tokio::sync::Notify::new();
            tokio::select! {
                _ = async {
                    let cut = requests(from_client, to_server, self, &marked, &held).await;
                    let delayed = lock(&held).take();
                    if let (Ok(Some(mut to_server)), Some((command, delay))) = (cut, delayed) {
                        // The client's side ends now; the command lands later,
                        // and the reply pump waits for its answer.
                        detach.notify_one();
                        tokio::time::sleep(delay).await;
                        if to_server.write_all(&command).await.is_ok() {
                            std::future::pending::<()>().await;
                        }
                    }
                } => {}
                _ = replies(from_server, to_client, self, &marked, &detach) => {}
            }
        })
    }
}

/// Forwards `from` to `to` chunk by chunk until end of file, an error, or a cut:
/// `cut_at` sees each chunk and may name the offset at which the connection ends
/// (what comes before it is forwarded). Returns `to` if it was cut.
async fn forward_until_cut<R, W>(
    mut from: R,
    mut to: W,
    mut cut_at: impl FnMut(&[u8]) -> Option<usize>,
) -> std::io::Result<Option<W>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        match cut_at(&buf[..n]) {
            None => to.write_all(&buf[..n]).await?,
            Some(offset) => {
                to.write_all(&buf[..offset]).await?;
                return Ok(Some(to));
            }
        }
    }
}

/// Client → server: parses the commands, marks those whose replies are to be
/// lost (before forwarding them, so the reply side always knows), forwards; at
/// a command whose request is to be lost, forwards what came before it and ends
/// the connection.
async fn requests<'a>(
    from: ReadHalf<'a>,
    to: WriteHalf<'a>,
    inner: &Inner,
    marked: &Marked,
    held: &Held,
) -> std::io::Result<Option<WriteHalf<'a>>> {
    let mut parser = CommandParser::default();
    let mut index = 0u64;
    let cut = forward_until_cut(from, to, |chunk| {
        for (start, command) in parser.feed(chunk) {
            if let Some(recorded) = lock(&inner.recording).as_mut() {
                recorded.push(command.clone());
            }
            let mut rules = lock(&inner.rules);
            if let Some((id, rule)) = rules.iter_mut().enumerate().find(|(_, r)| {
                // A command that began in an earlier chunk cannot be held back
                // whole (its head went out): it is not delayed.
                let whole = start.is_some() || !matches!(r.lose, Lose::Delay(_));
                r.remaining > 0 && whole && (r.matcher)(&command)
            }) {
                rule.remaining -= 1;
                if let Lose::Delay(delay) = rule.lose {
                    *lock(held) = Some((resp(&command), delay));
                    lock(marked).insert(index, DELAYED);
                    return start;
                }
                if rule.lose == Lose::Request {
                    // Started in an earlier chunk: its head went out already;
                    // the server drops a partial command when the connection
                    // closes.
                    return Some(start.unwrap_or(0));
                }
                lock(marked).insert(index, id);
            }
            index += 1;
        }
        None
    })
    .await?;
    if cut.is_some() && lock(held).is_none() {
        inner.dropped_requests.fetch_add(1, Ordering::SeqCst);
    }
    Ok(cut)
}

/// Server → client: counts the replies; at the first byte of a marked command's
/// (non-error) reply, forwards what came before it and ends the connection. Once
/// `detach` is notified (a request is delayed), closes the client's side and only
/// waits for the delayed command's answer.
async fn replies(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    inner: &Inner,
    marked: &Marked,
    detach: &tokio::sync::Notify,
) -> std::io::Result<()> {
    let mut parser = ReplyParser::default();
    let mut buf = vec![0u8; 16 * 1024];
    let mut detached = false;
    loop {
        let n = tokio::select! {
            n = from.read(&mut buf) => n?,
            _ = detach.notified(), if !detached => {
                detached = true;
                let _ = to.shutdown().await;
                continue;
            }
        };
        if n == 0 {
            return Ok(());
        }
        let chunk = &buf[..n];
        let mut cut = None;
        for start in parser.feed(chunk) {
            let Some(rule) = lock(marked).remove(&start.index) else {
                continue;
            };
            if rule == DELAYED {
                inner.delayed_applied.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            if start.error {
                // Not applied: give the rule its count back.
                if let Some(r) = lock(&inner.rules).get_mut(rule)
                    && !r.cleared
                {
                    r.remaining += 1;
                }
                continue;
            }
            cut = Some(start.offset);
            break;
        }
        if detached {
            continue;
        }
        match cut {
            None => to.write_all(chunk).await?,
            Some(offset) => {
                to.write_all(&chunk[..offset]).await?;
                // Counted before the client can see its connection end: a test
                // that asserts the count right after its call failed must find it.
                inner.dropped.fetch_add(1, Ordering::SeqCst);
                let _ = to.shutdown().await;
                return Ok(());
            }
        }
    }
}
