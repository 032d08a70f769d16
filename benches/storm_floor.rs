//! The kernel's floor for the rendezvous storm: the cheapest server that can answer it.
//!
//! One thread, one level-triggered epoll set, one `recv` per readiness event, replies written
//! straight from a stack buffer, no tasks, no locks, no store: it knows only the requests
//! `storm.rs` sends (VALIDATE+PING, ADD, SET, WAIT, GET) and answers them the way torch's
//! servers do. Whatever CPU it takes is what the protocol costs the kernel on this machine, so
//! `bench_tcp_store.py` runs it beside torch's libuv server and `ferrodist-store` to show how
//! much of either server's CPU is left to win. It is a measuring stick, not a store: it trusts
//! its peer and serves one storm.
//!
//! Run: `cargo bench --bench storm_floor -- --port 0`; it prints `listening on 127.0.0.1:PORT`
//! and serves until killed.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::RawFd;

mod wire;
use wire::{ADD, GET, PING, SET, STOP_WAITING, VALIDATE, WAIT};

const LISTENER: u64 = u64::MAX;

fn check(ret: libc::c_int, what: &str) -> libc::c_int {
    if ret < 0 {
        panic!("{what}: {}", std::io::Error::last_os_error());
    }
    ret
}

/// Reads a little-endian u64 at `at`, if the buffer holds it.
fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

/// A length-prefixed string at `at`: returns (its bytes, the offset after it).
fn str_at(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len = u64_at(buf, at)? as usize;
    let end = at + 8 + len;
    Some((buf.get(at + 8..end)?, end))
}

/// Everything the floor server remembers: one counter per key, set values, parked waiters.
#[derive(Default)]
struct Floor {
    counters: HashMap<Vec<u8>, i64>,
    values: HashMap<Vec<u8>, Vec<u8>>,
    waiters: HashMap<Vec<u8>, Vec<RawFd>>,
    pending: HashMap<RawFd, Vec<u8>>,
}

impl Floor {
    /// Answers every whole request at the front of `buf`; returns how many bytes it used.
    fn serve(&mut self, fd: RawFd, buf: &[u8], reply: &mut Vec<u8>) -> usize {
        let mut at = 0;
        while let Some(used) = self.one(fd, &buf[at..], reply) {
            at += used;
        }
        at
    }

    fn one(&mut self, fd: RawFd, buf: &[u8], reply: &mut Vec<u8>) -> Option<usize> {
        match *buf.first()? {
            VALIDATE => (buf.len() >= 5).then_some(5),
            PING => {
                reply.extend_from_slice(buf.get(1..5)?);
                Some(5)
            }
            ADD => {
                let (key, end) = str_at(buf, 1)?;
                let delta = u64_at(buf, end)? as i64;
                let total = self.counters.entry(key.to_vec()).or_default();
                *total += delta;
                reply.extend_from_slice(&total.to_le_bytes());
                Some(end + 8)
            }
            SET => {
                let (key, end) = str_at(buf, 1)?;
                let (value, end) = str_at(buf, end)?;
                self.values.insert(key.to_vec(), value.to_vec());
                for waiter in self.waiters.remove(key).unwrap_or_default() {
                    send_all(waiter, &[STOP_WAITING]);
                }
                Some(end)
            }
            WAIT => {
                let (key, end) = str_at(buf, 9)?;
                if self.values.contains_key(key) {
                    reply.push(STOP_WAITING);
                } else {
                    self.waiters.entry(key.to_vec()).or_default().push(fd);
                }
                Some(end)
            }
            GET => {
                let (key, end) = str_at(buf, 1)?;
                let value = self.values.get(key).map_or(&[][..], Vec::as_slice);
                reply.extend_from_slice(&(value.len() as u64).to_le_bytes());
                reply.extend_from_slice(value);
                Some(end)
            }
            other => panic!("storm_floor: request {other} is not part of the storm"),
        }
    }
}

fn send_all(fd: RawFd, bytes: &[u8]) {
    // SAFETY: `bytes` is a live slice; a short or failed send only loses this peer's reply.
    unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
}

fn listen(port: u16) -> RawFd {
    // SAFETY: plain socket calls on a descriptor this function owns.
    unsafe {
        let fd = check(
            libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0),
            "socket",
        );
        let one: libc::c_int = 1;
        let one_ptr = (&one as *const libc::c_int).cast();
        let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, one_ptr, len);
        // Accepted sockets inherit TCP_NODELAY from the listener on Linux.
        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, one_ptr, len);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_port = port.to_be();
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let addr_len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        check(
            libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), addr_len),
            "bind",
        );
        check(libc::listen(fd, 65535), "listen");
        let mut bound: libc::sockaddr_in = std::mem::zeroed();
        let mut bound_len = addr_len;
        libc::getsockname(
            fd,
            (&mut bound as *mut libc::sockaddr_in).cast(),
            &mut bound_len,
        );
        println!("listening on 127.0.0.1:{}", u16::from_be(bound.sin_port));
        let _ = std::io::stdout().flush();
        fd
    }
}

fn watch(epoll: RawFd, fd: RawFd, token: u64) {
    let mut event = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: `event` outlives the call; the kernel copies it.
    check(
        unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut event) },
        "epoll_ctl",
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port = args
        .iter()
        .position(|a| a == "--port")
        .and_then(|i| args.get(i + 1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let listener = listen(port);
    // SAFETY: creates a descriptor this process owns.
    let epoll = check(unsafe { libc::epoll_create1(0) }, "epoll_create1");
    watch(epoll, listener, LISTENER);
    let mut floor = Floor::default();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let mut chunk = [0u8; 4096];
    let mut reply = Vec::with_capacity(4096);
    loop {
        // SAFETY: `events` has room for the count passed.
        let ready = unsafe { libc::epoll_wait(epoll, events.as_mut_ptr(), 1024, -1) };
        for event in &events[..ready.max(0) as usize] {
            if event.u64 == LISTENER {
                loop {
                    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
                    // SAFETY: a null address asks accept4 not to report the peer.
                    let fd = unsafe {
                        libc::accept4(listener, std::ptr::null_mut(), std::ptr::null_mut(), flags)
                    };
                    if fd < 0 {
                        break;
                    }
                    watch(epoll, fd, fd as u64);
                }
                continue;
            }
            let fd = event.u64 as RawFd;
            // SAFETY: `chunk` is a live buffer of the length passed.
            let n = unsafe { libc::recv(fd, chunk.as_mut_ptr().cast(), chunk.len(), 0) };
            if n <= 0 {
                // SAFETY: the descriptor is ours; closing also drops it from the epoll set.
                unsafe { libc::close(fd) };
                floor.pending.remove(&fd);
                continue;
            }
            reply.clear();
            let fresh = &chunk[..n as usize];
            match floor.pending.remove(&fd) {
                // The common case: whole requests in one read, parsed where they landed.
                None => {
                    let used = floor.serve(fd, fresh, &mut reply);
                    if used < fresh.len() {
                        floor.pending.insert(fd, fresh[used..].to_vec());
                    }
                }
                Some(mut held) => {
                    held.extend_from_slice(fresh);
                    let used = floor.serve(fd, &held, &mut reply);
                    if used < held.len() {
                        held.drain(..used);
                        floor.pending.insert(fd, held);
                    }
                }
            }
            if !reply.is_empty() {
                send_all(fd, &reply);
            }
        }
    }
}
