//! Replies waiting to be written to one connection.
//!
//! Small replies are copied into one buffer so that a burst of them goes out in one write.
//! Large values are not copied at all: the reply shares the stored value's memory ([`Bytes`] is
//! reference-counted) and is written straight from it. So a GET of an 8 MiB value costs no
//! 8 MiB copy, and a MULTI_GET naming one large key many times cannot make the server build a
//! huge reply buffer; what a connection holds stays bounded by what is stored.

use std::collections::VecDeque;

use std::io::ErrorKind;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::AsyncWrite;

use super::codec::Reply;

/// Values at least this long are written from shared memory instead of being copied.
const SHARE_AT_BYTES: usize = 4 * 1024;

/// Replies not yet written.
#[derive(Default)]
pub struct Outbox {
    small: BytesMut,
    chunks: VecDeque<Bytes>,
    queued: usize,
}

impl Outbox {
    /// Bytes queued (shared values included).
    pub fn len(&self) -> usize {
        self.queued + self.small.len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues one status byte.
    pub fn put_u8(&mut self, byte: u8) {
        self.small.put_u8(byte);
    }

    fn put_value(&mut self, value: Bytes) {
        self.small.put_u64_le(value.len() as u64);
        if value.len() < SHARE_AT_BYTES {
            self.small.put_slice(&value);
            return;
        }
        if !self.small.is_empty() {
            let head = self.small.split().freeze();
            self.queued += head.len();
            self.chunks.push_back(head);
        }
        self.queued += value.len();
        self.chunks.push_back(value);
    }

    /// Queues a reply, sharing large values rather than copying them.
    pub fn reply(&mut self, reply: Reply) {
        match reply {
            Reply::Value(v) => self.put_value(v),
            Reply::Values(vs) => vs.into_iter().for_each(|v| self.put_value(v)),
            Reply::Popped { len_before, value } => {
                self.small.put_i64_le(len_before);
                if let Some(v) = value {
                    self.put_value(v);
                }
            }
            other => other.encode(&mut self.small),
        }
    }

    /// Writes everything queued, then gives its buffer back; pends while the peer's socket is
    /// full (what was written so far stays written).
    pub fn poll_write_to<W: AsyncWrite + Unpin>(
        &mut self,
        sink: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        while let Some(chunk) = self.chunks.front_mut() {
            let written = ready!(Pin::new(&mut *sink).poll_write(cx, chunk))?;
            if written == 0 {
                return Poll::Ready(Err(ErrorKind::WriteZero.into()));
            }
            self.queued -= written;
            chunk.advance(written);
            if chunk.is_empty() {
                self.chunks.pop_front();
            }
        }
        while !self.small.is_empty() {
            let written = ready!(Pin::new(&mut *sink).poll_write(cx, &self.small))?;
            if written == 0 {
                return Poll::Ready(Err(ErrorKind::WriteZero.into()));
            }
            self.small.advance(written);
        }
        // Hold no buffer between replies: most connections are idle most of the time.
        self.small = BytesMut::new();
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replies_come_out_in_order_with_large_values_shared() {
        let big = Bytes::from(vec![7u8; 10_000]);
        let mut outbox = Outbox::default();
        outbox.put_u8(0);
        outbox.reply(Reply::Values(vec![Bytes::from_static(b"ab"), big.clone()]));
        outbox.reply(Reply::Int(5));
        let mut expected = BytesMut::new();
        expected.put_u8(0);
        Reply::Values(vec![Bytes::from_static(b"ab"), big]).encode(&mut expected);
        Reply::Int(5).encode(&mut expected);
        assert_eq!(outbox.len(), expected.len());
        let mut written = Vec::new();
        std::future::poll_fn(|cx| outbox.poll_write_to(&mut written, cx))
            .await
            .unwrap();
        assert_eq!(written, expected.to_vec());
        assert!(outbox.is_empty());
    }
}
