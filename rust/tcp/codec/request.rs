//! Requests: the [`Request`] type, its encoding, and the two-step decoder (scan the length
//! prefixes against the limits, then split the complete frame off without copying).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::scan::{parse, scan_request_from, ScanMark};
use super::{put_field, put_keys, FrameError, Limits, Opcode, ReplyKind, Scan};

/// One request, as a client sends it and a server reads it. Keys are raw wire keys: torch's
/// client prefixes user keys with `/` before they get here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Handshake.
    Validate {
        /// Must be [`super::VALIDATE_MAGIC`].
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

/// Frames shorter than this are copied out of the read buffer; longer ones share its memory.
///
/// Sharing pins the whole read buffer for as long as any key or value of the frame lives (a
/// stored 10-byte value kept a 16 KiB buffer alive, and every pending WAIT its connection's
/// buffer), while copying a small frame costs less than the allocation it saves.
pub const SHARE_FRAMES_FROM: usize = 4 * 1024;

/// Takes one complete request off the front of `buf`, or returns `Ok(None)` (leaving `buf`
/// alone) when it is not complete yet. Keys and values of a large frame share `buf`'s memory;
/// a small frame is copied (see `SHARE_FRAMES_FROM`).
pub fn decode_request(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Request>, FrameError> {
    decode_request_from(buf, limits, &mut ScanMark::default())
}

/// [`decode_request`] for a connection that keeps a [`ScanMark`] of its incomplete frame: an
/// incomplete multi-key frame is scanned on from where the last call stopped, and parsed whole
/// (for its fields) only once it is complete.
pub fn decode_request_from(
    buf: &mut BytesMut,
    limits: &Limits,
    mark: &mut ScanMark,
) -> Result<Option<Request>, FrameError> {
    if mark.is_set() {
        match scan_request_from(buf, limits, mark)? {
            Scan::Incomplete(_) => return Ok(None),
            Scan::Complete(_) => *mark = ScanMark::default(),
        }
    }
    let mut progress = ScanMark::default();
    let parsed = match parse(buf, limits, &mut progress, true) {
        Ok(parsed) => parsed,
        Err(Ok(_)) => {
            *mark = progress;
            return Ok(None);
        }
        Err(Err(err)) => return Err(err),
    };
    let frame = if parsed.len < SHARE_FRAMES_FROM {
        let copy = Bytes::copy_from_slice(&buf[..parsed.len]);
        buf.advance(parsed.len);
        copy
    } else {
        buf.split_to(parsed.len).freeze()
    };
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
