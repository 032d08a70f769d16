//! The handshake: torch's VALIDATE and PING, then ferrodist's marker PING, whose answer says
//! what the server is (ferrodist's, durable, asking for a token) and, with a token, the
//! challenge/response that proves each side to the other.
//!
//! The marker's answer may arrive late (or never, from a peer that speaks only torch's part), so
//! it is read here at connect when it comes in time and otherwise by the first call
//! ([`Client::take_arrived_introduction`], [`Client::await_introduced`]).

use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::io::earliest;
use super::socket::{ClientSocket, Filled};
use super::{closed, Client, Introduction, CLOSED_BY_SERVER};
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::auth::{
    self, AuthToken, Challenges, Side, ADMITTED, ADMITTED_DURABLE, CHALLENGE_LEN,
    FERRODIST_PONG_AUTH, FERRODIST_PONG_AUTH_V1, PROOF_LEN, REFUSED, TOKEN_ENV, TOKEN_FILE_ENV,
};
use crate::tcp::codec::{
    Reply, ReplyKind, Request, FERRODIST_PING, FERRODIST_PONG, FERRODIST_PONG_DURABLE,
    VALIDATE_MAGIC,
};

/// How long a connect waits for the answer to the marker PING after the echo of the pid.
const INTRODUCTION_GRACE: Duration = Duration::from_millis(100);

impl Client {
    /// A client on a connected socket that has not shaken hands yet.
    pub(super) fn unshaken(socket: ClientSocket, peer: String, deadline: Deadline) -> Client {
        Client {
            socket,
            peer,
            deadline,
            peer_checked: Instant::now(),
            input: BytesMut::with_capacity(4096),
            output: BytesMut::with_capacity(4096),
            ferrodist_server: false,
            durable_server: false,
            introduction: Introduction::Done,
            pending: None,
            busy: false,
        }
    }

    pub(super) fn handshake(
        socket: ClientSocket,
        peer: String,
        deadline: Deadline,
        token: Option<&AuthToken>,
    ) -> Result<Client> {
        let mut client = Client::unshaken(socket, peer, deadline);
        let pid = std::process::id();
        Request::Validate {
            magic: VALIDATE_MAGIC,
        }
        .encode(&mut client.output);
        Request::Ping { nonce: pid }.encode(&mut client.output);
        Request::Ping {
            nonce: FERRODIST_PING,
        }
        .encode(&mut client.output);
        client.flush()?;
        match client.read_reply(ReplyKind::Nonce)? {
            Reply::Nonce(echo) if echo == pid => {}
            other => {
                return Err(Error::Network(format!(
                    "Ping failed, invalid value returned from server. Expected: {pid}, Got: \
                     {other:?}"
                )))
            }
        }
        client.introduction = Introduction::Unanswered;
        if token.is_some() {
            // Nothing may go out before the server has seen the proof.
            client.read_introduction(token)?;
        } else {
            client.await_introduction()?;
        }
        Ok(client)
    }

    /// Reads the marker's answer when it comes within [`INTRODUCTION_GRACE`]. Every server
    /// sends it right behind the echo of the pid; a peer that answered torch's handshake and
    /// nothing more (one that closed, say) leaves it unanswered, to be read (or its absence
    /// found) at the next call, rather than failing or delaying the connect.
    fn await_introduction(&mut self) -> Result<()> {
        let until = Instant::now() + INTRODUCTION_GRACE;
        let until = earliest(Some(until), self.deadline.at());
        while self.input.len() < 4 {
            match self.socket.fill(&mut self.input, until) {
                Ok(Filled::Data) => {}
                Ok(Filled::Eof | Filled::TimedOut) | Err(_) => return Ok(()),
            }
        }
        self.read_introduction(None)
    }

    /// Reads the marker's answer if it has arrived, without waiting for it: what the server is
    /// may then be known before a call (a durable server's restart, say) needs it.
    pub fn take_arrived_introduction(&mut self) -> Result<()> {
        if self.introduction != Introduction::Unanswered {
            return Ok(());
        }
        let mut broken = None;
        if self.input.len() < 4 {
            match self.socket.fill_now(&mut self.input) {
                Ok(Filled::Data | Filled::TimedOut) => {}
                Ok(Filled::Eof) => broken = Some(closed(&self.peer, CLOSED_BY_SERVER)),
                Err(e) => broken = Some(closed(&self.peer, format!("connection broken: {e}"))),
            }
        }
        // An answer that came before the server left still says what the server was.
        if self.input.len() >= 4 {
            self.read_introduction(None)?;
        }
        broken.map_or(Ok(()), Err)
    }

    /// Waits, until `deadline`, for the answer to the marker PING when it was late for the
    /// handshake: what the server is (durable, say) is then known before a request goes out.
    /// A deadline passed midway leaves the client broken.
    pub fn await_introduced(&mut self, deadline: Deadline) -> Result<()> {
        if self.introduction != Introduction::Unanswered {
            return Ok(());
        }
        self.begin(deadline)?;
        self.read_introduction(None)?;
        self.busy = false;
        Ok(())
    }

    /// Reads the server's answer to the marker PING (the next reply on the wire) and learns
    /// from it what the server is; `token` answers a challenge.
    pub(super) fn read_introduction(&mut self, token: Option<&AuthToken>) -> Result<()> {
        self.introduction = Introduction::Done;
        let answer = self.read_reply(ReplyKind::Nonce)?;
        if let Reply::Nonce(FERRODIST_PONG_AUTH) = answer {
            self.ferrodist_server = true;
            self.durable_server = self.authenticate(token)?;
            return Ok(());
        }
        if token.is_some() {
            // A client with a token talks only to a server that proves it holds the token.
            return Err(self.unproven_server(&answer));
        }
        match answer {
            Reply::Nonce(FERRODIST_PONG) => self.ferrodist_server = true,
            Reply::Nonce(FERRODIST_PONG_DURABLE) => {
                self.ferrodist_server = true;
                self.durable_server = true;
            }
            Reply::Nonce(FERRODIST_PING) => {}
            Reply::Nonce(FERRODIST_PONG_AUTH_V1) => return Err(self.no_token()),
            other => {
                return Err(Error::Network(format!(
                    "Ping failed, invalid value returned from server. Expected: \
                     {FERRODIST_PING}, Got: {other:?}"
                )))
            }
        }
        Ok(())
    }

    /// Why a client with a token will not use a server that did not prove the token (the
    /// marker's `answer` says what the server is).
    fn unproven_server(&self, answer: &Reply) -> Error {
        self.unproven(match answer {
            Reply::Nonce(FERRODIST_PONG | FERRODIST_PONG_DURABLE) => {
                "it is a ferrodist server that requires no token"
            }
            Reply::Nonce(FERRODIST_PONG_AUTH_V1) => {
                "it runs an older ferrodist-store whose authentication does not prove the \
                 server; upgrade it"
            }
            Reply::Nonce(FERRODIST_PING) => "it is not ferrodist's (a torch server?)",
            _ => "it does not speak ferrodist's handshake",
        })
    }

    /// [`Client::unproven_server`], with `what` the server turned out to be.
    pub(super) fn unproven(&self, what: &str) -> Error {
        Error::Unauthenticated(format!(
            "the store at {} did not prove that it holds this client's auth token ({what}); \
             a client with a token sends nothing to such a server (drop the token, e.g. unset \
             {TOKEN_ENV}, to use it without authentication)",
            self.peer
        ))
    }

    fn no_token(&self) -> Error {
        Error::Unauthenticated(format!(
            "the store at {} requires an auth token and this client has none: pass \
             auth_token= to TCPStore, or set {TOKEN_ENV} (or {TOKEN_FILE_ENV})",
            self.peer
        ))
    }

    /// Answers the server's challenge with the proof that this client holds `token` and its own
    /// challenge, then checks the server's proof; true when the server that admitted it is
    /// durable.
    fn authenticate(&mut self, token: Option<&AuthToken>) -> Result<bool> {
        let server_challenge = self.read_raw(CHALLENGE_LEN)?;
        let Some(token) = token else {
            return Err(self.no_token());
        };
        let client_challenge = auth::challenge()?;
        let challenges = Challenges {
            server: &server_challenge,
            client: &client_challenge,
        };
        self.output
            .extend_from_slice(&token.prove(Side::Client, challenges));
        self.output.extend_from_slice(&client_challenge);
        self.flush()?;
        let durable = match self.read_raw(1).map(|answer| answer[0]) {
            Ok(ADMITTED) => false,
            Ok(ADMITTED_DURABLE) => true,
            Ok(REFUSED) | Err(Error::ConnectionClosed { .. }) => {
                return Err(Error::Unauthenticated(format!(
                    "authentication failed: the store at {} refused this client's auth token \
                     (the server holds a different one)",
                    self.peer
                )))
            }
            Ok(other) => {
                return Err(Error::Protocol(format!(
                    "unexpected answer {other} to the auth proof"
                )))
            }
            Err(err) => return Err(err),
        };
        let server_proof = self.read_raw(PROOF_LEN)?;
        if !token.verify(Side::Server, challenges, &server_proof) {
            return Err(Error::Unauthenticated(format!(
                "authentication failed: the store at {} admitted this client but could not \
                 prove that it holds the same auth token (an impostor?); nothing was sent to it",
                self.peer
            )));
        }
        Ok(durable)
    }

    /// Reads `n` raw bytes (the auth exchange, which is outside torch's reply framing).
    fn read_raw(&mut self, n: usize) -> Result<BytesMut> {
        while self.input.len() < n {
            match self.socket.fill(&mut self.input, self.deadline.at()) {
                Ok(Filled::Data) => self.peer_checked = Instant::now(),
                Ok(Filled::Eof) => return Err(closed(&self.peer, CLOSED_BY_SERVER)),
                Ok(Filled::TimedOut) => return Err(self.passed_deadline()),
                Err(e) => return Err(closed(&self.peer, format!("recv failed: {e}"))),
            }
        }
        Ok(self.input.split_to(n))
    }
}
