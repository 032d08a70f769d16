//! [`ClientSocket`]: a store client's blocking socket, read by the calling thread with a deadline.
//!
//! Why blocking and not async: a store call is one request and one small reply, made by a thread
//! that has nothing else to do until the reply comes. Letting that thread sleep in `recv` itself
//! is the cheapest way to wait: no readiness poll, no second thread to hand the reply over, two
//! syscalls per round trip. (The first client ran on the shared runtime and paid two cross-thread
//! wake-ups per call; the second drove a private current-thread runtime and still paid an epoll
//! round per read and a timer per call.)
//!
//! Optional polling before sleeping (`FERRODIST_STORE_SPIN_US`, off by default): a read can
//! first poll the socket for up to [`spin_budget`] µs and only then sleep in `recv`. On a virtual
//! machine whose vCPUs have been kept busy for a while, waking a sleeping thread costs more than
//! the round trip (this project's VM, back-to-back calls: 125-150 µs per round trip sleeping,
//! 28-40 µs polling). But after the vCPUs rested, which is how a training job calls its store,
//! sleeping costs 20-30 µs and polling made calls slower (an `add` 0.62x torch's instead of
//! 0.99x), and a poller burns host CPU that its neighbours then pay for. So polling is for
//! clients that call their store back to back, by choice. It polls with `poll(2)`, which reads
//! the socket's state without its lock: polling with `recv` fought the kernel for that lock
//! while the kernel was delivering the awaited reply.
//!
//! Every blocking step has a deadline: a read sleeps at most `READ_SLICE` or the time left,
//! whichever is shorter (`SO_RCVTIMEO`, left as it is while it is between `MIN_READ_SLICE` and
//! the time left, so most calls make no `setsockopt`), and large writes set `SO_SNDTIMEO`;
//! small writes rely on the send timeout set at connect.

use std::io::{ErrorKind, Write};
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use socket2::SockRef;

/// Environment variable that sets the spin budget in microseconds (0 disables spinning).
pub const SPIN_ENV: &str = "FERRODIST_STORE_SPIN_US";
/// Default spin budget: none (see the module docs for when to turn it on).
pub const DEFAULT_SPIN_US: u64 = 0;
/// Writes at most this long never block in practice (the kernel's send buffer takes them).
const SMALL_WRITE: usize = 16 * 1024;
/// Longest single blocking read; a longer wait is several, the deadline checked between them.
/// The socket keeps this timeout between calls, so a call whose deadline is further away than
/// this (nearly all of them) makes no `setsockopt` before it reads.
const READ_SLICE: Duration = Duration::from_secs(1);
/// Shortest timeout kept on the socket across calls (a shorter one is set only near a deadline).
const MIN_READ_SLICE: Duration = Duration::from_millis(10);
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

/// An address as torch's socket description writes it, `HOST:PORT` with an IPv6 host in
/// brackets, except that no name is looked up: torch asks the resolver for a name
/// (`getnameinfo`), which can stall on a lost DNS reply, while this writes a loopback address as
/// `localhost` (the name every hosts file gives it) and any other address as digits.
pub fn torch_style_addr(addr: std::net::SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    };
    match ip {
        ip if ip.is_loopback() => format!("localhost:{}", addr.port()),
        std::net::IpAddr::V4(v4) => format!("{v4}:{}", addr.port()),
        std::net::IpAddr::V6(v6) => format!("[{v6}]:{}", addr.port()),
    }
}

/// A connected stream read and written by the calling thread.
pub struct ClientSocket {
    stream: TcpStream,
    /// The receive timeout the socket has now (`SO_RCVTIMEO`), to set it only when it changes.
    read_timeout: Duration,
}

impl ClientSocket {
    /// Wraps a connected stream: `TCP_NODELAY`, and `default_timeout` as the send timeout of
    /// small writes (zero: none).
    pub fn new(stream: TcpStream, default_timeout: Duration) -> std::io::Result<ClientSocket> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout((!default_timeout.is_zero()).then_some(default_timeout))?;
        stream.set_read_timeout(Some(READ_SLICE))?;
        Ok(ClientSocket {
            stream,
            read_timeout: READ_SLICE,
        })
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

    /// torch's description of a client socket: `SocketImpl(fd=N, addr=HOST:PORT,
    /// remote=HOST:PORT)` (see [`torch_style_addr`] for the addresses).
    pub fn describe(&self) -> String {
        use std::os::fd::AsRawFd;
        let addr = |a: std::io::Result<std::net::SocketAddr>| {
            a.map_or_else(|_| "?".to_owned(), torch_style_addr)
        };
        format!(
            "SocketImpl(fd={}, addr={}, remote={})",
            self.stream.as_raw_fd(),
            addr(self.stream.local_addr()),
            addr(self.stream.peer_addr())
        )
    }

    /// Appends the bytes that have already arrived to `input`, without blocking
    /// ([`Filled::TimedOut`] when there are none).
    pub fn fill_now(&mut self, input: &mut BytesMut) -> std::io::Result<Filled> {
        input.reserve(READ_CHUNK);
        let socket = SockRef::from(&self.stream);
        match socket.recv_with_flags(input.spare_capacity_mut(), libc::MSG_DONTWAIT) {
            Ok(n) => Ok(appended(input, n)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                Ok(Filled::TimedOut)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes all of `bytes`, giving up at `until` for writes that may block.
    ///
    /// `SO_SNDTIMEO` bounds one `send`, and a slow reader lets each send through a little, so
    /// the timeout is set again to the time left before every partial write: the whole write
    /// ends by `until` (a 2 s `set` of 8 MiB to a server reading 64 KiB/s used to take 78 s).
    pub fn send_all(&mut self, mut bytes: &[u8], until: Option<Instant>) -> std::io::Result<()> {
        if bytes.len() <= SMALL_WRITE {
            return self.stream.write_all(bytes);
        }
        while !bytes.is_empty() {
            let left = match until {
                Some(at) => Some(time_left(at).ok_or(ErrorKind::TimedOut)?),
                None => None,
            };
            self.stream.set_write_timeout(left)?;
            match self.stream.write(bytes) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(sent) => bytes = &bytes[sent..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return Err(ErrorKind::TimedOut.into())
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Appends whatever bytes arrive to `input`, waiting until `until` (`None`: forever).
    pub fn fill(
        &mut self,
        input: &mut BytesMut,
        until: Option<Instant>,
    ) -> std::io::Result<Filled> {
        input.reserve(READ_CHUNK);
        if let Some(filled) = self.spin(input, until, spin_budget())? {
            return Ok(filled);
        }
        loop {
            let wanted = match until {
                Some(at) => match time_left(at) {
                    Some(left) => left.min(READ_SLICE),
                    None => return Ok(Filled::TimedOut),
                },
                None => READ_SLICE,
            };
            // The socket's current timeout will do if it wakes the read no later than wanted
            // and is not so short that a long wait spins on it.
            let current = self.read_timeout;
            if !(MIN_READ_SLICE..=wanted).contains(&current) {
                let slice = if wanted >= MIN_READ_SLICE {
                    Duration::from_millis(wanted.as_millis() as u64)
                } else {
                    wanted
                };
                self.stream.set_read_timeout(Some(slice))?;
                self.read_timeout = slice;
            }
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
        budget: Duration,
    ) -> std::io::Result<Option<Filled>> {
        if budget.is_zero() {
            return Ok(None);
        }
        let start = Instant::now();
        let stop = until.map_or(start + budget, |at| at.min(start + budget));
        loop {
            // `poll` reads the socket's state without taking its lock; a `recv` per turn would
            // contend for that lock with the kernel delivering the very reply awaited.
            if readable_now(&self.stream)? {
                let socket = SockRef::from(&self.stream);
                match socket.recv_with_flags(input.spare_capacity_mut(), libc::MSG_DONTWAIT) {
                    Ok(n) => return Ok(Some(appended(input, n))),
                    Err(e)
                        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                    Err(e) => return Err(e),
                }
            }
            if Instant::now() >= stop {
                return Ok(None);
            }
            std::hint::spin_loop();
        }
    }
}

/// True when a read would not block (data, EOF or an error is pending), asked without waiting.
fn readable_now(stream: &TcpStream) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut fds = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a count of 1, and a zero timeout.
    match unsafe { libc::poll(&mut fds, 1, 0) } {
        -1 => match std::io::Error::last_os_error() {
            e if e.kind() == ErrorKind::Interrupted => Ok(false),
            e => Err(e),
        },
        _ => Ok(fds.revents != 0),
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

    #[test]
    fn polling_takes_a_reply_that_arrives_within_its_budget_and_gives_up_after_it() {
        let (mut socket, mut server) = pair();
        let mut input = BytesMut::with_capacity(64);
        let budget = Duration::from_millis(100);
        let start = Instant::now();
        assert_eq!(socket.spin(&mut input, None, budget).unwrap(), None);
        assert!(start.elapsed() >= budget);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            server.write_all(b"soon").unwrap();
            server
        });
        let found = socket
            .spin(&mut input, None, Duration::from_secs(5))
            .unwrap();
        assert_eq!(found, Some(Filled::Data));
        assert_eq!(&input[..], b"soon");
        drop(writer.join().unwrap());
        let eof = socket
            .spin(&mut input, None, Duration::from_secs(5))
            .unwrap();
        assert_eq!(eof, Some(Filled::Eof));
    }
}
