//! Codec tests: torch's byte-exact examples, limits checked before bodies, and round trips of
//! every request and reply shape.

use super::*;
use proptest::prelude::*;

fn encoded(req: &Request) -> BytesMut {
    let mut buf = BytesMut::new();
    req.encode(&mut buf);
    buf
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[test]
fn validate_and_ping_match_torchs_bytes() {
    let validate = encoded(&Request::Validate {
        magic: VALIDATE_MAGIC,
    });
    assert_eq!(&validate[..], [0x00, 0xCE, 0xF7, 0x85, 0x3C]);
    let ping = encoded(&Request::Ping { nonce: 0x1356 });
    assert_eq!(&ping[..], [0x0D, 0x56, 0x13, 0x00, 0x00]);
}

#[test]
fn set_matches_the_stock_clients_capture() {
    let set = encoded(&Request::Set {
        key: b("/k"),
        value: b("v"),
    });
    let expected: &[u8] = &[
        1, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b'k', 1, 0, 0, 0, 0, 0, 0, 0, b'v',
    ];
    assert_eq!(&set[..], expected);
}

#[test]
fn every_prefix_of_a_frame_is_incomplete_and_the_whole_frame_decodes() {
    let req = Request::MultiSet {
        pairs: vec![(b("/a"), b("1")), (b("/bb"), b(""))],
    };
    let full = encoded(&req);
    for cut in 0..full.len() {
        let mut part = BytesMut::from(&full[..cut]);
        assert_eq!(
            decode_request(&mut part, &Limits::default()),
            Ok(None),
            "cut {cut}"
        );
        assert_eq!(part.len(), cut, "a partial frame must stay in the buffer");
        match scan_request(&full[..cut], &Limits::default()) {
            Ok(Scan::Incomplete(need)) => assert!(need > cut && need <= full.len()),
            other => panic!("cut {cut}: {other:?}"),
        }
    }
    let mut both = full.clone();
    both.extend_from_slice(&encoded(&Request::GetNumKeys));
    assert_eq!(
        scan_request(&both, &Limits::default()),
        Ok(Scan::Complete(full.len()))
    );
    assert_eq!(decode_request(&mut both, &Limits::default()), Ok(Some(req)));
    assert_eq!(
        decode_request(&mut both, &Limits::default()),
        Ok(Some(Request::GetNumKeys))
    );
    assert!(both.is_empty());
}

#[test]
fn an_oversized_declared_length_is_refused_before_the_body_arrives() {
    let limits = Limits::default();
    let mut head = BytesMut::new();
    head.put_u8(Opcode::Set as u8);
    head.put_u64_le(2);
    head.put_slice(b"/k");
    head.put_u64_le(limits.max_value_bytes + 1);
    assert_eq!(
        decode_request(&mut head, &limits),
        Err(FrameError::ValueTooLong {
            len: limits.max_value_bytes + 1,
            max: limits.max_value_bytes
        })
    );
    let mut key = BytesMut::new();
    key.put_u8(Opcode::Get as u8);
    key.put_u64_le(1 << 62);
    assert!(matches!(
        decode_request(&mut key, &limits),
        Err(FrameError::KeyTooLong { .. })
    ));
    let mut many = BytesMut::new();
    many.put_u8(Opcode::Wait as u8);
    many.put_u64_le(limits.max_keys + 1);
    assert!(matches!(
        decode_request(&mut many, &limits),
        Err(FrameError::TooManyKeys { .. })
    ));
}

#[test]
fn a_key_of_exactly_the_limit_is_accepted() {
    let key = Bytes::from(vec![b'x'; 8192]);
    let mut buf = encoded(&Request::Get { key: key.clone() });
    assert_eq!(
        decode_request(&mut buf, &Limits::default()),
        Ok(Some(Request::Get { key }))
    );
}

#[test]
fn the_whole_request_cap_bounds_a_multi_set() {
    let limits = Limits {
        max_request_bytes: 1000,
        ..Limits::default()
    };
    let pairs = (0..20)
        .map(|i| (b(&format!("/k{i}")), Bytes::from(vec![0u8; 100])))
        .collect();
    let full = encoded(&Request::MultiSet { pairs });
    // Refused as soon as the declared lengths pass the cap, long before the frame is complete.
    let refused = (0..full.len())
        .find(|&cut| scan_request(&full[..cut], &limits).is_err())
        .expect("refused somewhere");
    assert!(refused < 1100, "refused only at {refused}");
}

#[test]
fn unknown_opcodes_are_errors() {
    for byte in [19u8, 42, 255] {
        let mut buf = BytesMut::from(&[byte][..]);
        assert_eq!(
            decode_request(&mut buf, &Limits::default()),
            Err(FrameError::UnknownOpcode(byte))
        );
    }
}

#[test]
fn queue_pop_reply_has_a_value_only_when_the_queue_was_not_empty() {
    let mut empty = BytesMut::new();
    Reply::Popped {
        len_before: 0,
        value: None,
    }
    .encode(&mut empty);
    assert_eq!(empty.len(), 8);
    assert_eq!(
        decode_reply(ReplyKind::Popped, &mut empty, &Limits::UNLIMITED),
        Ok(Some(Reply::Popped {
            len_before: 0,
            value: None
        }))
    );
    let mut full = BytesMut::new();
    Reply::Popped {
        len_before: 3,
        value: Some(b("x")),
    }
    .encode(&mut full);
    let mut part = BytesMut::from(&full[..10]);
    assert_eq!(
        decode_reply(ReplyKind::Popped, &mut part, &Limits::UNLIMITED),
        Ok(None)
    );
    assert_eq!(
        decode_reply(ReplyKind::Popped, &mut full, &Limits::UNLIMITED),
        Ok(Some(Reply::Popped {
            len_before: 3,
            value: Some(b("x"))
        }))
    );
}

fn bytes_strategy(max: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn reply_strategy() -> impl Strategy<Value = (ReplyKind, Reply)> {
    prop_oneof![
        any::<u8>().prop_map(|b| (ReplyKind::Byte, Reply::Byte(b))),
        any::<u32>().prop_map(|n| (ReplyKind::Nonce, Reply::Nonce(n))),
        any::<i64>().prop_map(|n| (ReplyKind::Int, Reply::Int(n))),
        bytes_strategy(64).prop_map(|v| (ReplyKind::Value, Reply::Value(v))),
        proptest::collection::vec(bytes_strategy(16), 0..5)
            .prop_map(|vs| (ReplyKind::Values(vs.len()), Reply::Values(vs))),
        (1i64..100, bytes_strategy(16)).prop_map(|(n, v)| (
            ReplyKind::Popped,
            Reply::Popped {
                len_before: n,
                value: Some(v)
            }
        )),
        proptest::collection::vec(bytes_strategy(16), 0..5)
            .prop_map(|ks| (ReplyKind::Keys, Reply::Keys(ks))),
    ]
}

proptest! {
    #[test]
    fn every_reply_round_trips((kind, reply) in reply_strategy()) {
        let mut buf = BytesMut::new();
        reply.encode(&mut buf);
        buf.put_u8(0xAB);
        prop_assert_eq!(decode_reply(kind, &mut buf, &Limits::UNLIMITED), Ok(Some(reply)));
        prop_assert_eq!(&buf[..], &[0xABu8][..]);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(data in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut buf = BytesMut::from(&data[..]);
        let _ = decode_request(&mut buf, &Limits::default());
    }
}

/// True when `inner` lies inside the memory of `outer`.
fn within(inner: &[u8], outer: std::ops::Range<usize>) -> bool {
    let start = inner.as_ptr() as usize;
    outer.contains(&start) && start + inner.len() <= outer.end
}

#[test]
fn a_small_frame_is_copied_out_so_it_pins_no_read_buffer() {
    let mut buf = encoded(&Request::Set {
        key: b("/k"),
        value: b("small"),
    });
    buf.reserve(16 * 1024);
    let memory = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.capacity();
    let Some(Request::Set { key, value }) = decode_request(&mut buf, &Limits::default()).unwrap()
    else {
        panic!("a SET")
    };
    assert_eq!((&key[..], &value[..]), (&b"/k"[..], &b"small"[..]));
    assert!(!within(&value, memory.clone()) && !within(&key, memory));
}

#[test]
fn a_large_frame_shares_the_read_buffer_instead_of_copying() {
    let big = Bytes::from(vec![9u8; request::SHARE_FRAMES_FROM]);
    let mut buf = encoded(&Request::Set {
        key: b("/big"),
        value: big.clone(),
    });
    let memory = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.capacity();
    let Some(Request::Set { value, .. }) = decode_request(&mut buf, &Limits::default()).unwrap()
    else {
        panic!("a SET")
    };
    assert_eq!(value, big);
    assert!(within(&value, memory));
}
