//! A connection's handshake: VALIDATE, then, on a server with a token, the proof that the
//! client holds it (the exchange is described in [`crate::tcp::auth`]).
//!
//! Without a token the handshake is torch's: VALIDATE with the right magic admits the
//! connection. With one, the first request after VALIDATE other than torch's PING (whose
//! nonce, the client's pid, is echoed: every client sends it) decides: ferrodist's marker PING
//! gets the challenge, and the answer that follows admits the connection (and the server proves
//! the token in turn) or refuses it (a refusal byte is written before the connection closes,
//! so the client can say why). Anything
//! else comes from a client that cannot hold a token (a stock torch client, or torch 2.4's,
//! which sends no PING at all): it is served as the first request when the operator admits
//! such clients and the peer is on one of the networks they are admitted from (loopback unless
//! the operator names others), and refused otherwise: admitting torch's clients opens no door
//! around the token for the rest of the network. A connection stays under the handshake deadline until it
//! is admitted, so one that never answers the challenge is closed like one that never
//! validates.

use super::{Closed, Handler};
use crate::store::engine::Engine;
use crate::tcp::auth::{
    self, Challenges, Side, ADMITTED, ADMITTED_DURABLE, CHALLENGE_LEN, CLIENT_ANSWER_LEN,
    FERRODIST_PONG_AUTH, PROOF_LEN, REFUSED,
};
use crate::tcp::codec::{Reply, Request, FERRODIST_PING, VALIDATE_MAGIC};
use crate::tcp::server::handshake_deadline;
use crate::tcp::server::metrics::Refusal;

/// How far a connection's handshake has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Nothing read yet: the first request must be VALIDATE.
    Connected,
    /// VALIDATE came and the server has a token: the next request tells who the client is.
    Validated,
    /// torch's handshake PING came after it too (every client sends one): the request after it
    /// tells who the client is, ferrodist's marker or a stock client's first request.
    Greeted,
    /// The challenge went out; the next [`CLIENT_ANSWER_LEN`] bytes are the client's answer.
    Challenged,
    /// The proof was wrong; the refusal byte goes out, then the connection closes.
    Refused,
    /// The handshake is over: requests are served.
    Admitted,
}

/// What the handshake did with the buffered input.
pub(super) enum Step {
    /// The handshake is over and this request is the first to serve.
    Serve(Request),
    /// It took a step; look at the buffer again.
    Next,
    /// It needs more bytes (or is refusing the connection).
    Stop,
}

/// Why a connection whose proof was wrong is closed.
pub(super) const WRONG_TOKEN: Closed = Closed::Unauthenticated(
    Refusal::Authentication,
    "authentication failed: the client's proof does not match this server's token",
);

/// Why a client that cannot present a token is closed when such clients are admitted from
/// some networks, but not from this peer's.
const OUTSIDE_TORCH_CLIENT_NETWORKS: Closed = Closed::Unauthenticated(
    Refusal::TorchClient,
    "refused a client without ferrodist's handshake (a stock torch client?) from outside the \
     networks such clients are served from (loopback unless --torch-clients-from names others)",
);

/// Why a client that cannot present a token is closed.
const TORCH_CLIENT: Closed = Closed::Unauthenticated(
    Refusal::TorchClient,
    "refused a client without ferrodist's handshake (a stock torch client?): this server \
     requires an auth token (--allow-unauthenticated-torch-clients, or a master's \
     allow_unauthenticated_torch_clients=True, admits such clients)",
);

impl<E: Engine> Handler<E> {
    /// One step of the handshake over the buffered input.
    pub(super) fn handshake_step(&mut self) -> Result<Step, Closed> {
        match self.stage {
            Stage::Refused | Stage::Admitted => return Ok(Step::Stop),
            Stage::Challenged => return Ok(self.check_proof()),
            Stage::Connected | Stage::Validated | Stage::Greeted => {}
        }
        let Some(request) = self.decode()? else {
            return Ok(Step::Stop);
        };
        match (self.stage, request) {
            (
                Stage::Connected,
                Request::Validate {
                    magic: VALIDATE_MAGIC,
                },
            ) => {
                if self.shared.auth_token.is_some() {
                    self.stage = Stage::Validated;
                } else {
                    self.admit();
                }
                Ok(Step::Next)
            }
            (Stage::Connected, other) => Err(Closed::Refused(format!(
                "first request must be VALIDATE with the right magic, got {:?}",
                other.opcode()
            ))),
            (
                _,
                Request::Ping {
                    nonce: FERRODIST_PING,
                },
            ) => {
                let challenge = auth::challenge().map_err(|e| Closed::Refused(e.to_string()))?;
                self.output.reply(Reply::Nonce(FERRODIST_PONG_AUTH));
                self.output.put_slice(&challenge);
                self.challenge = Some(Box::new(challenge));
                self.stage = Stage::Challenged;
                Ok(Step::Next)
            }
            // torch's handshake PING (its nonce is the client's pid): ferrodist's client
            // sends it too, and says who it is in the request after it.
            (Stage::Validated, Request::Ping { nonce }) => {
                if self.torch_client_admitted() {
                    // A stock client may now sit idle as long as it likes, as when admitted.
                    self.stop_handshake_deadline();
                }
                self.output.reply(Reply::Nonce(nonce));
                self.stage = Stage::Greeted;
                Ok(Step::Next)
            }
            (_, request) if self.torch_client_admitted() => {
                self.admit();
                Ok(Step::Serve(request))
            }
            (_, _) => Err(self.torch_client_refusal()),
        }
    }

    /// Checks the client's answer once all of it is buffered: admits (and proves the token in
    /// turn), or queues the refusal.
    fn check_proof(&mut self) -> Step {
        if self.input.len() < CLIENT_ANSWER_LEN {
            return Step::Stop;
        }
        let answer = self.input.split_to(CLIENT_ANSWER_LEN);
        let (proof, client_challenge) = answer.split_at(PROOF_LEN);
        let server_challenge: Box<[u8; CHALLENGE_LEN]> = self.challenge.take().unwrap_or_default();
        let challenges = Challenges {
            server: &server_challenge[..],
            client: client_challenge,
        };
        let token = self.shared.auth_token.as_ref();
        match token.filter(|token| token.verify(Side::Client, challenges, proof)) {
            Some(token) => {
                self.output.put_u8(if E::DURABLE {
                    ADMITTED_DURABLE
                } else {
                    ADMITTED
                });
                self.output
                    .put_slice(&token.prove(Side::Server, challenges));
                self.admit();
                self.holds_behind_wait = true; // only ferrodist's client gets this far
                Step::Next
            }
            None => {
                self.output.put_u8(REFUSED);
                self.stage = Stage::Refused;
                Step::Stop
            }
        }
    }

    /// Whether this connection, from a client that cannot present a token, is served anyway:
    /// the operator admits such clients and the peer is on one of their networks.
    fn torch_client_admitted(&self) -> bool {
        self.shared.torch_clients_from.is_some()
            && self
                .stream
                .peer_addr()
                .is_ok_and(|peer| self.shared.admits_torch_client(peer.ip()))
    }

    /// Why a client that cannot present a token is closed.
    fn torch_client_refusal(&self) -> Closed {
        if self.shared.torch_clients_from.is_some() {
            OUTSIDE_TORCH_CLIENT_NETWORKS
        } else {
            TORCH_CLIENT
        }
    }

    fn admit(&mut self) {
        self.stage = Stage::Admitted;
        self.stop_handshake_deadline();
    }

    /// Takes the connection off the handshake-deadline watch list.
    pub(super) fn stop_handshake_deadline(&mut self) {
        if self.handshake != super::UNWATCHED {
            handshake_deadline::release(self.handshake);
            self.handshake = super::UNWATCHED;
        }
    }

    /// How the connection ended when the peer closed it: a client that validated and then left
    /// without proving it holds the token is logged as refused (a ferrodist client started
    /// without the token closes the connection when it sees the challenge), and one that left
    /// after torch's handshake and nothing more as a stock client.
    pub(super) fn left_during_handshake(&self) -> Result<(), Closed> {
        match self.stage {
            // A stock client that left after torch's handshake, before any request.
            Stage::Greeted if !self.torch_client_admitted() => Err(self.torch_client_refusal()),
            Stage::Validated | Stage::Challenged => Err(Closed::Unauthenticated(
                Refusal::Authentication,
                "the client left during authentication (it has no token, or the wrong kind)",
            )),
            _ => Ok(()),
        }
    }
}
