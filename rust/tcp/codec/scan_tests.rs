//! Resumable scanning: a frame fed a few bytes at a time gives, at every step, what a scan
//! from the start gives, and bytes before the mark are not read again.

use super::*;
use proptest::prelude::*;

fn wait_frame(keys: usize, key_len: usize) -> (Request, BytesMut) {
    let keys: Vec<Bytes> = (0..keys)
        .map(|i| Bytes::from(format!("/{i:0>width$}", width = key_len.max(1) - 1)))
        .collect();
    let req = Request::Wait { keys };
    let mut buf = BytesMut::new();
    req.encode(&mut buf);
    (req, buf)
}

/// Feeds `full` to a connection-like buffer in pieces of `step` bytes, scanning with a mark
/// after each piece; checks every answer against a fresh scan and returns the decoded request.
fn trickle(full: &[u8], step: usize, limits: &Limits) -> Request {
    let mut input = BytesMut::new();
    let mut mark = ScanMark::default();
    for chunk in full.chunks(step) {
        input.extend_from_slice(chunk);
        let resumed = scan_request_from(&input, limits, &mut mark);
        assert_eq!(
            resumed,
            scan_request(&input, limits),
            "at {} bytes",
            input.len()
        );
        if let Some(req) = decode_request_from(&mut input, limits, &mut mark).unwrap() {
            assert!(
                input.is_empty() && !mark.is_set(),
                "the mark is reset with the frame"
            );
            return req;
        }
    }
    panic!("the whole frame never decoded");
}

#[test]
fn a_trickled_multi_key_frame_scans_on_from_its_mark_and_decodes_once_whole() {
    let (req, full) = wait_frame(2_000, 12);
    assert_eq!(trickle(&full, 7, &Limits::default()), req);
}

#[test]
fn bytes_before_the_mark_are_not_read_again() {
    let (_, full) = wait_frame(100, 8);
    let limits = Limits::default();
    let mut mark = ScanMark::default();
    let half = full.len() / 2;
    assert!(matches!(
        scan_request_from(&full[..half], &limits, &mut mark),
        Ok(Scan::Incomplete(_))
    ));
    assert!(mark.is_set());
    // Break the first key's length prefix (opcode byte, count, then the first length): a scan
    // from the start refuses the frame, a scan from the mark never looks there again.
    let mut broken = BytesMut::from(&full[..half + 40]);
    broken[9..17].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(scan_request(&broken, &limits).is_err());
    assert!(matches!(
        scan_request_from(&broken, &limits, &mut mark),
        Ok(Scan::Incomplete(_))
    ));
}

#[test]
fn multi_set_pairs_resume_after_a_whole_pair() {
    let req = Request::MultiSet {
        pairs: (0..300)
            .map(|i| {
                (
                    Bytes::from(format!("/k{i}")),
                    Bytes::from(vec![b'v'; i % 17]),
                )
            })
            .collect(),
    };
    let mut full = BytesMut::new();
    req.encode(&mut full);
    assert_eq!(trickle(&full, 5, &Limits::default()), req);
}

#[test]
fn a_limit_broken_after_the_mark_is_still_refused() {
    let limits = Limits {
        max_key_bytes: 16,
        ..Limits::default()
    };
    let (_, mut full) = wait_frame(50, 8);
    let mut mark = ScanMark::default();
    let cut = full.len() / 2;
    let _ = scan_request_from(&full[..cut], &limits, &mut mark);
    // the last key's length prefix now declares 1 KiB
    let last = full.len() - 16;
    full[last..last + 8].copy_from_slice(&1024u64.to_le_bytes());
    assert!(matches!(
        scan_request_from(&full, &limits, &mut mark),
        Err(FrameError::KeyTooLong { len: 1024, max: 16 })
    ));
}

proptest! {
    #[test]
    fn resumed_scans_agree_with_fresh_ones(
        keys in 1usize..60, key_len in 1usize..20, step in 1usize..40,
    ) {
        let (req, full) = wait_frame(keys, key_len);
        prop_assert_eq!(trickle(&full, step, &Limits::default()), req);
    }
}
