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
//! Do not put rules on pub/sub connections: in RESP2 their messages cannot be
//! told apart from replies (rules made with [`evalsha_on`] never match there).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::RedisServer;

/// Decides whether a command (its arguments, the command name first) is one whose
/// reply is to be lost.
pub(crate) type CommandMatcher = Arc<dyn Fn(&[Vec<u8>]) -> bool + Send + Sync>;

/// Matches `EVALSHA <sha> <numkeys> <first key> …` with the given script hash
/// (lowercase hex, as redis-rs sends it) and first key.
pub(crate) fn evalsha_on(sha: &[u8], first_key: &[u8]) -> CommandMatcher {
    let (sha, first_key) = (sha.to_vec(), first_key.to_vec());
    Arc::new(move |args: &[Vec<u8>]| {
        args.len() > 3
            && args[0].eq_ignore_ascii_case(b"EVALSHA")
            && args[1].eq_ignore_ascii_case(&sha)
            && args[3] == first_key
    })
}

/// Matches every command.
pub(crate) fn any_command() -> CommandMatcher {
    Arc::new(|_: &[Vec<u8>]| true)
}

/// See the [module docs](self).
///
/// Dropping the proxy stops the listener and closes every connection. Must be
/// created inside a tokio runtime.
pub(crate) struct FaultProxy {
    addr: SocketAddr,
    inner: Arc<Inner>,
    accept_task: JoinHandle<()>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lose {
    Reply,
    Request,
}

struct Rule {
    matcher: CommandMatcher,
    remaining: u64,
    lose: Lose,
    cleared: bool,
}

struct Inner {
    target: SocketAddr,
    /// Rules by id.
    rules: Mutex<Vec<Rule>>,
    /// Commands seen since `record(true)`, in arrival order (all connections).
    recording: Mutex<Option<Vec<Vec<Vec<u8>>>>>,
    dropped: AtomicU64,
    dropped_requests: AtomicU64,
    resets: watch::Sender<u64>,
    open: AtomicUsize,
    accepted: AtomicU64,
}

impl FaultProxy {
    /// A proxy in front of `server` (it keeps working across restarts).
    pub(crate) async fn start(server: &RedisServer) -> FaultProxy {
        FaultProxy::start_to(server.addr()).await
    }

    /// A proxy in front of any TCP address on this machine.
    pub(crate) async fn start_to(target: SocketAddr) -> FaultProxy {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy on 127.0.0.1:0");
        std_listener
            .set_nonblocking(true)
            .expect("set the proxy listener non-blocking");
        let addr = std_listener.local_addr().expect("proxy local_addr");
        let listener = TcpListener::from_std(std_listener).expect("register the proxy listener");
        let inner = Arc::new(Inner {
            target,
            rules: Mutex::new(Vec::new()),
            recording: Mutex::new(None),
            dropped: AtomicU64::new(0),
            dropped_requests: AtomicU64::new(0),
            resets: watch::Sender::new(0),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&inner)));
        FaultProxy {
            addr,
            inner,
            accept_task,
        }
    }

    /// `redis://127.0.0.1:PROXYPORT/`
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// The proxy's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Loses the replies of the next `n` commands (on any connection) that
    /// `matcher` accepts, each after the server applied the command; see the
    /// [module docs](self). Rules add up; [`clear_rules`](Self::clear_rules)
    /// removes them.
    pub(crate) fn drop_replies(&self, matcher: CommandMatcher, n: u64) {
        self.add_rule(matcher, n, Lose::Reply);
    }

    /// Loses the next `n` commands (on any connection) that `matcher` accepts,
    /// before the server sees them: the connection closes instead.
    pub(crate) fn drop_requests(&self, matcher: CommandMatcher, n: u64) {
        self.add_rule(matcher, n, Lose::Request);
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
    pub(crate) fn clear_rules(&self) {
        for rule in lock(&self.inner.rules).iter_mut() {
            rule.remaining = 0;
            rule.cleared = true;
        }
    }

    /// How many replies were lost so far (each closed one connection).
    pub(crate) fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::SeqCst)
    }

    /// How many requests were lost so far (each closed one connection).
    pub(crate) fn dropped_requests(&self) -> u64 {
        self.inner.dropped_requests.load(Ordering::SeqCst)
    }

    /// Starts (clearing what was recorded) or stops recording the commands.
    pub(crate) fn record(&self, on: bool) {
        *lock(&self.inner.recording) = on.then(Vec::new);
    }

    /// The commands recorded since `record(true)`.
    pub(crate) fn recorded(&self) -> Vec<Vec<Vec<u8>>> {
        lock(&self.inner.recording).clone().unwrap_or_default()
    }

    /// Closes every connection open now, abruptly; later ones work normally.
    pub(crate) fn reset_all(&self) {
        self.inner.resets.send_modify(|generation| *generation += 1);
    }

    /// Client connections open through the proxy.
    pub(crate) fn open_connections(&self) -> usize {
        self.inner.open.load(Ordering::SeqCst)
    }

    /// Client connections accepted since the start.
    pub(crate) fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("target", &self.inner.target)
            .field("dropped", &self.dropped())
            .field("dropped_requests", &self.dropped_requests())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct OpenGuard(Arc<Inner>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    inner.accepted.fetch_add(1, Ordering::SeqCst);
                    inner.open.fetch_add(1, Ordering::SeqCst);
                    let guard = OpenGuard(Arc::clone(&inner));
                    let resets = inner.resets.subscribe();
                    connections.spawn(serve(client, Arc::clone(&inner), resets, guard));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Commands of one connection whose replies are to be lost: command index → rule id.
type Marked = Mutex<HashMap<u64, usize>>;

async fn serve(
    mut client: TcpStream,
    inner: Arc<Inner>,
    mut resets: watch::Receiver<u64>,
    _guard: OpenGuard,
) {
    let _ = client.set_nodelay(true);
    let mut server = tokio::select! {
        connected = TcpStream::connect(inner.target) => match connected {
            Ok(server) => server,
            Err(_) => {
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
    let marked = Marked::default();
    let reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        tokio::select! {
            _ = requests(client_read, server_write, &inner, &marked) => false,
            _ = replies(server_read, client_write, &inner, &marked) => false,
            _ = resets.changed() => true,
        }
    };
    if reset {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
    // Dropping both sockets closes them.
}

/// Client → server: parses the commands, marks those whose replies are to be
/// lost (before forwarding them, so the reply side always knows), forwards; at
/// a command whose request is to be lost, forwards what came before it and ends
/// the connection.
async fn requests<R, W>(
    mut from: R,
    mut to: W,
    inner: &Inner,
    marked: &Marked,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut parser = CommandParser::default();
    let mut index = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let mut cut = None;
        for (start, command) in parser.feed(&buf[..n]) {
            if let Some(recorded) = lock(&inner.recording).as_mut() {
                recorded.push(command.clone());
            }
            let mut rules = lock(&inner.rules);
            if let Some((id, rule)) = rules
                .iter_mut()
                .enumerate()
                .find(|(_, r)| r.remaining > 0 && (r.matcher)(&command))
            {
                rule.remaining -= 1;
                if rule.lose == Lose::Request {
                    // Started in an earlier chunk: its head went out already;
                    // the server drops a partial command when the connection
                    // closes.
                    cut = Some(start.unwrap_or(0));
                    break;
                }
                lock(marked).insert(index, id);
            }
            index += 1;
        }
        match cut {
            None => to.write_all(&buf[..n]).await?,
            Some(offset) => {
                to.write_all(&buf[..offset]).await?;
                inner.dropped_requests.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
        }
    }
}

/// Server → client: counts the replies; at the first byte of a marked command's
/// (non-error) reply, forwards what came before it and ends the connection.
async fn replies<R, W>(
    mut from: R,
    mut to: W,
    inner: &Inner,
    marked: &Marked,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut parser = ReplyParser::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let mut cut = None;
        for start in parser.feed(&buf[..n]) {
            let Some(rule) = lock(marked).remove(&start.index) else {
                continue;
            };
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
        match cut {
            None => to.write_all(&buf[..n]).await?,
            Some(offset) => {
                to.write_all(&buf[..offset]).await?;
                let _ = to.shutdown().await;
                inner.dropped.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
        }
    }
}

// ---------------------------------------------------------------------------
// RESP parsing
// ---------------------------------------------------------------------------

/// Splits a client → server byte stream into commands (arrays of bulk strings,
/// or inline commands), fed in chunks of any size.
#[derive(Default)]
struct CommandParser {
    state: CmdState,
    args: Vec<Vec<u8>>,
    arg: Vec<u8>,
    /// Where the command being parsed started in the current chunk (`None`:
    /// in an earlier chunk).
    start: Option<usize>,
}

#[derive(Default, Clone, Copy)]
enum CmdState {
    #[default]
    Idle,
    ArrayLen {
        value: u64,
        negative: bool,
    },
    BulkStart {
        left: u64,
    },
    BulkLen {
        left: u64,
        value: u64,
        negative: bool,
    },
    /// `bytes` of payload left, then `\r\n`.
    BulkBody {
        left: u64,
        bytes: u64,
        crlf: u8,
    },
    Inline,
    Broken,
}

impl CommandParser {
    /// Feeds the next chunk; returns the commands it completed, each with the
    /// offset in this chunk where it started (`None`: in an earlier chunk).
    fn feed(&mut self, data: &[u8]) -> Vec<(Option<usize>, Vec<Vec<u8>>)> {
        use CmdState::*;
        let mut done = Vec::new();
        self.start = None;
        let mut i = 0;
        while i < data.len() {
            let byte = data[i];
            if matches!(self.state, Idle) {
                self.start = Some(i);
            }
            self.state = match self.state {
                Idle => match byte {
                    b'*' => ArrayLen {
                        value: 0,
                        negative: false,
                    },
                    b'\r' | b'\n' => Idle,
                    _ => {
                        self.arg.clear();
                        self.arg.push(byte);
                        Inline
                    }
                },
                ArrayLen { value, negative } => match byte {
                    b'0'..=b'9' => ArrayLen {
                        value: value * 10 + u64::from(byte - b'0'),
                        negative,
                    },
                    b'-' => ArrayLen {
                        value,
                        negative: true,
                    },
                    b'\n' if negative || value == 0 => Idle,
                    b'\n' => {
                        self.args.clear();
                        BulkStart { left: value }
                    }
                    _ => ArrayLen { value, negative },
                },
                BulkStart { left } => match byte {
                    b'$' => BulkLen {
                        left,
                        value: 0,
                        negative: false,
                    },
                    _ => Broken,
                },
                BulkLen {
                    left,
                    value,
                    negative,
                } => match byte {
                    b'0'..=b'9' => BulkLen {
                        left,
                        value: value * 10 + u64::from(byte - b'0'),
                        negative,
                    },
                    b'-' => BulkLen {
                        left,
                        value,
                        negative: true,
                    },
                    b'\n' if negative => {
                        self.args.push(Vec::new());
                        self.arg_done(left, &mut done)
                    }
                    b'\n' => {
                        self.arg.clear();
                        BulkBody {
                            left,
                            bytes: value,
                            crlf: 2,
                        }
                    }
                    _ => BulkLen {
                        left,
                        value,
                        negative,
                    },
                },
                BulkBody { left, bytes, crlf } => {
                    if bytes > 0 {
                        let take = (bytes as usize).min(data.len() - i);
                        self.arg.extend_from_slice(&data[i..i + take]);
                        i += take;
                        self.state = BulkBody {
                            left,
                            bytes: bytes - take as u64,
                            crlf,
                        };
                        continue;
                    }
                    if crlf > 1 {
                        BulkBody {
                            left,
                            bytes,
                            crlf: crlf - 1,
                        }
                    } else {
                        let arg = std::mem::take(&mut self.arg);
                        self.args.push(arg);
                        self.arg_done(left, &mut done)
                    }
                }
                Inline => match byte {
                    b'\n' => {
                        let line = std::mem::take(&mut self.arg);
                        let args: Vec<Vec<u8>> = line
                            .split(|b| b.is_ascii_whitespace())
                            .filter(|w| !w.is_empty())
                            .map(<[u8]>::to_vec)
                            .collect();
                        if !args.is_empty() {
                            done.push((self.start, args));
                        }
                        Idle
                    }
                    _ => {
                        self.arg.push(byte);
                        Inline
                    }
                },
                Broken => Broken,
            };
            i += 1;
        }
        done
    }

    fn arg_done(&mut self, left: u64, done: &mut Vec<(Option<usize>, Vec<Vec<u8>>)>) -> CmdState {
        if left <= 1 {
            done.push((self.start, std::mem::take(&mut self.args)));
            CmdState::Idle
        } else {
            CmdState::BulkStart { left: left - 1 }
        }
    }
}

/// Where a top-level reply starts in a chunk.
#[derive(Debug, PartialEq, Eq)]
struct ReplyStart {
    /// Byte offset of its first byte in the chunk.
    offset: usize,
    /// The index of the command it answers (0 = the connection's first).
    index: u64,
    /// An error reply (`-` or `!`).
    error: bool,
}

/// Follows a server → client RESP2/RESP3 stream and reports where each reply
/// starts (RESP3 push messages are skipped; attributes belong to the reply that
/// follows them).
#[derive(Default)]
struct ReplyParser {
    state: ReplyState,
    /// Elements still expected by each open aggregate.
    stack: Vec<u64>,
    /// Replies completed so far.
    replies: u64,
    /// The top-level value being parsed is a push message (not a reply).
    push: bool,
    /// A top-level attribute is open.
    attribute: bool,
    /// A top-level attribute is complete: the next top-level value is the reply
    /// it annotates, whose start was reported at the attribute.
    annotated: bool,
}

#[derive(Default, Clone, Copy)]
enum ReplyState {
    #[default]
    Type,
    Line {
        kind: u8,
        value: i64,
        negative: bool,
    },
    Blob {
        bytes: u64,
    },
}

impl ReplyParser {
    fn feed(&mut self, data: &[u8]) -> Vec<ReplyStart> {
        let mut starts = Vec::new();
        let mut i = 0;
        while i < data.len() {
            let byte = data[i];
            match self.state {
                ReplyState::Type => {
                    if self.stack.is_empty() && std::mem::take(&mut self.annotated) {
                        // The reply after its attribute: reported already.
                    } else if self.stack.is_empty() {
                        self.push = byte == b'>';
                        if !self.push {
                            starts.push(ReplyStart {
                                offset: i,
                                index: self.replies,
                                error: byte == b'-' || byte == b'!',
                            });
                        }
                    }
                    self.state = ReplyState::Line {
                        kind: byte,
                        value: 0,
                        negative: false,
                    };
                }
                ReplyState::Line {
                    kind,
                    value,
                    negative,
                } => match byte {
                    b'\n' => {
                        let n = if negative { -value } else { value };
                        self.line_done(kind, n);
                    }
                    b'0'..=b'9' => {
                        self.state = ReplyState::Line {
                            kind,
                            value: value
                                .saturating_mul(10)
                                .saturating_add(i64::from(byte - b'0')),
                            negative,
                        }
                    }
                    b'-' => {
                        self.state = ReplyState::Line {
                            kind,
                            value,
                            negative: true,
                        }
                    }
                    _ => {}
                },
                ReplyState::Blob { bytes } => {
                    let take = (bytes as usize).min(data.len() - i);
                    i += take;
                    let left = bytes - take as u64;
                    if left == 0 {
                        self.element_done();
                    } else {
                        self.state = ReplyState::Blob { bytes: left };
                    }
                    continue;
                }
            }
            i += 1;
        }
        starts
    }

    fn line_done(&mut self, kind: u8, n: i64) {
        match kind {
            b'$' | b'!' | b'=' if n >= 0 => {
                self.state = ReplyState::Blob {
                    bytes: n as u64 + 2,
                };
            }
            b'*' | b'~' | b'>' | b'%' | b'|' if n > 0 => {
                let elements = match kind {
                    b'%' | b'|' => 2 * n as u64,
                    _ => n as u64,
                };
                if kind == b'|' && self.stack.is_empty() {
                    // A top-level attribute: the reply proper follows it.
                    self.attribute = true;
                }
                self.stack.push(elements);
                self.state = ReplyState::Type;
            }
            _ => self.element_done(),
        }
    }

    fn element_done(&mut self) {
        self.state = ReplyState::Type;
        loop {
            match self.stack.last_mut() {
                None => {
                    if !self.push {
                        self.replies += 1;
                    }
                    self.push = false;
                    return;
                }
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        return;
                    }
                    self.stack.pop();
                    if self.stack.is_empty() && self.attribute {
                        // A top-level attribute is complete: the reply it
                        // annotates starts next.
                        self.attribute = false;
                        self.annotated = true;
                        return;
                    }
                }
            }
        }
    }
}

/// Checks the two RESP parsers on tricky streams, cut into chunks of every size.
/// Called by a test of the binary that uses the proxy (so that the other test
/// binaries sharing this module do not run it).
pub(crate) fn self_test() {
    fn feed_all(p: &mut ReplyParser, data: &[u8], chunk: usize) -> Vec<ReplyStart> {
        let mut out = Vec::new();
        let mut base = 0;
        for piece in data.chunks(chunk) {
            for mut s in p.feed(piece) {
                s.offset += base;
                out.push(s);
            }
            base += piece.len();
        }
        out
    }

    let replies: &[u8] = b"+OK\r\n-ERR x\r\n*2\r\n:1\r\n*1\r\n$3\r\nabc\r\n$-1\r\n>2\r\n$1\r\na\r\n$1\r\nb\r\n%1\r\n+k\r\n:2\r\n|1\r\n+a\r\n:1\r\n*0\r\n:5\r\n";
    for chunk in 1..replies.len() {
        let mut p = ReplyParser::default();
        let starts = feed_all(&mut p, replies, chunk);
        let idx: Vec<u64> = starts.iter().map(|s| s.index).collect();
        assert_eq!(idx, vec![0, 1, 2, 3, 4, 5, 6], "chunk {chunk}");
        assert!(starts[1].error && !starts[0].error);
        assert_eq!(starts[0].offset, 0);
        assert_eq!(starts[1].offset, 5);
        assert_eq!(p.replies, 7);
    }

    let commands: &[u8] =
        b"*3\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$0\r\n\r\nPING\r\n*1\r\n$4\r\nPING\r\n";
    for chunk in 1..commands.len() {
        let mut p = CommandParser::default();
        let mut all = Vec::new();
        let mut starts = Vec::new();
        for (base, piece) in (0..).step_by(chunk).zip(commands.chunks(chunk)) {
            for (start, command) in p.feed(piece) {
                starts.push(start.map(|s| s + base));
                all.push(command);
            }
        }
        assert!(
            starts
                .iter()
                .all(|s| s.is_none_or(|s| [0, 31, 37].contains(&s)))
        );
        assert_eq!(
            all,
            vec![
                vec![b"EVALSHA".to_vec(), b"ab".to_vec(), Vec::new()],
                vec![b"PING".to_vec()],
                vec![b"PING".to_vec()],
            ],
            "chunk {chunk}"
        );
    }
    let whole: Vec<Option<usize>> = CommandParser::default()
        .feed(commands)
        .into_iter()
        .map(|(start, _)| start)
        .collect();
    assert_eq!(whole, vec![Some(0), Some(31), Some(37)]);
}
