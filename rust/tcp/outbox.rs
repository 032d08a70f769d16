//! Replies waiting to be written to one connection, with stored values shared, not copied.
//!
//! A reply can be far larger than the request that asked for it: one MULTI_GET of ~5 KiB that
//! names a 1 MiB key 400 times asks for 400 MiB, and 400 pipelined GETs do the same. Copying such
//! replies into one buffer lets any client that stops reading make the server hold gigabytes.
//! So values above [`COPY_LIMIT`] are queued as `Bytes` handles on the stored value (a refcount,
//! no copy), and the handler stops taking new requests while more than [`HIGH_WATER`] bytes wait
//! to be written. A connection's memory is then its length prefixes and small values, never the
//! size of the replies it asked for.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::codec::Reply;

/// Values up to this size are copied next to their length prefix (fewer writes).
pub const COPY_LIMIT: usize = 4 * 1024;
/// While this many bytes wait to be written, the handler decodes no further request.
pub const HIGH_WATER: usize = 64 * 1024;

/// The write queue of one connection.
#[derive(Default)]
pub struct Outbox {
    /// Sealed pieces, written in order.
    chunks: VecDeque<Bytes>,
    /// Small bytes not yet sealed into a chunk.
    tail: BytesMut,
    /// Bytes queued in `chunks` and `tail`.
    queued: usize,
}

impl Outbox {
    /// Bytes waiting to be written (shared values counted at full size).
    pub fn len(&self) -> usize {
        self.queued
    }

    /// Nothing waits to be written.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Queues one status byte.
    pub fn put_u8(&mut self, byte: u8) {
        self.tail.put_u8(byte);
        self.queued += 1;
    }

    fn put_value(&mut self, value: &Bytes) {
        self.tail.put_u64_le(value.len() as u64);
        self.queued += 8 + value.len();
        if value.len() <= COPY_LIMIT {
            self.tail.put_slice(value);
        } else {
            if !self.tail.is_empty() {
                self.chunks.push_back(self.tail.split().freeze());
            }
            self.chunks.push_back(value.clone());
        }
    }

    /// Queues a reply: the same bytes as [`Reply::encode`], with large values shared.
    pub fn push(&mut self, reply: &Reply) {
        match reply {
            Reply::Value(v) => self.put_value(v),
            Reply::Values(vs) => vs.iter().for_each(|v| self.put_value(v)),
            Reply::Popped { len_before, value } => {
                self.tail.put_i64_le(*len_before);
                self.queued += 8;
                if let Some(v) = value {
                    self.put_value(v);
                }
            }
            small => {
                let before = self.tail.len();
                small.encode(&mut self.tail);
                self.queued += self.tail.len() - before;
            }
        }
    }

    /// Writes everything queued; the queue's memory is released as it goes.
    pub async fn flush(&mut self, stream: &mut TcpStream) -> std::io::Result<()> {
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
        while let Some(chunk) = self.chunks.pop_front() {
            stream.write_all(&chunk).await?;
            self.queued -= chunk.len();
        }
        self.queued = 0;
        Ok(())
    }

    #[cfg(test)]
    fn concat(&self) -> Vec<u8> {
        let mut all: Vec<u8> = self.chunks.iter().flat_map(|c| c.iter().copied()).collect();
        all.extend_from_slice(&self.tail);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_bytes_equal_the_codec_encoding() {
        let big = Bytes::from(vec![7u8; COPY_LIMIT + 1]);
        let small = Bytes::from_static(b"abc");
        let replies = [
            Reply::Byte(1),
            Reply::Nonce(0xDEAD_BEEF),
            Reply::Int(-5),
            Reply::Value(small.clone()),
            Reply::Value(big.clone()),
            Reply::Values(vec![small.clone(), big.clone(), Bytes::new(), big.clone()]),
            Reply::Popped {
                len_before: 2,
                value: Some(big.clone()),
            },
            Reply::Popped {
                len_before: 0,
                value: None,
            },
            Reply::Keys(vec![small.clone(), small]),
        ];
        let mut outbox = Outbox::default();
        let mut expected = BytesMut::new();
        for reply in &replies {
            outbox.push(reply);
            reply.encode(&mut expected);
        }
        assert_eq!(outbox.concat(), expected.to_vec());
        assert_eq!(outbox.len(), expected.len());
    }

    #[test]
    fn large_values_are_shared_not_copied() {
        let big = Bytes::from(vec![1u8; 1 << 20]);
        let mut outbox = Outbox::default();
        outbox.push(&Reply::Values(vec![big.clone(); 400]));
        assert_eq!(outbox.len(), 400 * ((1 << 20) + 8));
        // Only the 8-byte length prefixes were copied.
        assert!(outbox
            .chunks
            .iter()
            .all(|c| c.len() == 8 || c.as_ptr() == big.as_ptr()));
    }
}
