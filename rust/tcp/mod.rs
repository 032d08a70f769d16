//! torch's TCPStore, both ends: a tokio server and a client that speak torch's wire protocol.
//!
//! A stock `torch.distributed.TCPStore` client works against [`Server`], and [`Client`] works
//! against torch's libuv and legacy servers (torch >= 2.4). Facts about the protocol:
//! `shared/design/torch-store-protocol.md`.
//!
//! # Public API (stable; other modules and the load generator build on it)
//!
//! * [`codec`]: the wire format, no I/O. [`Request`] / [`Reply`] with `encode`,
//!   [`decode_request`] / [`decode_reply`] (partial input is `Ok(None)`), [`scan_request`]
//!   (frame length without copying), [`Limits`] and [`FrameError`].
//! * [`server`]: [`ServerConfig`], [`Server::start`] / [`Server::serve`] (on the shared runtime),
//!   [`server::bind`] / [`server::adopt`], [`Server::local_addr`], [`Server::shutdown`],
//!   [`server::accept_loop`] for a caller that runs its own loop.
//! * [`Db`] (from [`crate::store::db`]): the engine the server serves, shared with HashStore.
//! * [`server::dispatch`]: the one way from a data request to a storage engine
//!   ([`crate::store::engine`]: the [`Db`], or etcd through [`crate::store::EtcdEngine`] with
//!   [`Server::start_with_engine`]) and back to torch's reply.
//! * [`client`]: the blocking [`Client`] (connect with retry and backoff, handshake, every op,
//!   wait with CANCEL_WAIT, each call under a deadline); raw wire keys, no `/` prefix.
//! * [`store`]: [`TcpStore`], the blocking torch-compatible [`crate::store::Store`] over a
//!   client (user keys get torch's `/` prefix), hosting a server when it is the master.
//! * [`client::conn_pool`]: a store's connections, one per concurrent call (a wait in one
//!   thread blocks no other thread's call), forgotten after `fork`; reconnects to a server whose
//!   state outlives it on one backoff schedule, until the call's deadline.
//! * [`server::shutdown`]: the stop signal and drain used by the server.
//! * [`server::log_budget`]: at most so many warnings a second from one call site.
//! * [`server::handshake_deadline`]: closes connections that never send VALIDATE.
//! * [`auth`]: the store's token and its challenge/response in the handshake.
//! * [`server::metrics`]: the server's counters and their Prometheus text.
//!
//! # Files
//!
//! * `codec/`: wire format (`request.rs`, `reply.rs`, shared primitives in `mod.rs`).
//! * `server/`: bind and accept, one task per connection, replies, shutdown, the handshake
//!   deadline and the log budget; it serves [`crate::store::db`].
//! * `client/`: one connection's sequences, a file each (connect and retry, handshake, call
//!   framing, one-reply calls, waits), its socket, the handshake for servers without PING, and
//!   a store's pool of connections.
//! * `store/`: the Store facade over the client (`ops.rs`: each method; `barrier.rs`;
//!   `tenants.rs`: the servers masters host, one configuration each; `waits.rs`: the calls
//!   that wait for keys, re-sent after a durable server's restart).
//! * `auth.rs`: the token and its proof, shared by client and server.
//!
//! The `ferrodist-store` binary's own concerns (its command line, `--backend` selection and
//! signals) live with the binary, in `rust/bin/ferrodist_store/`.

pub mod auth;
pub mod client;
pub mod codec;
pub mod server;
pub mod store;

pub use crate::store::db::Db;
pub use client::Client;
pub use codec::{
    decode_reply, decode_request, scan_request, FrameError, Limits, Opcode, Reply, ReplyKind,
    Request, Scan,
};
pub use server::{Server, ServerConfig};
pub use store::{TcpStore, TcpStoreOptions};
