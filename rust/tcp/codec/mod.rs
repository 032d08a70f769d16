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

use bytes::{BufMut, Bytes, BytesMut};

mod reply;
mod request;
mod scan;

pub use reply::{decode_reply, Reply, ReplyKind};
pub use request::{decode_request, decode_request_from, Request};
pub use scan::{scan_request, scan_request_from, ScanMark};

/// The magic number of the VALIDATE handshake (`00 CE F7 85 3C` on the wire).
pub const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;

/// The nonce of the PING by which ferrodist's client says that it is ferrodist's. Its handshake
/// is torch's (VALIDATE, then a PING whose nonce is the process id, below 2^22 on Linux, so no
/// stock client sends this one); this PING follows, in front of the connection's first request
/// or within the handshake once the client knows the server. A ferrodist server answers
/// [`FERRODIST_PONG`] instead of the echo and from then on treats the connection as a
/// ferrodist client (it may pipeline a GET behind its WAIT); any other server echoes it, which
/// tells the client that the server is not ferrodist's. Either way it costs no round trip: the
/// answer is read just before the reply of the request it went out with.
pub const FERRODIST_PING: u32 = 0xF0D1_57C1;

/// What ferrodist's server answers to [`FERRODIST_PING`] (every other nonce is echoed).
pub const FERRODIST_PONG: u32 = 0xF0D1_57C2;

/// [`FERRODIST_PONG`] from a server whose state outlives it (`--backend etcd://...`): a client
/// that loses its connection keeps trying to reconnect until its call's deadline, since a
/// restarted server (or another one on the same address) still has every key. Against a server
/// that keeps its state in memory, a lost connection fails the call at once: a restarted one
/// would have none of the job's keys.
pub const FERRODIST_PONG_DURABLE: u32 = 0xF0D1_57C4;

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

/// The outcome of [`scan_request`] on the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// A whole request of this many bytes is at the start of the buffer.
    Complete(usize),
    /// The request is not complete; it needs at least this many bytes in all.
    Incomplete(usize),
}

/// Reading cursor that records how far a partial frame got.
pub(crate) struct Cursor<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

/// Outcome of one read: `Err(Ok(n))` = incomplete, need `n` bytes in all; `Err(Err(e))` = bad.
pub(crate) type Step<T> = std::result::Result<T, std::result::Result<usize, FrameError>>;

impl Cursor<'_> {
    pub(crate) fn take(&mut self, n: u64) -> Step<&[u8]> {
        let end = (self.pos as u64).saturating_add(n);
        if end > self.buf.len() as u64 {
            return Err(Ok(usize::try_from(end).unwrap_or(usize::MAX)));
        }
        let start = self.pos;
        self.pos = end as usize;
        Ok(&self.buf[start..self.pos])
    }

    pub(crate) fn u8(&mut self) -> Step<u8> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Step<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub(crate) fn u64(&mut self) -> Step<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// A length-prefixed field; the length is checked against `max` before the body is needed.
    pub(crate) fn field(
        &mut self,
        max: u64,
        too_long: fn(u64, u64) -> FrameError,
    ) -> Step<(usize, usize)> {
        let len = self.u64()?;
        if len > max {
            return Err(Err(too_long(len, max)));
        }
        let start = self.pos;
        self.take(len)?;
        Ok((start, self.pos))
    }

    pub(crate) fn key(&mut self, limits: &Limits) -> Step<(usize, usize)> {
        self.field(limits.max_key_bytes, |len, max| FrameError::KeyTooLong {
            len,
            max,
        })
    }

    pub(crate) fn value(&mut self, limits: &Limits) -> Step<(usize, usize)> {
        self.field(limits.max_value_bytes, |len, max| {
            FrameError::ValueTooLong { len, max }
        })
    }

    pub(crate) fn count(&mut self, limits: &Limits) -> Step<u64> {
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

pub(crate) fn put_field(dst: &mut BytesMut, bytes: &[u8]) {
    dst.put_u64_le(bytes.len() as u64);
    dst.put_slice(bytes);
}

pub(crate) fn put_keys(dst: &mut BytesMut, keys: &[Bytes]) {
    dst.put_u64_le(keys.len() as u64);
    keys.iter().for_each(|k| put_field(dst, k));
}

#[cfg(test)]
mod scan_tests;
#[cfg(test)]
mod tests;
