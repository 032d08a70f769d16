//! [`ClientSocket`]: a store client's blocking socket, read by the calling thread with a deadline.
//!
//! Why blocking and not async: a store call is one request and one small reply, made by a thread
//! that has nothing else to do until the reply comes. Letting that thread sleep in `recv` itself
//! is the cheapest way to wait: no readiness poll, no second thread to hand the reply over, two
//! syscalls per round trip. (The first client ran on the shared runtime and paid two cross-thread
//! wake-ups per call; the second drove a private current-thread runtime and still paid an epoll
//! round per read and a timer per call.)
//!
//! Why it spins briefly before sleeping: on virtual machines, where most training jobs run,
//! waking a thread that sleeps in the kernel costs more than the round trip itself (measured on
//! this project's VM: 125 µs loopback ping-pong when the reader sleeps, 44 µs when it polls).
//! So a read first polls the socket without blocking for up to [`spin_budget`] (default
//! [`DEFAULT_SPIN_US`] µs, `FERRODIST_STORE_SPIN_US` overrides, 0 turns it off), and only then
//! sleeps in `recv`. The cost is that much CPU per call on the caller's thread, with the GIL
//! released; long waits (a key not set yet) spin once and then sleep.
//!
//! Every blocking step has a deadline: reads set `SO_RCVTIMEO` to the time left, and large writes
//! set `SO_SNDTIMEO`; small writes rely on the send timeout set at connect.

use std::io::{ErrorKind, Write};
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use socket2::SockRef;

/// Environment variable that sets the spin budget in microseconds (0 disables spinning).
pub const SPIN_ENV: &str = "FERRODIST_STORE_SPIN_US";
/// Default spin budget: covers a loopback or same-rack round trip on a VM.
pub const DEFAULT_SPIN_US: u64 = 100;
/// Writes at most this long never block in practice (the kernel's send buffer takes them).
const SMALL_WRITE: usize = 16 * 1024;
/// Bytes a read asks for at least.
const READ_CHUNK: usize = 64 * 1024;

/// How long a read polls before sleeping in the kernel.
pub fn spin_budget() -> Duration {
    static BUDGET: OnceLock<Duration> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let micros = std::env::var(SPIN_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_SPIN_US);
        Duration::from_micros(micros)
    })
}

/// What a bounded read found.
#[derive(Debug, PartialEq, Eq)]
pub enum Filled {
    /// Bytes were appended to the buffer.
    Data,
    /// The peer closed the connection.
    Eof,
    /// The deadline passed with nothing to read.
    TimedOut,
}

/// A connected stream read and written by the calling thread.
pub struct ClientSocket {
    stream: TcpStream,
}

impl ClientSocket {
    /// Wraps a connected stream: `TCP_NODELAY`, and `default_timeout` as the send timeout of
    /// small writes (zero: none).
    pub fn new(stream: TcpStream, default_timeout: Duration) -> std::io::Result<ClientSocket> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout((!default_timeout.is_zero()).then_some(default_timeout))?;
        Ok(ClientSocket { stream })
    }

    /// True when the peer has closed the connection (checked without blocking or consuming).
    pub fn peer_closed(&self) -> std::io::Result<bool> {
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        match SockRef::from(&self.stream)
            .recv_with_flags(&mut probe, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        {
            Ok(0) => Ok(true),
            Ok(_) => Ok(false),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes all of `bytes`, giving up at `until` for writes that may block.
    pub fn send_all(&mut self, bytes: &[u8], until: Option<Instant>) -> std::io::Result<()> {
        if bytes.len() > SMALL_WRITE {
            let left = match until {
                Some(at) => Some(time_left(at).ok_or(ErrorKind::TimedOut)?),
                None => None,
            };
            self.stream.set_write_timeout(left)?;
        }
        self.stream.write_all(bytes)
    }

    /// Appends whatever bytes arrive to `input`, waiting until `until` (`None`: forever).
    pub fn fill(
        &mut self,
        input: &mut BytesMut,
        until: Option<Instant>,
    ) -> std::io::Result<Filled> {
        input.reserve(READ_CHUNK);
        if let Some(filled) = self.spin(input, until)? {
            return Ok(filled);
        }
        loop {
            let left = match until {
                Some(at) => match time_left(at) {
                    Some(left) => Some(left),
                    None => return Ok(Filled::TimedOut),
                },
                None => None,
            };
            self.stream.set_read_timeout(left)?;
            // A timed-out blocking `recv` fails with `WouldBlock`.
            match SockRef::from(&self.stream).recv(input.spare_capacity_mut()) {
                Ok(n) => return Ok(appended(input, n)),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Polls without blocking for up to the spin budget; `None` when nothing came.
    fn spin(
        &mut self,
        input: &mut BytesMut,
        until: Option<Instant>,
    ) -> std::io::Result<Option<Filled>> {
        let budget = spin_budget();
        if budget.is_zero() {
            return Ok(None);
        }
        let start = Instant::now();
        let stop = until.map_or(start + budget, |at| at.min(start + budget));
        loop {
            let socket = SockRef::from(&self.stream);
            match socket.recv_with_flags(input.spare_capacity_mut(), libc::MSG_DONTWAIT) {
                Ok(n) => return Ok(Some(appended(input, n))),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= stop {
                return Ok(None);
            }
            std::hint::spin_loop();
        }
    }
}

/// Time left until `at`, `None` once it has passed.
fn time_left(at: Instant) -> Option<Duration> {
    let left = at.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

/// Grows `input` over the `n` bytes a read put in its spare capacity.
fn appended(input: &mut BytesMut, n: usize) -> Filled {
    if n == 0 {
        return Filled::Eof;
    }
    // SAFETY: the read initialised `n` bytes of the spare capacity, right after the length.
    unsafe { input.set_len(input.len() + n) };
    Filled::Data
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (ClientSocket, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (
            ClientSocket::new(client, Duration::from_secs(5)).unwrap(),
            server,
        )
    }

    #[test]
    fn fill_reads_what_arrives_then_sees_eof() {
        let (mut socket, mut server) = pair();
        let mut input = BytesMut::new();
        server.write_all(b"hello").unwrap();
        let until = Some(Instant::now() + Duration::from_secs(5));
        assert_eq!(socket.fill(&mut input, until).unwrap(), Filled::Data);
        assert_eq!(&input[..], b"hello");
        assert!(!socket.peer_closed().unwrap());
        drop(server);
        assert_eq!(socket.fill(&mut input, until).unwrap(), Filled::Eof);
        assert!(socket.peer_closed().unwrap());
        assert_eq!(&input[..], b"hello");
    }

    #[test]
    fn fill_gives_up_at_its_deadline_and_not_before() {
        let (mut socket, _server) = pair();
        let mut input = BytesMut::new();
        let start = Instant::now();
        let wait = Duration::from_millis(150);
        assert_eq!(
            socket.fill(&mut input, Some(start + wait)).unwrap(),
            Filled::TimedOut
        );
        let took = start.elapsed();
        assert!(took >= wait, "returned early after {took:?}");
        assert!(took < wait + Duration::from_secs(1), "overran to {took:?}");
        assert!(input.is_empty());
    }

    #[test]
    fn a_reply_that_arrives_while_sleeping_wakes_the_reader() {
        let (mut socket, mut server) = pair();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            server.write_all(b"late").unwrap();
            server
        });
        let mut input = BytesMut::new();
        let until = Some(Instant::now() + Duration::from_secs(5));
        assert_eq!(socket.fill(&mut input, until).unwrap(), Filled::Data);
        assert_eq!(&input[..], b"late");
        writer.join().unwrap();
    }
}
