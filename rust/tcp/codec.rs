//! torch's TCPStore wire format: every request and reply, encoded and decoded, with no I/O.
//!
//! The protocol (torch >= 2.4, "era D" onwards; opcodes only ever added at the end) has no frame
//! length and no request id: a request is one opcode byte and its payload, and the reply's shape
//! depends on the request. So decoding a reply needs the [`ReplyKind`] of the request it answers.
//! Integers are little-endian; keys and values are a `u64` length and raw bytes.
//!
//! Decoding is two-step so that a server never buffers more than it agreed to: [`scan_request`]
//! walks the length prefixes of a possibly partial frame without copying, checks them against
//! [`Limits`] *before* the body arrives (a declared length over a limit is an error at once), and
//! tells how many bytes the frame needs; [`decode_request`] then splits a complete frame off the
//! buffer without copying its keys and values. "Not enough bytes yet" is `Ok(None)`, never an
//! error. The same types encode both ways, so the server, the client, tests and load generators
//! share one definition of every byte.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The magic number of the VALIDATE handshake (`00 CE F7 85 3C` on the wire).
pub const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;

/// A key ferrodist's server reports as present to CHECK and no torch server can hold (torch's
/// clients prefix every key with `/` or use `init/`; this one starts with a NUL byte). A client
/// that CHECKs it during its handshake learns at no extra round trip whether the server is
/// ferrodist's, and so whether it may pipeline WAIT and GET. It is never stored, so it shows in
/// neither GETNUMKEYS nor LIST_KEYS.
pub const SERVER_MARKER_KEY: &[u8] = b"\0ferrodist-server";

/// Reply byte of WAIT and BARRIER: the wait is over.
pub const STOP_WAITING: u8 = 0;
/// Reply byte of CANCEL_WAIT.
pub const WAIT_CANCELED: u8 = 1;
/// Reply byte of CHECK: every key is present.
pub const READY: u8 = 0;
/// Reply byte of CHECK: some key is missing.
pub const NOT_READY: u8 = 1;

/// Request opcodes, as torch 2.13 numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Handshake: `u32` magic, no reply.
    Validate = 0,
    /// Key, value; no reply.
    Set = 1,
    /// Key, expected, desired; replies bytes.
    CompareSet = 2,
    /// Key; replies bytes.
    Get = 3,
    /// Key, `i64` delta; replies `i64`.
    Add = 4,
    /// Keys; replies READY / NOT_READY.
    Check = 5,
    /// Keys; replies STOP_WAITING once all exist.
    Wait = 6,
    /// No payload; replies `i64`.
    GetNumKeys = 7,
    /// Key; replies `i64` removed count.
    DeleteKey = 8,
    /// Key, value; no reply.
    Append = 9,
    /// Keys; replies one bytes per key.
    MultiGet = 10,
    /// Pairs; no reply.
    MultiSet = 11,
    /// No payload; replies WAIT_CANCELED.
    CancelWait = 12,
    /// `u32` nonce; replies the same nonce.
    Ping = 13,
    /// Key, value; no reply.
    QueuePush = 14,
    /// Key; replies `i64` length before the pop, then the value if it was > 0.
    QueuePop = 15,
    /// Key; replies `i64`.
    QueueLen = 16,
    /// No payload; replies `i64` count then that many keys.
    ListKeys = 17,
    /// Key, `i64` world size; replies STOP_WAITING when released.
    Barrier = 18,
}

impl Opcode {
    /// The opcode for a byte, `None` for a byte torch does not define.
    pub fn from_byte(byte: u8) -> Option<Opcode> {
        use Opcode::*;
        const ALL: [Opcode; 19] = [
            Validate, Set, CompareSet, Get, Add, Check, Wait, GetNumKeys, DeleteKey, Append,
            MultiGet, MultiSet, CancelWait, Ping, QueuePush, QueuePop, QueueLen, ListKeys, Barrier,
        ];
        ALL.get(usize::from(byte)).copied()
    }
}

/// Per-request size limits a decoder enforces before buffering a body.
///
/// The defaults are torch's libuv server limits (8 KiB keys, 8 MiB values, 128 K keys per
/// request) plus a cap on a whole request, which torch lacks: with it, the memory one connection
/// can make the server hold is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes.
    pub max_key_bytes: u64,
    /// Longest value, in bytes.
    pub max_value_bytes: u64,
    /// Most keys in one CHECK / WAIT / MULTI_GET / MULTI_SET.
    pub max_keys: u64,
    /// Largest whole request, in bytes (opcode and length prefixes included).
    pub max_request_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 8 * 1024,
            max_value_bytes: 8 * 1024 * 1024,
            max_keys: 128 * 1024,
            max_request_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// No limits at all (a client reading a trusted server's replies).
    pub const UNLIMITED: Limits = Limits {
        max_key_bytes: u64::MAX,
        max_value_bytes: u64::MAX,
        max_keys: u64::MAX,
        max_request_bytes: u64::MAX,
    };
}

/// Why bytes could not be decoded. Every variant means the peer broke the protocol (or a limit):
/// the connection cannot be resynchronised and should be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first byte is not an opcode torch defines.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    /// A declared key length is over the limit.
    #[error("key of {len} bytes is over the limit of {max}")]
    KeyTooLong {
        /// Declared length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A declared value length is over the limit.
    #[error("value of {len} bytes is over the limit of {max}")]
    ValueTooLong {
        /// Declared length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A declared key count is over the limit.
    #[error("{count} keys in one request is over the limit of {max}")]
    TooManyKeys {
        /// Declared count.
        count: u64,
        /// The limit.
        max: u64,
    },
    /// The whole request would be larger than the limit.
    #[error("request of at least {len} bytes is over the limit of {max}")]
    RequestTooLarge {
        /// Bytes the request needs, as far as known.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A reply had a shape the request does not allow (e.g. a negative count).
    #[error("malformed reply: {0}")]
    BadReply(String),
}

impl From<FrameError> for crate::error::Error {
    fn from(err: FrameError) -> Self {
        crate::error::Error::Protocol(err.to_string())
    }
}

/// One request, as a client sends it and a server reads it. Keys are raw wire keys: torch's
/// client prefixes user keys with `/` before they get here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Handshake.
    Validate {
        /// Must be [`VALIDATE_MAGIC`].
        magic: u32,
    },
    /// Store a value.
    Set {
        /// Key.
        key: Bytes,
        /// Value.
        value: Bytes,
    },
    /// Compare-and-set.
    CompareSet {
        /// Key.
        key: Bytes,
        /// Value the key must hold (empty: must be missing).
        expected: Bytes,
        /// Value to write.
        desired: Bytes,
    },
    /// Read a value.
    Get {
        /// Key.
        key: Bytes,
    },
    /// Add to a decimal counter.
    Add {
        /// Key.
        key: Bytes,
        /// Amount.
        delta: i64,
    },
    /// Are all keys present?
    Check {
        /// Keys.
        keys: Vec<Bytes>,
    },
    /// Reply once all keys are present.
    Wait {
        /// Keys.
        keys: Vec<Bytes>,
    },
    /// Count the keys.
    GetNumKeys,
    /// Remove a key.
    DeleteKey {
        /// Key.
        key: Bytes,
    },
    /// Append to a value.
    Append {
        /// Key.
        key: Bytes,
        /// Bytes to append.
        value: Bytes,
    },
    /// Read several values.
    MultiGet {
        /// Keys.
        keys: Vec<Bytes>,
    },
    /// Store several values.
    MultiSet {
        /// Key/value pairs, applied in order.
        pairs: Vec<(Bytes, Bytes)>,
    },
    /// Cancel this connection's pending wait.
    CancelWait,
    /// Liveness check, echoed.
    Ping {
        /// Echoed back unchanged.
        nonce: u32,
    },
    /// Push onto a queue.
    QueuePush {
        /// Queue name.
        key: Bytes,
        /// Element.
        value: Bytes,
    },
    /// Pop the front of a queue.
    QueuePop {
        /// Queue name.
        key: Bytes,
    },
    /// Length of a queue.
    QueueLen {
        /// Queue name.
        key: Bytes,
    },
    /// Every key of the key-value map.
    ListKeys,
    /// Count an arrival at a barrier; reply when `world_size` have arrived.
    Barrier {
        /// Counter key.
        key: Bytes,
        /// Arrivals needed.
        world_size: i64,
    },
}

/// The shape of the reply a request gets, which a reply decoder needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// One status byte (CHECK, WAIT, CANCEL_WAIT, BARRIER).
    Byte,
    /// A `u32` (PING).
    Nonce,
    /// An `i64` (ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN).
    Int,
    /// One length-prefixed value (GET, COMPARE_SET).
    Value,
    /// That many values back to back (MULTI_GET).
    Values(usize),
    /// `i64` length before the pop, then a value if it was positive (QUEUE_POP).
    Popped,
    /// `i64` count, then that many keys (LIST_KEYS).
    Keys,
}

/// One reply, as a server sends it and a client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A status byte ([`STOP_WAITING`], [`WAIT_CANCELED`], [`READY`], [`NOT_READY`]).
    Byte(u8),
    /// PING's echo.
    Nonce(u32),
    /// An integer.
    Int(i64),
    /// A value.
    Value(Bytes),
    /// Several values.
    Values(Vec<Bytes>),
    /// QUEUE_POP: the queue length before the pop, and the element when it was positive.
    Popped {
        /// Length before the pop.
        len_before: i64,
        /// The popped element (present iff `len_before > 0`).
        value: Option<Bytes>,
    },
    /// LIST_KEYS.
    Keys(Vec<Bytes>),
}

/// The outcome of [`scan_request`] on the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// A whole request of this many bytes is at the start of the buffer.
    Complete(usize),
    /// The request is not complete; it needs at least this many bytes in all.
    Incomplete(usize),
}

/// Reading cursor that records how far a partial frame got.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Outcome of one read: `Err(Ok(n))` = incomplete, need `n` bytes in all; `Err(Err(e))` = bad.
type Step<T> = std::result::Result<T, std::result::Result<usize, FrameError>>;

impl Cursor<'_> {
    fn take(&mut self, n: u64) -> Step<&[u8]> {
        let end = (self.pos as u64).saturating_add(n);
        if end > self.buf.len() as u64 {
            return Err(Ok(usize::try_from(end).unwrap_or(usize::MAX)));
        }
        let start = self.pos;
        self.pos = end as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn u8(&mut self) -> Step<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Step<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Step<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// A length-prefixed field; the length is checked against `max` before the body is needed.
    fn field(&mut self, max: u64, too_long: fn(u64, u64) -> FrameError) -> Step<(usize, usize)> {
        let len = self.u64()?;
        if len > max {
            return Err(Err(too_long(len, max)));
        }
        let start = self.pos;
        self.take(len)?;
        Ok((start, self.pos))
    }

    fn key(&mut self, limits: &Limits) -> Step<(usize, usize)> {
        self.field(limits.max_key_bytes, |len, max| FrameError::KeyTooLong {
            len,
            max,
        })
    }

    fn value(&mut self, limits: &Limits) -> Step<(usize, usize)> {
        self.field(limits.max_value_bytes, |len, max| {
            FrameError::ValueTooLong { len, max }
        })
    }

    fn count(&mut self, limits: &Limits) -> Step<u64> {
        let count = self.u64()?;
        if count > limits.max_keys {
            return Err(Err(FrameError::TooManyKeys {
                count,
                max: limits.max_keys,
            }));
        }
        Ok(count)
    }
}

/// Spans (start, end) of the fields of one request inside the scanned buffer.
struct Parsed {
    op: Opcode,
    spans: Vec<(usize, usize)>,
    int: u64,
    len: usize,
}

fn parse(buf: &[u8], limits: &Limits) -> Step<Parsed> {
    let mut cur = Cursor { buf, pos: 0 };
    let byte = cur.u8()?;
    let op = Opcode::from_byte(byte).ok_or(Err(FrameError::UnknownOpcode(byte)))?;
    let mut spans = Vec::new();
    let mut int = 0u64;
    let check_total = |cur: &Cursor<'_>| -> Step<()> {
        if cur.pos as u64 > limits.max_request_bytes {
            return Err(Err(FrameError::RequestTooLarge {
                len: cur.pos as u64,
                max: limits.max_request_bytes,
            }));
        }
        Ok(())
    };
    // A declared length that would push the frame past max_request_bytes is refused before its
    // body is awaited: an incomplete result whose need exceeds the cap is an error.
    let guard = |step: Step<(usize, usize)>| -> Step<(usize, usize)> {
        match step {
            Err(Ok(need)) if need as u64 > limits.max_request_bytes => {
                Err(Err(FrameError::RequestTooLarge {
                    len: need as u64,
                    max: limits.max_request_bytes,
                }))
            }
            other => other,
        }
    };
    match op {
        Opcode::Validate | Opcode::Ping => int = u64::from(cur.u32()?),
        Opcode::GetNumKeys | Opcode::CancelWait | Opcode::ListKeys => {}
        Opcode::Get | Opcode::DeleteKey | Opcode::QueuePop | Opcode::QueueLen => {
            spans.push(guard(cur.key(limits))?)
        }
        Opcode::Add | Opcode::Barrier => {
            spans.push(guard(cur.key(limits))?);
            int = cur.u64()?;
        }
        Opcode::Set | Opcode::Append | Opcode::QueuePush => {
            spans.push(guard(cur.key(limits))?);
            spans.push(guard(cur.value(limits))?);
        }
        Opcode::CompareSet => {
            spans.push(guard(cur.key(limits))?);
            spans.push(guard(cur.value(limits))?);
            spans.push(guard(cur.value(limits))?);
        }
        Opcode::Check | Opcode::Wait | Opcode::MultiGet => {
            for _ in 0..cur.count(limits)? {
                spans.push(guard(cur.key(limits))?);
                check_total(&cur)?;
            }
        }
        Opcode::MultiSet => {
            for _ in 0..cur.count(limits)? {
                spans.push(guard(cur.key(limits))?);
                spans.push(guard(cur.value(limits))?);
                check_total(&cur)?;
            }
        }
    }
    check_total(&cur)?;
    Ok(Parsed {
        op,
        spans,
        int,
        len: cur.pos,
    })
}

/// Finds out whether a whole request sits at the start of `buf`, without copying anything.
///
/// Errors as soon as the bytes seen break the protocol or a declared length breaks `limits`,
/// even when the rest of the frame has not arrived.
pub fn scan_request(buf: &[u8], limits: &Limits) -> Result<Scan, FrameError> {
    match parse(buf, limits) {
        Ok(parsed) => Ok(Scan::Complete(parsed.len)),
        Err(Ok(need)) => Ok(Scan::Incomplete(need)),
        Err(Err(err)) => Err(err),
    }
}

/// Splits one complete request off the front of `buf`, or returns `Ok(None)` (leaving `buf`
/// alone) when it is not complete yet. Keys and values share `buf`'s memory.
pub fn decode_request(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Request>, FrameError> {
    let parsed = match parse(buf, limits) {
        Ok(parsed) => parsed,
        Err(Ok(_)) => return Ok(None),
        Err(Err(err)) => return Err(err),
    };
    let frame = buf.split_to(parsed.len).freeze();
    let field = |i: usize| frame.slice(parsed.spans[i].0..parsed.spans[i].1);
    let all = || (0..parsed.spans.len()).map(field).collect::<Vec<_>>();
    Ok(Some(match parsed.op {
        Opcode::Validate => Request::Validate {
            magic: parsed.int as u32,
        },
        Opcode::Set => Request::Set {
            key: field(0),
            value: field(1),
        },
        Opcode::CompareSet => Request::CompareSet {
            key: field(0),
            expected: field(1),
            desired: field(2),
        },
        Opcode::Get => Request::Get { key: field(0) },
        Opcode::Add => Request::Add {
            key: field(0),
            delta: parsed.int as i64,
        },
        Opcode::Check => Request::Check { keys: all() },
        Opcode::Wait => Request::Wait { keys: all() },
        Opcode::GetNumKeys => Request::GetNumKeys,
        Opcode::DeleteKey => Request::DeleteKey { key: field(0) },
        Opcode::Append => Request::Append {
            key: field(0),
            value: field(1),
        },
        Opcode::MultiGet => Request::MultiGet { keys: all() },
        Opcode::MultiSet => {
            let fields = all();
            Request::MultiSet {
                pairs: fields
                    .chunks(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect(),
            }
        }
        Opcode::CancelWait => Request::CancelWait,
        Opcode::Ping => Request::Ping {
            nonce: parsed.int as u32,
        },
        Opcode::QueuePush => Request::QueuePush {
            key: field(0),
            value: field(1),
        },
        Opcode::QueuePop => Request::QueuePop { key: field(0) },
        Opcode::QueueLen => Request::QueueLen { key: field(0) },
        Opcode::ListKeys => Request::ListKeys,
        Opcode::Barrier => Request::Barrier {
            key: field(0),
            world_size: parsed.int as i64,
        },
    }))
}

fn put_field(dst: &mut BytesMut, bytes: &[u8]) {
    dst.put_u64_le(bytes.len() as u64);
    dst.put_slice(bytes);
}

fn put_keys(dst: &mut BytesMut, keys: &[Bytes]) {
    dst.put_u64_le(keys.len() as u64);
    keys.iter().for_each(|k| put_field(dst, k));
}

impl Request {
    /// The opcode of this request.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Validate { .. } => Opcode::Validate,
            Request::Set { .. } => Opcode::Set,
            Request::CompareSet { .. } => Opcode::CompareSet,
            Request::Get { .. } => Opcode::Get,
            Request::Add { .. } => Opcode::Add,
            Request::Check { .. } => Opcode::Check,
            Request::Wait { .. } => Opcode::Wait,
            Request::GetNumKeys => Opcode::GetNumKeys,
            Request::DeleteKey { .. } => Opcode::DeleteKey,
            Request::Append { .. } => Opcode::Append,
            Request::MultiGet { .. } => Opcode::MultiGet,
            Request::MultiSet { .. } => Opcode::MultiSet,
            Request::CancelWait => Opcode::CancelWait,
            Request::Ping { .. } => Opcode::Ping,
            Request::QueuePush { .. } => Opcode::QueuePush,
            Request::QueuePop { .. } => Opcode::QueuePop,
            Request::QueueLen { .. } => Opcode::QueueLen,
            Request::ListKeys => Opcode::ListKeys,
            Request::Barrier { .. } => Opcode::Barrier,
        }
    }

    /// What the server sends back, `None` for fire-and-forget requests.
    pub fn reply_kind(&self) -> Option<ReplyKind> {
        match self {
            Request::Validate { .. }
            | Request::Set { .. }
            | Request::Append { .. }
            | Request::MultiSet { .. }
            | Request::QueuePush { .. } => None,
            Request::Check { .. }
            | Request::Wait { .. }
            | Request::CancelWait
            | Request::Barrier { .. } => Some(ReplyKind::Byte),
            Request::Ping { .. } => Some(ReplyKind::Nonce),
            Request::Add { .. }
            | Request::GetNumKeys
            | Request::DeleteKey { .. }
            | Request::QueueLen { .. } => Some(ReplyKind::Int),
            Request::Get { .. } | Request::CompareSet { .. } => Some(ReplyKind::Value),
            Request::MultiGet { keys } => Some(ReplyKind::Values(keys.len())),
            Request::QueuePop { .. } => Some(ReplyKind::Popped),
            Request::ListKeys => Some(ReplyKind::Keys),
        }
    }

    /// Appends the request's wire bytes to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        dst.put_u8(self.opcode() as u8);
        match self {
            Request::Validate { magic: n } | Request::Ping { nonce: n } => dst.put_u32_le(*n),
            Request::GetNumKeys | Request::CancelWait | Request::ListKeys => {}
            Request::Get { key }
            | Request::DeleteKey { key }
            | Request::QueuePop { key }
            | Request::QueueLen { key } => put_field(dst, key),
            Request::Add { key, delta: n } | Request::Barrier { key, world_size: n } => {
                put_field(dst, key);
                dst.put_i64_le(*n);
            }
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value } => {
                put_field(dst, key);
                put_field(dst, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put_field(dst, key);
                put_field(dst, expected);
                put_field(dst, desired);
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                put_keys(dst, keys)
            }
            Request::MultiSet { pairs } => {
                dst.put_u64_le(pairs.len() as u64);
                for (k, v) in pairs {
                    put_field(dst, k);
                    put_field(dst, v);
                }
            }
        }
    }
}

impl Reply {
    /// Appends the reply's wire bytes to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        match self {
            Reply::Byte(b) => dst.put_u8(*b),
            Reply::Nonce(n) => dst.put_u32_le(*n),
            Reply::Int(n) => dst.put_i64_le(*n),
            Reply::Value(v) => put_field(dst, v),
            Reply::Values(vs) => vs.iter().for_each(|v| put_field(dst, v)),
            Reply::Popped { len_before, value } => {
                dst.put_i64_le(*len_before);
                if let Some(v) = value {
                    put_field(dst, v);
                }
            }
            Reply::Keys(keys) => put_keys(dst, keys),
        }
    }
}

/// Splits one complete reply of shape `kind` off the front of `buf`, or `Ok(None)` (leaving
/// `buf` alone) when it has not fully arrived. `limits` bounds what a client agrees to buffer.
pub fn decode_reply(
    kind: ReplyKind,
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Reply>, FrameError> {
    let mut cur = Cursor { buf, pos: 0 };
    let step: Step<Vec<(usize, usize)>> = (|| {
        let mut spans = Vec::new();
        match kind {
            ReplyKind::Byte => spans.push((0, cur.take(1).map(|_| 1)?)),
            ReplyKind::Nonce => spans.push((0, cur.take(4).map(|_| 4)?)),
            ReplyKind::Int => spans.push((0, cur.take(8).map(|_| 8)?)),
            ReplyKind::Value => spans.push(cur.value(limits)?),
            ReplyKind::Values(n) => {
                for _ in 0..n {
                    spans.push(cur.value(limits)?);
                }
            }
            ReplyKind::Popped => {
                if cur.u64()? as i64 > 0 {
                    spans.push(cur.value(limits)?);
                }
            }
            ReplyKind::Keys => {
                let count = cur.count(limits)?;
                for _ in 0..count {
                    spans.push(cur.key(limits)?);
                }
            }
        }
        Ok(spans)
    })();
    let spans = match step {
        Ok(spans) => spans,
        Err(Ok(_)) => return Ok(None),
        Err(Err(err)) => return Err(err),
    };
    let frame = buf.split_to(cur.pos).freeze();
    let field = |s: &(usize, usize)| frame.slice(s.0..s.1);
    Ok(Some(match kind {
        ReplyKind::Byte => Reply::Byte(frame[0]),
        ReplyKind::Nonce => Reply::Nonce((&frame[..]).get_u32_le()),
        ReplyKind::Int => Reply::Int((&frame[..]).get_i64_le()),
        ReplyKind::Value => Reply::Value(field(&spans[0])),
        ReplyKind::Values(_) => Reply::Values(spans.iter().map(field).collect()),
        ReplyKind::Popped => Reply::Popped {
            len_before: (&frame[..]).get_i64_le(),
            value: spans.first().map(field),
        },
        ReplyKind::Keys => Reply::Keys(spans.iter().map(field).collect()),
    }))
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
