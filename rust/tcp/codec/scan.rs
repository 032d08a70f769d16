//! Scanning a request's length prefixes against the limits, resumably.
//!
//! A request is complete once every length prefix and body is in the buffer. Scanning answers
//! "complete, and how long" or "incomplete, and how many bytes at least" without copying, and
//! refuses a frame as soon as a declared length breaks a limit. A WAIT, CHECK, MULTI_GET or
//! MULTI_SET frame can carry 128 K keys; a client that sends one a few bytes at a time would
//! make a scan from the frame's start after every read cost O(N) each time, O(N^2) in all. So
//! a connection keeps a [`ScanMark`]: where the last scan of its incomplete frame stopped (after
//! the last whole key or key-value pair), and the next scan goes on from there.

use super::{Cursor, FrameError, Limits, Opcode, Scan, Step};

/// Where the scan of an incomplete multi-key frame at the start of a buffer stopped: after
/// `fields` whole keys (or pairs), at byte `pos`. Valid only for that frame; reset when the
/// frame is taken off the buffer. Eight bytes, so it fits in every connection's task.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanMark {
    pos: u32,
    fields: u32,
}

impl ScanMark {
    /// Whether a scan stopped partway through a multi-key frame.
    pub fn is_set(&self) -> bool {
        self.fields > 0
    }

    fn record(&mut self, pos: usize, fields: u64) {
        if let (Ok(pos), Ok(fields)) = (u32::try_from(pos), u32::try_from(fields)) {
            *self = ScanMark { pos, fields };
        }
    }
}

/// Spans (start, end) of the fields of one request inside the scanned buffer.
pub(super) struct Parsed {
    pub(super) op: Opcode,
    pub(super) spans: Vec<(usize, usize)>,
    pub(super) int: u64,
    pub(super) len: usize,
}

/// Reads one request's prefixes from the start of `buf`. With `collect`, every field's span
/// is kept (and `mark` must be fresh); without, a set `mark` skips the keys already scanned.
/// `mark` records the progress through a multi-key frame either way.
pub(super) fn parse(
    buf: &[u8],
    limits: &Limits,
    mark: &mut ScanMark,
    collect: bool,
) -> Step<Parsed> {
    debug_assert!(
        !(collect && mark.is_set()),
        "spans need a scan from the start"
    );
    let mut cur = Cursor { buf, pos: 0 };
    let byte = cur.u8()?;
    let op = Opcode::from_byte(byte).ok_or(Err(FrameError::UnknownOpcode(byte)))?;
    let mut spans = Vec::new();
    let mut int = 0u64;
    let check_total = |cur: &Cursor<'_>| -> Step<()> {
        if cur.pos as u64 > limits.max_request_bytes {
            return Err(Err(FrameError::RequestTooLarge {
                len: cur.pos as u64,
                max: limits.max_request_bytes,
            }));
        }
        Ok(())
    };
    // A declared length that would push the frame past max_request_bytes is refused before its
    // body is awaited: an incomplete result whose need exceeds the cap is an error.
    let guard = |step: Step<(usize, usize)>| -> Step<(usize, usize)> {
        match step {
            Err(Ok(need)) if need as u64 > limits.max_request_bytes => {
                Err(Err(FrameError::RequestTooLarge {
                    len: need as u64,
                    max: limits.max_request_bytes,
                }))
            }
            other => other,
        }
    };
    let mut keep = |span: (usize, usize)| {
        if collect {
            spans.push(span);
        }
    };
    match op {
        Opcode::Validate | Opcode::Ping => int = u64::from(cur.u32()?),
        Opcode::GetNumKeys | Opcode::CancelWait | Opcode::ListKeys => {}
        Opcode::Get | Opcode::DeleteKey | Opcode::QueuePop | Opcode::QueueLen => {
            keep(guard(cur.key(limits))?)
        }
        Opcode::Add | Opcode::Barrier => {
            keep(guard(cur.key(limits))?);
            int = cur.u64()?;
        }
        Opcode::Set | Opcode::Append | Opcode::QueuePush => {
            keep(guard(cur.key(limits))?);
            keep(guard(cur.value(limits))?);
        }
        Opcode::CompareSet => {
            keep(guard(cur.key(limits))?);
            keep(guard(cur.value(limits))?);
            keep(guard(cur.value(limits))?);
        }
        Opcode::Check | Opcode::Wait | Opcode::MultiGet | Opcode::MultiSet => {
            let pairs = op == Opcode::MultiSet;
            let count = cur.count(limits)?;
            let mut done = 0;
            if mark.is_set() && mark.pos as usize >= cur.pos && (mark.pos as usize) <= buf.len() {
                done = u64::from(mark.fields).min(count);
                cur.pos = mark.pos as usize;
            }
            while done < count {
                keep(guard(cur.key(limits))?);
                if pairs {
                    keep(guard(cur.value(limits))?);
                }
                check_total(&cur)?;
                done += 1;
                mark.record(cur.pos, done);
            }
        }
    }
    check_total(&cur)?;
    Ok(Parsed {
        op,
        spans,
        int,
        len: cur.pos,
    })
}

/// Finds out whether a whole request sits at the start of `buf`, without copying anything.
///
/// Errors as soon as the bytes seen break the protocol or a declared length breaks `limits`,
/// even when the rest of the frame has not arrived.
pub fn scan_request(buf: &[u8], limits: &Limits) -> Result<Scan, FrameError> {
    scan_request_from(buf, limits, &mut ScanMark::default())
}

/// [`scan_request`] that goes on from `mark` (and leaves it at the progress made) when the
/// frame at the start of `buf` is a multi-key one scanned before.
pub fn scan_request_from(
    buf: &[u8],
    limits: &Limits,
    mark: &mut ScanMark,
) -> Result<Scan, FrameError> {
    match parse(buf, limits, mark, false) {
        Ok(parsed) => Ok(Scan::Complete(parsed.len)),
        Err(Ok(need)) => Ok(Scan::Incomplete(need)),
        Err(Err(err)) => Err(err),
    }
}
