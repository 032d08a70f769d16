//! A queue kept in one etcd value: its elements, each as a little-endian `u32` length and the
//! bytes.
//!
//! One key per queue makes push and pop one compare-and-swap of one key (see [`super::rmw`]),
//! so both are atomic without a lock, and the key exists exactly while the queue is non-empty,
//! which is what `check` and `wait` ask. Queues in torch jobs are short (elastic agents' work
//! lists), so rewriting the value on each operation costs little.

use crate::error::{Error, Result};

/// `queue` with `value` appended at the back.
pub fn pushed(queue: &[u8], value: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(value.len())
        .map_err(|_| Error::InvalidArgument("queue_push: value longer than 4 GiB".into()))?;
    let mut out = Vec::with_capacity(queue.len() + 4 + value.len());
    out.extend_from_slice(queue);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(value);
    Ok(out)
}

/// The front element and the rest; `None` for an empty queue.
pub fn popped(queue: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    if queue.is_empty() {
        return Ok(None);
    }
    let (front, rest) = split_front(queue)?;
    Ok(Some((front.to_vec(), rest.to_vec())))
}

/// Number of elements.
pub fn len(mut queue: &[u8]) -> Result<i64> {
    let mut count = 0;
    while !queue.is_empty() {
        queue = split_front(queue)?.1;
        count += 1;
    }
    Ok(count)
}

fn split_front(queue: &[u8]) -> Result<(&[u8], &[u8])> {
    let corrupt = || Error::Store("an etcd queue value is not in EtcdStore's format".into());
    let header: [u8; 4] = queue
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(corrupt)?;
    let end = 4 + u32::from_le_bytes(header) as usize;
    if queue.len() < end {
        return Err(corrupt());
    }
    Ok((&queue[4..end], &queue[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_come_out_in_push_order() {
        let q = pushed(&pushed(b"", b"a").unwrap(), b"").unwrap();
        assert_eq!(len(&q).unwrap(), 2);
        let (front, rest) = popped(&q).unwrap().unwrap();
        assert_eq!(front, b"a");
        assert_eq!(popped(&rest).unwrap().unwrap(), (Vec::new(), Vec::new()));
        assert!(popped(b"").unwrap().is_none());
        assert!(len(b"\x05\0\0\0ab").is_err());
    }
}
