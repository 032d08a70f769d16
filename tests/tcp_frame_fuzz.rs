//! Property-based fuzzing of the TCPStore frame decoder (`ferrodist::tcp::codec`).
//!
//! The decoder is the first code that touches bytes from the network, so it must hold up
//! against anything: random bytes, valid frames with bits flipped, bytes inserted or cut,
//! streams split at every point, and declared lengths far beyond the configured limits. The
//! properties: it never panics; it always makes progress or asks for more bytes; a frame it
//! accepts respects the limits; and it never allocates memory in proportion to a *declared*
//! length, only to bytes that actually arrived. The last is checked with a counting global
//! allocator that records the largest single allocation made while the decoder runs.
//!
//! Cases per property: 1,000 in the test suite; `FERRODIST_FUZZ_CASES=N cargo test --release
//! --test tcp_frame_fuzz` runs a longer campaign (the README records the count run).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::{Bytes, BytesMut};
use ferrodist::tcp::{
    decode_reply, decode_request, scan_request, FrameError, Limits, ReplyKind, Request, Scan,
};
use proptest::prelude::*;

/// Counts the largest allocation a thread asks for while tracking is on.
struct PeakAlloc;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: thread-locals may be gone while a thread exits.
    let _ = TRACKING.try_with(|on| {
        if on.get() {
            let _ = PEAK.try_with(|p| p.set(p.get().max(size)));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// Runs `f` and returns its result with the largest single allocation it made.
fn peak_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    PEAK.with(|p| p.set(0));
    TRACKING.with(|t| t.set(true));
    let out = f();
    TRACKING.with(|t| t.set(false));
    (out, PEAK.with(|p| p.get()))
}

/// Small limits, so random and mutated frames hit every limit often.
const TIGHT: Limits = Limits {
    max_key_bytes: 64,
    max_value_bytes: 512,
    max_keys: 16,
    max_request_bytes: 4096,
};

/// The largest allocation the decoder may make for `input` bytes: a few times what arrived
/// (field spans are 16 bytes per field, at least 9 input bytes each) plus a small constant.
fn alloc_bound(input: usize) -> usize {
    4 * input + 1024
}

fn cases() -> u32 {
    std::env::var("FERRODIST_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

fn bytes_up_to(max: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn request() -> impl Strategy<Value = Request> {
    let k = || bytes_up_to(24);
    let v = || bytes_up_to(96);
    let ks = || proptest::collection::vec(bytes_up_to(24), 0..6);
    prop_oneof![
        any::<u32>().prop_map(|magic| Request::Validate { magic }),
        (k(), v()).prop_map(|(key, value)| Request::Set { key, value }),
        (k(), v(), v()).prop_map(|(key, expected, desired)| Request::CompareSet {
            key,
            expected,
            desired
        }),
        k().prop_map(|key| Request::Get { key }),
        (k(), any::<i64>()).prop_map(|(key, delta)| Request::Add { key, delta }),
        ks().prop_map(|keys| Request::Check { keys }),
        ks().prop_map(|keys| Request::Wait { keys }),
        Just(Request::GetNumKeys),
        k().prop_map(|key| Request::DeleteKey { key }),
        (k(), v()).prop_map(|(key, value)| Request::Append { key, value }),
        ks().prop_map(|keys| Request::MultiGet { keys }),
        proptest::collection::vec((k(), v()), 0..5).prop_map(|pairs| Request::MultiSet { pairs }),
        Just(Request::CancelWait),
        any::<u32>().prop_map(|nonce| Request::Ping { nonce }),
        (k(), v()).prop_map(|(key, value)| Request::QueuePush { key, value }),
        k().prop_map(|key| Request::QueuePop { key }),
        k().prop_map(|key| Request::QueueLen { key }),
        Just(Request::ListKeys),
        (k(), any::<i64>()).prop_map(|(key, world_size)| Request::Barrier { key, world_size }),
    ]
}

/// A mutation of a byte stream: flip, overwrite with an edge value, insert, delete, truncate.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Overwrite(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    /// Overwrite 8 bytes with a huge little-endian length.
    HugeLength(usize, u64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let edge = prop_oneof![Just(0u8), Just(0xFF), Just(0x7F), Just(0x80), any::<u8>()];
    let huge = prop_oneof![
        Just(u64::MAX),
        Just(1u64 << 63),
        Just(1u64 << 40),
        Just(8 * 1024 * 1024 + 1),
        Just(131_073),
        any::<u64>()
    ];
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(p, bit)| Mutation::Flip(p, bit)),
        (any::<usize>(), edge).prop_map(|(p, b)| Mutation::Overwrite(p, b)),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..12)
        )
            .prop_map(|(p, v)| Mutation::Insert(p, v)),
        (any::<usize>(), 1usize..12).prop_map(|(p, n)| Mutation::Delete(p, n)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), huge).prop_map(|(p, n)| Mutation::HugeLength(p, n)),
    ]
}

fn apply(data: &mut Vec<u8>, m: &Mutation) {
    let at = |p: usize, len: usize| if len == 0 { 0 } else { p % len };
    match m {
        Mutation::Flip(p, bit) if !data.is_empty() => {
            let i = at(*p, data.len());
            data[i] ^= 1 << bit;
        }
        Mutation::Overwrite(p, b) if !data.is_empty() => {
            let i = at(*p, data.len());
            data[i] = *b;
        }
        Mutation::Insert(p, v) => {
            let i = at(*p, data.len() + 1);
            data.splice(i..i, v.iter().copied());
        }
        Mutation::Delete(p, n) if !data.is_empty() => {
            let i = at(*p, data.len());
            let end = (i + n).min(data.len());
            data.drain(i..end);
        }
        Mutation::Truncate(p) => data.truncate(at(*p, data.len() + 1)),
        Mutation::HugeLength(p, n) if data.len() >= 8 => {
            let i = at(*p, data.len() - 7);
            data[i..i + 8].copy_from_slice(&n.to_le_bytes());
        }
        _ => {}
    }
}

fn encode_all(requests: &[Request]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    requests.iter().for_each(|r| r.encode(&mut buf));
    buf.to_vec()
}

fn within(limits: &Limits, req: &Request) -> bool {
    let key = |k: &Bytes| k.len() as u64 <= limits.max_key_bytes;
    let value = |v: &Bytes| v.len() as u64 <= limits.max_value_bytes;
    match req {
        Request::Set { key: k, value: v }
        | Request::Append { key: k, value: v }
        | Request::QueuePush { key: k, value: v } => key(k) && value(v),
        Request::CompareSet {
            key: k,
            expected,
            desired,
        } => key(k) && value(expected) && value(desired),
        Request::Get { key: k }
        | Request::DeleteKey { key: k }
        | Request::QueuePop { key: k }
        | Request::QueueLen { key: k }
        | Request::Add { key: k, .. }
        | Request::Barrier { key: k, .. } => key(k),
        Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
            keys.len() as u64 <= limits.max_keys && keys.iter().all(key)
        }
        Request::MultiSet { pairs } => {
            pairs.len() as u64 <= limits.max_keys && pairs.iter().all(|(k, v)| key(k) && value(v))
        }
        _ => true,
    }
}

/// Decodes a whole stream the way the server does, checking every step. Returns the number of
/// requests decoded and whether the stream ended in a protocol error.
fn drain(data: &[u8], limits: &Limits) -> Result<usize, TestCaseError> {
    let mut buf = BytesMut::from(data);
    let mut decoded = 0;
    loop {
        let before = buf.len();
        let scan = scan_request(&buf, limits);
        let (step, peak) = peak_alloc(|| decode_request(&mut buf, limits));
        prop_assert!(
            peak <= alloc_bound(before),
            "allocated {peak} for {before} bytes"
        );
        match (step, scan) {
            (Ok(Some(req)), Ok(Scan::Complete(n))) => {
                prop_assert_eq!(before - buf.len(), n, "scan and decode disagree");
                prop_assert!(n > 0);
                prop_assert!(n as u64 <= limits.max_request_bytes);
                prop_assert!(within(limits, &req), "accepted over the limits: {:?}", req);
                decoded += 1;
            }
            (Ok(None), Ok(Scan::Incomplete(need))) => {
                prop_assert_eq!(buf.len(), before, "an incomplete frame must stay buffered");
                prop_assert!(
                    need > before,
                    "incomplete but needs only {need} of {before}"
                );
                return Ok(decoded);
            }
            (Err(e), Err(e2)) => {
                prop_assert_eq!(e, e2);
                return Ok(decoded);
            }
            (step, scan) => {
                return Err(TestCaseError::fail(format!(
                    "decode {step:?} vs scan {scan:?}"
                )))
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Random bytes, with and without a valid handshake in front.
    #[test]
    fn random_bytes_never_panic_or_overallocate(
        data in proptest::collection::vec(any::<u8>(), 0..2048),
        handshake in any::<bool>(),
    ) {
        let mut stream = if handshake { vec![0x00, 0xCE, 0xF7, 0x85, 0x3C] } else { vec![] };
        stream.extend_from_slice(&data);
        drain(&stream, &TIGHT)?;
        drain(&stream, &Limits::default())?;
    }

    /// Valid request streams, mutated.
    #[test]
    fn mutated_frames_never_panic_or_overallocate(
        requests in proptest::collection::vec(request(), 1..8),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let mut data = encode_all(&requests);
        for m in &mutations {
            apply(&mut data, m);
        }
        drain(&data, &TIGHT)?;
        drain(&data, &Limits::default())?;
    }

    /// A valid stream decodes to the same requests however the network splits it.
    /// Every request encodes to one complete frame that scans and decodes back to itself.
    #[test]
    fn every_request_round_trips(req in request()) {
        let mut buf = BytesMut::new();
        req.encode(&mut buf);
        let len = buf.len();
        prop_assert_eq!(scan_request(&buf, &Limits::default()), Ok(Scan::Complete(len)));
        prop_assert_eq!(decode_request(&mut buf, &Limits::default()), Ok(Some(req)));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn valid_streams_decode_the_same_under_any_split(
        requests in proptest::collection::vec(request(), 1..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let data = encode_all(&requests);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (data.len() + 1)).collect();
        cuts.push(data.len());
        cuts.sort_unstable();
        let (mut buf, mut fed, mut out) = (BytesMut::new(), 0, Vec::new());
        for cut in cuts {
            buf.extend_from_slice(&data[fed..cut]);
            fed = cut;
            while let Some(req) = decode_request(&mut buf, &Limits::UNLIMITED)
                .map_err(|e| TestCaseError::fail(e.to_string()))?
            {
                out.push(req);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(out, requests);
    }

    /// A declared length or count over a limit is refused from its header alone.
    #[test]
    fn over_limit_headers_are_refused_before_the_body(
        key in bytes_up_to(24),
        declared in 513u64..=u64::MAX,
        count in 17u64..=u64::MAX,
        op in prop_oneof![Just(1u8), Just(9), Just(14)],
        keyed_op in prop_oneof![Just(5u8), Just(6), Just(10), Just(11)],
    ) {
        let mut value_header = vec![op];
        value_header.extend_from_slice(&(key.len() as u64).to_le_bytes());
        value_header.extend_from_slice(&key);
        value_header.extend_from_slice(&declared.to_le_bytes());
        let (res, peak) = peak_alloc(|| scan_request(&value_header, &TIGHT));
        let refused = matches!(
            res,
            Err(FrameError::ValueTooLong { .. } | FrameError::RequestTooLarge { .. })
        );
        prop_assert!(refused, "{:?}", res);
        prop_assert!(peak <= alloc_bound(value_header.len()));

        let mut count_header = vec![keyed_op];
        count_header.extend_from_slice(&count.to_le_bytes());
        let res = scan_request(&count_header, &TIGHT);
        prop_assert!(matches!(res, Err(FrameError::TooManyKeys { .. })), "{:?}", res);

        let mut key_header = vec![3u8];
        key_header.extend_from_slice(&(declared % (1 << 62) + 65).to_le_bytes());
        let res = scan_request(&key_header, &TIGHT);
        prop_assert!(matches!(res, Err(FrameError::KeyTooLong { .. })), "{:?}", res);
    }

    /// The client's reply decoder survives a hostile server too.
    #[test]
    fn random_replies_never_panic_or_overallocate(
        data in proptest::collection::vec(any::<u8>(), 0..1024),
        kind in prop_oneof![
            Just(ReplyKind::Byte), Just(ReplyKind::Nonce), Just(ReplyKind::Int),
            Just(ReplyKind::Value), (0usize..64).prop_map(ReplyKind::Values),
            Just(ReplyKind::Popped), Just(ReplyKind::Keys),
        ],
    ) {
        for limits in [TIGHT, Limits::default()] {
            let mut buf = BytesMut::from(&data[..]);
            let (res, peak) = peak_alloc(|| decode_reply(kind, &mut buf, &limits));
            prop_assert!(peak <= alloc_bound(data.len()) + 64 * 16, "allocated {peak}");
            if let Ok(None) = res {
                prop_assert_eq!(buf.len(), data.len());
            }
        }
    }
}
