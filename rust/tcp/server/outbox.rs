//! Replies waiting to be written to one connection.
//!
//! Small replies are copied into one buffer so that a burst of them goes out in one write.
//! Large values are not copied at all: the reply shares the stored value's memory ([`Bytes`] is
//! reference-counted) and is written straight from it. So a GET of an 8 MiB value costs no
//! 8 MiB copy, and a MULTI_GET naming one large key many times cannot make the server build a
//! huge reply buffer; what a connection holds stays bounded by what is stored.
//!
//! A MULTI_GET whose reply would be larger than [`STREAM_AT_BYTES`] is streamed: its values
//! stay shared references and are copied into the write buffer a window at a time, as the peer
//! reads. One 1.3 MB request for 128K copies of a 4,095-byte value used to build a 513 MiB
//! reply before writing a byte (8 such connections grew the server by 4.1 GiB); now it holds
//! 32 bytes per value plus one window. Anything queued behind a streamed reply waits in
//! `after` until the stream is done, so replies keep their order.
//!
//! An engine that copies small values out (the in-memory one packs each key with its value)
//! hands a long MULTI_GET over as a [`ValueSource`] instead: the values are read a window at a
//! time as the peer reads, so an unread reply holds one window, never the whole.

use std::collections::VecDeque;

use std::io::ErrorKind;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::AsyncWrite;

use super::work_slice::Turn;
pub use crate::store::engine::ValueSource;
use crate::tcp::codec::Reply;

/// Values at least this long are written from shared memory instead of being copied.
const SHARE_AT_BYTES: usize = 4 * 1024;

/// A MULTI_GET reply larger than this is streamed a window of this size at a time.
pub const STREAM_AT_BYTES: usize = 64 * 1024;

/// Replies not yet written.
///
/// Two words when only small replies are queued (every connection of a rendezvous storm keeps
/// one); shared values and streamed replies live in `Large`, allocated when first needed.
#[derive(Default)]
pub struct Outbox {
    small: BytesMut,
    large: Option<Box<Large>>,
}

/// What an outbox holds beyond copied bytes.
#[derive(Default)]
struct Large {
    /// Shared values (and the copied bytes queued before each), written before `small`.
    chunks: VecDeque<Bytes>,
    /// Bytes in `chunks`.
    queued: usize,
    /// Values of a streamed MULTI_GET reply not yet moved out, and their encoded size.
    streaming: VecDeque<Bytes>,
    streaming_bytes: usize,
    /// Where the rest of a streamed reply's values come from, when they are read lazily.
    source: Option<Box<dyn ValueSource>>,
    /// Replies queued while a reply streams; written after it.
    after: BytesMut,
}

impl Outbox {
    /// Bytes queued (shared values included).
    pub fn len(&self) -> usize {
        let large = self
            .large
            .as_ref()
            .map_or(0, |l| l.queued + l.streaming_bytes + l.after.len());
        self.small.len() + large
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn streaming(&self) -> bool {
        self.large
            .as_ref()
            .is_some_and(|l| !l.streaming.is_empty() || l.source.is_some())
    }

    /// Queues a reply of values read from `source` a window at a time. Behind another streamed
    /// reply (a client pipelining long MULTI_GETs) it is read whole, to keep replies in order.
    pub fn stream(&mut self, mut source: Box<dyn ValueSource>) {
        let mut values = VecDeque::new();
        if self.streaming() {
            while source.next_window(&mut values) {}
            self.reply(Reply::Values(values.into()));
            return;
        }
        let more = source.next_window(&mut values);
        let large = self.large();
        large.streaming_bytes = values.iter().map(|v| 8 + v.len()).sum();
        large.streaming = values;
        large.source = more.then_some(source);
    }

    /// Reads the next window of a lazily read reply into `streaming`; false when none is left.
    fn pull_window(large: &mut Large) -> bool {
        let Some(source) = large.source.as_mut() else {
            return false;
        };
        let before = large.streaming.len();
        if !source.next_window(&mut large.streaming) {
            large.source = None;
        }
        let added: usize = large
            .streaming
            .iter()
            .skip(before)
            .map(|v| 8 + v.len())
            .sum();
        large.streaming_bytes += added;
        large.streaming.len() > before || large.source.is_some()
    }

    fn large(&mut self) -> &mut Large {
        self.large.get_or_insert_with(Box::default)
    }

    /// Queues one status byte.
    pub fn put_u8(&mut self, byte: u8) {
        if self.streaming() {
            self.large().after.put_u8(byte);
        } else {
            self.small.put_u8(byte);
        }
    }

    /// Queues raw bytes (the auth challenge, which is no torch reply).
    pub fn put_slice(&mut self, bytes: &[u8]) {
        if self.streaming() {
            self.large().after.put_slice(bytes);
        } else {
            self.small.put_slice(bytes);
        }
    }

    fn put_value(&mut self, value: Bytes) {
        self.small.put_u64_le(value.len() as u64);
        if value.len() < SHARE_AT_BYTES {
            self.small.put_slice(&value);
            return;
        }
        let head = (!self.small.is_empty()).then(|| self.small.split().freeze());
        let large = self.large();
        if let Some(head) = head {
            large.queued += head.len();
            large.chunks.push_back(head);
        }
        large.queued += value.len();
        large.chunks.push_back(value);
    }

    /// Queues a reply, sharing large values rather than copying them.
    pub fn reply(&mut self, reply: Reply) {
        if self.streaming() {
            reply.encode(&mut self.large().after); // rare: behind a streamed reply, in order
            return;
        }
        match reply {
            Reply::Value(v) => self.put_value(v),
            Reply::Values(vs) => {
                let encoded: usize = vs.iter().map(|v| 8 + v.len()).sum();
                if encoded > STREAM_AT_BYTES {
                    let large = self.large();
                    large.streaming_bytes = encoded;
                    large.streaming = vs.into();
                } else {
                    vs.into_iter().for_each(|v| self.put_value(v));
                }
            }
            Reply::Popped { len_before, value } => {
                self.small.put_i64_le(len_before);
                if let Some(v) = value {
                    self.put_value(v);
                }
            }
            other => other.encode(&mut self.small),
        }
    }

    /// Writes everything queued, then gives its buffers back; pends while the peer's socket is
    /// full or once `turn` is over (what was written so far stays written).
    pub fn poll_write_to<W: AsyncWrite + Unpin>(
        &mut self,
        sink: &mut W,
        cx: &mut Context<'_>,
        turn: &Turn,
    ) -> Poll<std::io::Result<()>> {
        loop {
            ready!(self.poll_write_queued(sink, cx))?;
            if !self.refill() {
                break;
            }
            ready!(turn.poll_continue(cx));
        }
        // Hold no buffer between replies: most connections are idle most of the time.
        self.small = BytesMut::new();
        self.large = None;
        Poll::Ready(Ok(()))
    }

    /// Moves the next window of a streamed reply (or, once it is done, what queued behind it)
    /// into the write buffers; false when nothing is left.
    fn refill(&mut self) -> bool {
        let Some(large) = self.large.as_mut() else {
            return false;
        };
        if large.streaming.is_empty() && !Self::pull_window(large) {
            if large.after.is_empty() {
                return false;
            }
            self.small = std::mem::take(&mut large.after);
            return true;
        }
        let mut window = 0;
        while window < STREAM_AT_BYTES {
            let Some(large) = self.large.as_mut() else {
                break;
            };
            let Some(value) = large.streaming.pop_front() else {
                // A lazily read reply gives a few hundred values at a time: read on until the
                // window is full, so a write carries a window, not one source window.
                if Self::pull_window(large) && !large.streaming.is_empty() {
                    continue;
                }
                break;
            };
            window += 8 + value.len();
            large.streaming_bytes -= 8 + value.len();
            self.put_value(value);
        }
        true
    }

    /// Writes the shared chunks, then the copied bytes.
    fn poll_write_queued<W: AsyncWrite + Unpin>(
        &mut self,
        sink: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(large) = self.large.as_mut() {
            while let Some(chunk) = large.chunks.front_mut() {
                let written = ready!(Pin::new(&mut *sink).poll_write(cx, chunk))?;
                if written == 0 {
                    return Poll::Ready(Err(ErrorKind::WriteZero.into()));
                }
                large.queued -= written;
                chunk.advance(written);
                if chunk.is_empty() {
                    large.chunks.pop_front();
                }
            }
        }
        while !self.small.is_empty() {
            let written = ready!(Pin::new(&mut *sink).poll_write(cx, &self.small))?;
            if written == 0 {
                return Poll::Ready(Err(ErrorKind::WriteZero.into()));
            }
            self.small.advance(written);
        }
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
        std::future::poll_fn(|cx| outbox.poll_write_to(&mut written, cx, &Turn::start()))
            .await
            .unwrap();
        assert_eq!(written, expected.to_vec());
        assert!(outbox.is_empty());
    }

    /// The fault hunt's amplifying MULTI_GET: 128K copies of a 4,095-byte value. Queued, it
    /// holds the values' references, not a 513 MiB copy; written, the bytes are the reply's.
    #[tokio::test]
    async fn a_huge_multi_get_reply_streams_in_order_with_what_follows() {
        let value = Bytes::from(vec![3u8; 4095]);
        let values = vec![value; 128 * 1024];
        let mut outbox = Outbox::default();
        outbox.reply(Reply::Values(values.clone()));
        outbox.put_u8(0);
        outbox.reply(Reply::Int(9));
        assert!(
            outbox.small.len() <= STREAM_AT_BYTES,
            "nothing copied up front"
        );
        let mut expected = BytesMut::new();
        Reply::Values(values).encode(&mut expected);
        expected.put_u8(0);
        Reply::Int(9).encode(&mut expected);
        assert_eq!(outbox.len(), expected.len());
        let mut written = Vec::new();
        std::future::poll_fn(|cx| outbox.poll_write_to(&mut written, cx, &Turn::start()))
            .await
            .unwrap();
        assert!(written == expected.to_vec(), "bytes differ");
        assert!(outbox.is_empty());
    }

    /// Values made on demand, `per_window` at a time, counting how many exist at once.
    struct Counted {
        left: usize,
        per_window: usize,
        made: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl ValueSource for Counted {
        fn next_window(&mut self, out: &mut VecDeque<Bytes>) -> bool {
            let n = self.left.min(self.per_window);
            self.left -= n;
            self.made.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            out.extend((0..n).map(|_| Bytes::from(vec![5u8; 4095])));
            self.left > 0
        }
    }

    /// A lazily read reply holds one window until the peer takes it; replies queued behind it
    /// (and a second streamed reply) come out after it, in order.
    #[tokio::test]
    async fn a_lazy_reply_is_read_a_window_at_a_time_and_keeps_its_place() {
        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let source = |left| {
            Box::new(Counted {
                left,
                per_window: 256,
                made: made.clone(),
            })
        };
        let mut outbox = Outbox::default();
        outbox.stream(source(10_000));
        assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 256);
        outbox.reply(Reply::Int(9));
        outbox.stream(source(300)); // behind a stream: read whole, written after it
        let value = Bytes::from(vec![5u8; 4095]);
        let mut expected = BytesMut::new();
        Reply::Values(vec![value.clone(); 10_000]).encode(&mut expected);
        Reply::Int(9).encode(&mut expected);
        Reply::Values(vec![value; 300]).encode(&mut expected);
        let mut written = Vec::new();
        std::future::poll_fn(|cx| outbox.poll_write_to(&mut written, cx, &Turn::start()))
            .await
            .unwrap();
        assert!(written == expected.to_vec(), "bytes differ");
        assert!(outbox.is_empty());
    }
}
