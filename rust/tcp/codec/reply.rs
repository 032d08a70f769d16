//! Replies: the [`Reply`] type, its encoding, and its decoder, which needs the [`ReplyKind`]
//! of the request it answers (the wire does not say).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{put_field, put_keys, Cursor, FrameError, Limits, Step};

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
    /// A status byte ([`super::STOP_WAITING`], [`super::WAIT_CANCELED`], [`super::READY`], [`super::NOT_READY`]).
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
