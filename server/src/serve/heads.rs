//! HTTP/1.1 request heads, checked before hyper sees them, and the message framing followed to find
//! each one (HTTP/2: only whether a header block is arriving). Bookkeeping over bytes only: it
//! must not read the socket, read the clock or know the pool; the connection hands it bytes and
//! the time.

use tokio::time::Instant;

use crate::error::GatewayError;

/// Longest request target accepted (hyper's own limit is 64 KiB, answered with an empty 414).
const MAX_URI_BYTES: usize = 16 * 1024;
/// Longest request head accepted (hyper's own limit is about 400 KB, answered with an empty 431).
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted; hyper is given twice as many so that this check always answers.
pub(super) const MAX_HEADER_FIELDS: usize = 100;
/// A head arriving in more reads than this (each ending a line) is refused: a trickle, not a client.
const MAX_HEAD_PARSES: u32 = 4 * MAX_HEADER_FIELDS as u32;
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The client's byte stream, followed message by message as hyper reads it: where each head starts
/// and ends, the incomplete head held back, and the refused one.
pub(super) struct Messages {
    /// Where the client's byte stream is, message by message (HTTP/1.1).
    framing: Framing,
    /// The client spoke the HTTP/2 preface: frames, not heads, follow.
    h2: Option<H2Frames>,
    /// The incomplete head so far, held back from hyper until it is checked.
    head: Vec<u8>,
    head_parses: u32,
    /// HTTP/1.1 heads handed to hyper: hyper answers them in order, so the n-th head is the n-th
    /// request (the connection counts the requests hyper began).
    pub(super) heads: u64,
    /// The n-th request is a refused head's stand-in, answered with this error.
    pub(super) refusal: Option<(u64, GatewayError)>,
}

impl Messages {
    pub(super) fn new() -> Self {
        Self {
            framing: Framing::Head,
            h2: None,
            head: Vec::new(),
            head_parses: 0,
            heads: 0,
            refusal: None,
        }
    }

    /// The client spoke HTTP/2.
    pub(super) fn h2(&self) -> bool {
        self.h2.is_some()
    }

    /// Looks at bytes just read, before hyper does: follows the messages, times and checks each
    /// head (in `head_started`, shared with the connection's other timers), and says which of the
    /// bytes hyper gets now.
    pub(super) fn read(
        &mut self,
        bytes: &[u8],
        now: Instant,
        head_started: &mut Option<Instant>,
    ) -> Plan {
        let mut plan = Plan {
            before: None,
            pass: bytes.len(),
            refused: false,
        };
        if let Some(frames) = &mut self.h2 {
            frames.read(bytes, now, head_started);
            return plan;
        }
        let mut i = 0;
        while i < bytes.len() {
            let rest = &bytes[i..];
            match &mut self.framing {
                Framing::Blind => break,
                Framing::Body(left) => {
                    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(rest.len());
                    *left -= n as u64;
                    i += n;
                    if *left == 0 {
                        self.framing = Framing::Head;
                    }
                }
                Framing::Chunked(chunked) => match chunked.read(rest) {
                    Chunk::More => break,
                    Chunk::Done(n) => {
                        i += n;
                        self.framing = Framing::Head;
                    }
                    Chunk::Invalid => self.framing = Framing::Blind,
                },
                Framing::Head => {
                    if head_started.is_none() {
                        *head_started = Some(now);
                    }
                    match self.read_head(rest) {
                        Head::Incomplete => {
                            plan.pass = i;
                            break;
                        }
                        Head::Preface { held } => {
                            let mut frames = H2Frames::default();
                            let used = H2_PREFACE.len() - held.as_ref().map_or(0, Vec::len);
                            *head_started = None;
                            frames.read(&rest[used..], now, head_started);
                            self.h2 = Some(frames);
                            plan.before = held;
                            break;
                        }
                        Head::Complete { used, held, body } => {
                            // Only the first head of a read can have begun in an earlier one.
                            plan.before = held;
                            i += used;
                            self.heads += 1;
                            *head_started = None;
                            self.head_parses = 0;
                            self.framing = match body {
                                None => Framing::Chunked(Chunked::default()),
                                Some(0) => Framing::Head,
                                Some(n) => Framing::Body(n),
                            };
                        }
                        Head::Reject(err) => {
                            self.heads += 1;
                            self.refusal = Some((self.heads, err));
                            self.framing = Framing::Blind;
                            plan.pass = i;
                            plan.refused = true;
                            break;
                        }
                    }
                }
            }
        }
        plan
    }
}

/// What the HTTP/1.1 byte stream carries next. Heads are delimited by the body framing hyper uses
/// (RFC 9112 section 6), so every head is found and checked, however requests are pipelined.
enum Framing {
    /// A head, or nothing yet.
    Head,
    /// This many bytes of a Content-Length body.
    Body(u64),
    Chunked(Chunked),
    /// A chunked body hyper will refuse (it then ends the connection): nothing more is looked at.
    Blind,
}

/// What the socket wrapper hands hyper of the bytes just read.
pub(super) struct Plan {
    /// Bytes first: the start of a head held back over earlier reads, complete now.
    pub(super) before: Option<Vec<u8>>,
    /// How many of the bytes read hyper gets; the rest are an incomplete head, held back until it
    /// is checked, or a refused head, dropped.
    pub(super) pass: usize,
    /// A head was refused: hyper gets a stand-in request instead, and nothing after it.
    pub(super) refused: bool,
}

enum Head {
    Incomplete,
    /// The HTTP/2 preface, with the part of it held back from earlier reads.
    Preface {
        held: Option<Vec<u8>>,
    },
    /// The head ends `used` bytes into this read; `held` is its start from earlier reads.
    Complete {
        used: usize,
        held: Option<Vec<u8>>,
        body: Option<u64>,
    },
    Reject(GatewayError),
}

impl Messages {
    /// Reads `fresh`, which starts in a head (or in the bytes before one): a head read at once is
    /// parsed in place; an incomplete one is copied aside until it is whole.
    fn read_head(&mut self, fresh: &[u8]) -> Head {
        let prior = self.head.len();
        let room = (MAX_HEAD_BYTES + 1).saturating_sub(prior);
        let fresh_kept = &fresh[..fresh.len().min(room)];
        if prior > 0 {
            self.head.extend_from_slice(fresh_kept);
        }
        // The HTTP/2 preface can only open a connection.
        if self.heads == 0 && prior < H2_PREFACE.len() {
            let seen = if prior > 0 { &self.head[..] } else { fresh };
            let start = &seen[..seen.len().min(H2_PREFACE.len())];
            if H2_PREFACE.starts_with(start) {
                if start.len() == H2_PREFACE.len() {
                    let mut held = std::mem::take(&mut self.head);
                    held.truncate(prior);
                    return Head::Preface {
                        held: (prior > 0).then_some(held),
                    };
                }
                if prior == 0 {
                    self.head.extend_from_slice(fresh_kept);
                }
                return Head::Incomplete;
            }
        }
        let whole = if prior > 0 { &self.head[..] } else { fresh };
        // Parse again only when a line ended or a limit may be crossed: a head trickling in one
        // byte per read must not cost a parse per byte. (A head starting in this read is parsed at
        // once, without scanning what follows it: pipelined requests.)
        let trickle = prior > 0 && !fresh_kept.contains(&b'\n');
        let verdict = if trickle && whole.len() <= MAX_URI_BYTES + 64 {
            Check::Partial
        } else {
            self.head_parses += 1;
            if self.head_parses > MAX_HEAD_PARSES {
                Check::Reject(too_large())
            } else {
                check_head(whole)
            }
        };
        match verdict {
            Check::Partial => {
                if prior == 0 {
                    self.head.extend_from_slice(fresh_kept);
                }
                Head::Incomplete
            }
            Check::Complete { head, body } => {
                let mut held = std::mem::take(&mut self.head);
                held.truncate(prior);
                Head::Complete {
                    used: head.saturating_sub(prior),
                    held: (prior > 0).then_some(held),
                    body,
                }
            }
            Check::Reject(err) => {
                self.head = Vec::new();
                Head::Reject(err)
            }
        }
    }
}

/// A chunked request body, followed byte by byte as hyper decodes it (its `ChunkedState`), to
/// find where the next head starts. The size line is parsed by httparse.
#[derive(Default)]
struct Chunked {
    state: ChunkState,
    /// The chunk-size line so far.
    line: Vec<u8>,
}

#[derive(Default, Clone, Copy)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk: a trailer line, or the final CRLF.
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
}

enum Chunk {
    More,
    /// The body ends this many bytes into the read.
    Done(usize),
    Invalid,
}

/// hyper's limit on chunk extensions, plus room for the size itself.
const MAX_CHUNK_LINE: usize = 16 * 1024 + 64;

impl Chunked {
    fn read(&mut self, bytes: &[u8]) -> Chunk {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            self.state = match self.state {
                ChunkState::Data(left) => {
                    let n = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len() - i);
                    i += n;
                    match left - n as u64 {
                        0 => ChunkState::DataCr,
                        left => ChunkState::Data(left),
                    }
                }
                ChunkState::Size => {
                    i += 1;
                    if self.line.len() >= MAX_CHUNK_LINE {
                        return Chunk::Invalid;
                    }
                    self.line.push(b);
                    if b != b'\n' {
                        continue;
                    }
                    let parsed = httparse::parse_chunk_size(&self.line);
                    self.line.clear();
                    match parsed {
                        Ok(httparse::Status::Complete((_, 0))) => ChunkState::EndCr,
                        Ok(httparse::Status::Complete((_, size))) => ChunkState::Data(size),
                        _ => return Chunk::Invalid,
                    }
                }
                state => {
                    i += 1;
                    match (state, b) {
                        (ChunkState::DataCr, b'\r') => ChunkState::DataLf,
                        (ChunkState::DataLf, b'\n') => ChunkState::Size,
                        (ChunkState::EndCr, b'\r') => ChunkState::EndLf,
                        (ChunkState::Trailer, b'\r') => ChunkState::TrailerLf,
                        (ChunkState::EndCr | ChunkState::Trailer, _) => ChunkState::Trailer,
                        (ChunkState::TrailerLf, b'\n') => ChunkState::EndCr,
                        (ChunkState::EndLf, b'\n') => return Chunk::Done(i),
                        _ => return Chunk::Invalid,
                    }
                }
            };
        }
        Chunk::More
    }
}

/// HTTP/2 frames, followed only to see when a request's header block is arriving: from the first
/// byte of a HEADERS frame until the end of the frame that carries END_HEADERS.
#[derive(Default)]
struct H2Frames {
    /// The frame header so far.
    header: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: u32,
    /// The current frame is HEADERS or CONTINUATION.
    header_frame: bool,
    /// A header block without END_HEADERS yet: CONTINUATION frames are owed.
    in_block: bool,
}

impl H2Frames {
    const HEADERS: u8 = 0x1;
    const CONTINUATION: u8 = 0x9;
    const END_HEADERS: u8 = 0x4;

    fn in_head(&self) -> bool {
        self.in_block || (self.header_frame && self.left > 0)
    }

    /// Follows `bytes`; keeps `head_started` set while a header block is arriving, restarted when
    /// one ends and another begins within the read.
    fn read(&mut self, bytes: &[u8], now: Instant, head_started: &mut Option<Instant>) {
        let was_in_head = self.in_head();
        let mut ended = false;
        let mut i = 0;
        while i < bytes.len() {
            if self.left > 0 {
                let n = usize::try_from(self.left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len() - i);
                i += n;
                self.left -= n as u32;
                ended |= self.left == 0 && self.header_frame && !self.in_block;
                continue;
            }
            self.header[self.have] = bytes[i];
            self.have += 1;
            i += 1;
            if self.have < self.header.len() {
                continue;
            }
            self.have = 0;
            let [l0, l1, l2, kind, flags, ..] = self.header;
            self.left = u32::from_be_bytes([0, l0, l1, l2]);
            self.header_frame = kind == Self::HEADERS || kind == Self::CONTINUATION;
            self.in_block = self.header_frame && flags & Self::END_HEADERS == 0;
            ended |= self.left == 0 && self.header_frame && !self.in_block;
        }
        if self.in_head() {
            if !was_in_head || ended {
                *head_started = Some(now);
            }
        } else {
            *head_started = None;
        }
    }
}

enum Check {
    Partial,
    /// The head's length, and its body's when known (`None`: chunked).
    Complete {
        head: usize,
        body: Option<u64>,
    },
    Reject(GatewayError),
}

/// The checks hyper makes on a request head, with lower limits, so that hyper never refuses a
/// head these accepted.
fn check_head(head: &[u8]) -> Check {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADER_FIELDS];
    let mut request = httparse::Request::new(&mut fields);
    match request.parse(head) {
        Ok(httparse::Status::Complete(len)) => {
            if request.path.is_some_and(|p| p.len() > MAX_URI_BYTES) {
                return Check::Reject(GatewayError::UriTooLong {
                    limit: MAX_URI_BYTES,
                });
            }
            if len > MAX_HEAD_BYTES {
                return Check::Reject(too_large());
            }
            match body_length(&request) {
                Err(why) => Check::Reject(malformed(why)),
                Ok(body) => Check::Complete { head: len, body },
            }
        }
        Ok(httparse::Status::Partial) => {
            let request_line_done = head.contains(&b'\n');
            let uri_too_long = match request.path {
                Some(path) => path.len() > MAX_URI_BYTES,
                None => !request_line_done && head.len() > MAX_URI_BYTES + 64,
            };
            if uri_too_long {
                Check::Reject(GatewayError::UriTooLong {
                    limit: MAX_URI_BYTES,
                })
            } else if head.len() > MAX_HEAD_BYTES {
                Check::Reject(too_large())
            } else {
                Check::Partial
            }
        }
        Err(httparse::Error::TooManyHeaders) => Check::Reject(too_large()),
        Err(err) => Check::Reject(malformed(&err.to_string())),
    }
}

/// The body's length (`None`: chunked), or what hyper would refuse after httparse accepted the
/// head: the target, and the body framing.
fn body_length(request: &httparse::Request<'_, '_>) -> Result<Option<u64>, &'static str> {
    if request
        .path
        .is_some_and(|p| p.parse::<http::Uri>().is_err())
    {
        return Err("invalid request target");
    }
    let http11 = request.version == Some(1);
    let mut chunked = None;
    let mut length: Option<u64> = None;
    for field in request.headers.iter() {
        if field.name.eq_ignore_ascii_case("transfer-encoding") {
            if !http11 {
                return Err("Transfer-Encoding is not allowed in HTTP/1.0");
            }
            let last = field.value.rsplit(|b| *b == b',').next().unwrap_or(b"");
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if field.name.eq_ignore_ascii_case("content-length") && chunked.is_none() {
            let parsed = std::str::from_utf8(field.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok());
            match (parsed, length) {
                (None, _) => return Err("invalid Content-Length"),
                (Some(new), Some(old)) if new != old => {
                    return Err("conflicting Content-Length headers")
                }
                (Some(new), _) => length = Some(new),
            }
        }
    }
    match chunked {
        Some(false) => Err("Transfer-Encoding must end with chunked"),
        Some(true) => Ok(None),
        None => Ok(Some(length.unwrap_or(0))),
    }
}

fn malformed(why: &str) -> GatewayError {
    GatewayError::InvalidRequest {
        message: format!("The request is not valid HTTP/1.1: {why}."),
        param: None,
        code: "malformed_request",
    }
}

fn too_large() -> GatewayError {
    GatewayError::HeadersTooLarge {
        max_fields: MAX_HEADER_FIELDS,
        max_bytes: MAX_HEAD_BYTES,
    }
}

/// The request hyper is given in place of a refused head: it is answered with the refusal (see
/// [`Track::begin_request`](super::Track::begin_request)), after every request before it, and
/// hyper then closes.
pub(super) const STAND_IN: &[u8] = b"GET / HTTP/1.1\r\nhost: reprise\r\nconnection: close\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(head: &[u8]) -> Result<bool, u16> {
        match check_head(head) {
            Check::Partial => Ok(false),
            Check::Complete { .. } => Ok(true),
            Check::Reject(err) => Err(err.status().as_u16()),
        }
    }

    #[test]
    fn heads_are_checked_like_hyper_with_lower_limits() {
        assert_eq!(
            verdict(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
            Ok(true)
        );
        assert_eq!(verdict(b"\r\nGET / HTTP/1.1\r\n\r\n"), Ok(true));
        assert_eq!(verdict(b"POST /v1/chat HTTP/1.1\r\nHost: x\r\n"), Ok(false));
        assert_eq!(verdict(b"GARBAGE\r\n\r\n"), Err(400));
        assert_eq!(verdict(b"GET / HTTP/1.1\r\nbad header\r\n\r\n"), Err(400));
        assert_eq!(verdict(b"GET / HTTP/9.9\r\n\r\n"), Err(400));
        let conflicting = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(verdict(conflicting), Err(400));
        assert_eq!(
            verdict(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"),
            Err(400)
        );
        assert_eq!(
            verdict(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Ok(true)
        );
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI_BYTES));
        assert_eq!(verdict(long.as_bytes()), Err(414));
        let unfinished = format!("GET /{}", "a".repeat(MAX_URI_BYTES + 100));
        assert_eq!(verdict(unfinished.as_bytes()), Err(414));
        let many: String = (0..=MAX_HEADER_FIELDS)
            .map(|i| format!("x-{i}: 1\r\n"))
            .collect();
        assert_eq!(
            verdict(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()),
            Err(431)
        );
        let big = format!("GET / HTTP/1.1\r\nx: {}\r\n", "b".repeat(MAX_HEAD_BYTES));
        assert_eq!(verdict(big.as_bytes()), Err(431));
    }

    /// Feeds `body` to a chunked framing in pieces of `step` bytes; where it ended, if it did.
    fn chunked_end(body: &[u8], step: usize) -> Result<Option<usize>, ()> {
        let mut chunked = Chunked::default();
        let mut at = 0;
        for piece in body.chunks(step) {
            match chunked.read(piece) {
                Chunk::More => at += piece.len(),
                Chunk::Done(n) => return Ok(Some(at + n)),
                Chunk::Invalid => return Err(()),
            }
        }
        Ok(None)
    }

    #[test]
    fn chunked_bodies_end_where_hyper_ends_them() {
        let body = b"5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\nx-trailer: t\r\n\r\nGET / HTTP/1.1";
        let end = body.len() - b"GET / HTTP/1.1".len();
        for step in [1, 2, 7, body.len()] {
            assert_eq!(chunked_end(body, step), Ok(Some(end)), "step {step}");
        }
        assert_eq!(chunked_end(b"0\r\n\r\n", 1), Ok(Some(5)));
        assert_eq!(chunked_end(b"a\r\n0123456789\r\n", 3), Ok(None));
        assert_eq!(chunked_end(b"zz\r\n", 1), Err(()));
        assert_eq!(chunked_end(b"3\r\nabcXY", 1), Err(()));
    }

    #[test]
    fn h2_header_blocks_are_timed_until_end_headers() {
        let frame = |kind: u8, flags: u8, payload: &[u8]| {
            let mut f = vec![0, 0, payload.len() as u8, kind, flags, 0, 0, 0, 1];
            f.extend_from_slice(payload);
            f
        };
        let now = Instant::now();
        let mut frames = H2Frames::default();
        let mut started = None;
        // SETTINGS, then HEADERS without END_HEADERS: a block is open.
        let mut bytes = frame(0x4, 0, &[]);
        bytes.extend(frame(0x1, 0x1, &[0x82]));
        frames.read(&bytes, now, &mut started);
        assert_eq!(started, Some(now));
        // Its CONTINUATION, with END_HEADERS, arrives in two pieces.
        let continuation = frame(0x9, 0x4, &[0x86, 0x84]);
        frames.read(&continuation[..4], now, &mut started);
        assert_eq!(started, Some(now));
        frames.read(&continuation[4..], now, &mut started);
        assert_eq!(started, None);
        // DATA frames are not heads, even cut short.
        frames.read(&frame(0x0, 0, b"abc")[..10], now, &mut started);
        assert_eq!(started, None);
    }
}
