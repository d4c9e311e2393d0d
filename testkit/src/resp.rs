//! Counting complete RESP commands in a byte stream split at any point.

/// Counts the commands in a client-to-server RESP byte stream, fed in chunks
/// of any size (a command may span chunks; a chunk may hold many commands).
///
/// A command is an array `*<n>\r\n` of `n` bulk strings `$<len>\r\n<bytes>\r\n`
/// (arrays with `n <= 0` are no command, as in Redis), or an inline command:
/// a line with some non-blank character. It is the `CommandParser`, keeping
/// only the count.
#[derive(Default)]
pub struct RespCommandCounter {
    parser: CommandParser,
}

impl RespCommandCounter {
    /// Feeds the next chunk; returns how many commands it completed.
    pub fn feed(&mut self, data: &[u8]) -> u64 {
        self.parser.feed(data).len() as u64
    }
}

// ---------------------------------------------------------------------------
// RESP parsing
// ---------------------------------------------------------------------------

/// Splits a client → server byte stream into commands (arrays of bulk strings,
/// or inline commands), fed in chunks of any size.
#[derive(Default)]
pub(crate) struct CommandParser {
    state: CmdState,
    args: Vec<Vec<u8>>,
    arg: Vec<u8>,
    /// Where the command being parsed started in the current chunk (`None`:
    /// in an earlier chunk).
    start: Option<usize>,
}

#[derive(Default, Clone, Copy)]
pub(crate) enum CmdState {
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
    pub(crate) fn feed(&mut self, data: &[u8]) -> Vec<(Option<usize>, Vec<Vec<u8>>)> {
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
pub(crate) struct ReplyStart {
    /// Byte offset of its first byte in the chunk.
    pub(crate) offset: usize,
    /// The index of the command it answers (0 = the connection's first).
    pub(crate) index: u64,
    /// An error reply (`-` or `!`).
    pub(crate) error: bool,
}

/// Follows a server → client RESP2/RESP3 stream and reports where each reply
/// starts (RESP3 push messages are skipped; attributes belong to the reply that
/// follows them).
#[derive(Default)]
pub(crate) struct ReplyParser {
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
pub(crate) enum ReplyState {
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
    pub(crate) fn feed(&mut self, data: &[u8]) -> Vec<ReplyStart> {
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
/// Public so that a test binary runs it (`tests/in_process/harness.rs`): the parsers are
/// crate-private.
pub fn parsers_self_test() {
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
