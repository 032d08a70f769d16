//! Access control for the store: a shared token, proven both ways by challenge and response so
//! that it never travels and never reaches a log.
//!
//! torch's protocol has no authentication: anyone who reaches the port reads and writes every
//! key. A server started with a token admits only clients that prove they hold it, and a client
//! that holds one talks only to a server that proves it holds the same token, inside the
//! handshake torch already has, so nothing changes for anyone who does not use it:
//!
//! 1. The client sends torch's VALIDATE and PING (nonce: its pid), then the PING with
//!    [`FERRODIST_PING`](crate::tcp::codec::FERRODIST_PING), in one write, as always.
//! 2. A server with a token answers the marker with [`FERRODIST_PONG_AUTH`] (instead of
//!    `FERRODIST_PONG`) and a fresh random server challenge of [`CHALLENGE_LEN`] bytes.
//! 3. The client answers [`CLIENT_ANSWER_LEN`] raw bytes, outside torch's request framing (only
//!    a server that asked ever sees them): its proof, HMAC-SHA256(token, [`CLIENT_CONTEXT`] ‖
//!    server challenge ‖ client challenge), then a fresh random client challenge.
//! 4. The server checks the proof in constant time and answers one byte: [`REFUSED`], then it
//!    closes the connection (so the client can say "authentication failed" rather than report a
//!    broken connection or time out); or [`ADMITTED`] followed by its own proof,
//!    HMAC-SHA256(token, [`SERVER_CONTEXT`] ‖ server challenge ‖ client challenge).
//! 5. The client checks that proof before it sends anything more, and closes the connection
//!    when it is wrong.
//!
//! Both challenges are fresh per connection and both proofs cover both, so a proof recorded on
//! one connection is worth nothing on another, in either direction; the two contexts differ, so
//! a server's proof cannot be reflected back as a client's. A client with a token refuses every
//! server that does not prove it: a ferrodist server without a token, a torch server (they echo
//! the marker), an impostor on the port, and a ferrodist server of the first version of this
//! exchange (which answered [`FERRODIST_PONG_AUTH_V1`] and proved nothing), so the protection
//! cannot be downgraded. A stock torch client sends no marker and cannot prove anything: a
//! server with a token refuses it unless the operator admits torch's clients as they are
//! (`--allow-unauthenticated-torch-clients`). The exchange does not encrypt the traffic that
//! follows (run the store on a private network, or tunnel it, for that).
//!
//! [`AuthToken`] never shows its bytes: its `Debug` is redacted and no error or log line is
//! built from it.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};

/// What a server that requires a token answers to ferrodist's PING (then the challenge follows).
pub const FERRODIST_PONG_AUTH: u32 = 0xF0D1_57C5;
/// What servers of the first version of the exchange answered (they proved nothing to the
/// client); a client with a token refuses them.
pub const FERRODIST_PONG_AUTH_V1: u32 = 0xF0D1_57C3;
/// Bytes of each side's challenge.
pub const CHALLENGE_LEN: usize = 32;
/// Bytes of each side's proof (an HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// Bytes of the client's answer to the challenge: its proof, then its own challenge.
pub const CLIENT_ANSWER_LEN: usize = PROOF_LEN + CHALLENGE_LEN;
/// The server's answer to a valid proof (its own proof follows).
pub const ADMITTED: u8 = 0;
/// The server's answer to a wrong proof, just before it closes the connection.
pub const REFUSED: u8 = 1;
/// [`ADMITTED`] from a server whose state outlives it (see
/// [`FERRODIST_PONG_DURABLE`](crate::tcp::codec::FERRODIST_PONG_DURABLE)).
pub const ADMITTED_DURABLE: u8 = 2;
/// Prefixed to the challenges before the client's proof is MACed, so it means nothing to any
/// other use of the same token, the server's proof included.
pub const CLIENT_CONTEXT: &[u8] = b"ferrodist-store-auth-v2 client\0";
/// Prefixed to the challenges before the server's proof is MACed.
pub const SERVER_CONTEXT: &[u8] = b"ferrodist-store-auth-v2 server\0";

/// Which side a proof speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client's proof, checked by the server.
    Client,
    /// The server's proof, checked by the client.
    Server,
}

/// The challenges of one connection: the server's, then the client's.
#[derive(Debug, Clone, Copy)]
pub struct Challenges<'a> {
    /// The server's challenge (step 2).
    pub server: &'a [u8],
    /// The client's challenge (step 3).
    pub client: &'a [u8],
}

/// The environment variable ferrodist's clients (and a master's server) take the token from.
pub const TOKEN_ENV: &str = "FERRODIST_STORE_TOKEN";
/// The environment variable naming a file to read the token from (when [`TOKEN_ENV`] is unset).
pub const TOKEN_FILE_ENV: &str = "FERRODIST_STORE_TOKEN_FILE";

/// A shared secret. Cheap to clone; its bytes are never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(std::sync::Arc<[u8]>);

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

impl AuthToken {
    /// A token from its text, surrounding whitespace trimmed; an empty one is refused.
    pub fn new(text: &str) -> Result<AuthToken> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(Error::InvalidArgument(
                "the store auth token is empty".into(),
            ));
        }
        Ok(AuthToken(trimmed.as_bytes().into()))
    }

    /// The token in the file at `path` (read once; whitespace around it trimmed). A missing,
    /// unreadable or empty file is an error naming the file, never its content.
    pub fn from_file(path: &std::path::Path) -> Result<AuthToken> {
        let text = std::fs::read(path).map_err(|e| {
            Error::InvalidArgument(format!(
                "cannot read the auth token file {}: {e}",
                path.display()
            ))
        })?;
        let text = String::from_utf8(text).map_err(|_| {
            Error::InvalidArgument(format!(
                "the auth token file {} is not UTF-8 text",
                path.display()
            ))
        })?;
        AuthToken::new(&text).map_err(|_| {
            Error::InvalidArgument(format!("the auth token file {} is empty", path.display()))
        })
    }

    /// A store's token: `given` (the caller's argument, named `argument` in the error when it
    /// is blank), else [`AuthToken::from_env`]. One rule for every client and master, so the
    /// bindings only pass the argument through.
    pub fn given_or_env(given: Option<&str>, argument: &str) -> Result<Option<AuthToken>> {
        match given {
            Some(text) => AuthToken::new(text).map(Some).map_err(|_| {
                Error::InvalidArgument(format!("TCPStore(): argument '{argument}' is empty"))
            }),
            None => AuthToken::from_env(),
        }
    }

    /// The token from [`TOKEN_ENV`], else from the file [`TOKEN_FILE_ENV`] names; `None` when
    /// neither is set (or [`TOKEN_ENV`] is empty and no file is named).
    pub fn from_env() -> Result<Option<AuthToken>> {
        if let Some(text) = std::env::var_os(TOKEN_ENV).filter(|v| !v.is_empty()) {
            let text = text
                .into_string()
                .map_err(|_| Error::InvalidArgument(format!("{TOKEN_ENV} is not UTF-8 text")))?;
            return AuthToken::new(&text)
                .map(Some)
                .map_err(|_| Error::InvalidArgument(format!("{TOKEN_ENV} is blank")));
        }
        match std::env::var_os(TOKEN_FILE_ENV).filter(|v| !v.is_empty()) {
            Some(path) => AuthToken::from_file(std::path::Path::new(&path)).map(Some),
            None => Ok(None),
        }
    }

    /// `side`'s proof for a connection's `challenges`: HMAC-SHA256(token, context of `side` ‖
    /// server challenge ‖ client challenge).
    pub fn prove(&self, side: Side, challenges: Challenges<'_>) -> [u8; PROOF_LEN] {
        self.mac(side, challenges).finalize().into_bytes().into()
    }

    /// Whether `proof` is `side`'s proof for `challenges`, compared in constant time.
    pub fn verify(&self, side: Side, challenges: Challenges<'_>, proof: &[u8]) -> bool {
        self.mac(side, challenges).verify_slice(proof).is_ok()
    }

    fn mac(&self, side: Side, challenges: Challenges<'_>) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(match side {
            Side::Client => CLIENT_CONTEXT,
            Side::Server => SERVER_CONTEXT,
        });
        mac.update(challenges.server);
        mac.update(challenges.client);
        mac
    }
}

/// A fresh random challenge from the operating system's generator.
pub fn challenge() -> Result<[u8; CHALLENGE_LEN]> {
    let mut bytes = [0u8; CHALLENGE_LEN];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::Store(format!("no random bytes for an auth challenge: {e}")))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_verifies_only_for_its_token_its_side_and_both_challenges() {
        let token = AuthToken::new("  s3cret\n").unwrap();
        let other = AuthToken::new("s3cret!").unwrap();
        let (first, second, third) = (
            challenge().unwrap(),
            challenge().unwrap(),
            challenge().unwrap(),
        );
        assert_ne!(first, second, "challenges are fresh");
        let these = Challenges {
            server: &first,
            client: &second,
        };
        let proof = token.prove(Side::Client, these);
        assert!(token.verify(Side::Client, these, &proof));
        let trimmed = AuthToken::new("s3cret").unwrap();
        assert!(trimmed.verify(Side::Client, these, &proof), "trimmed");
        assert!(!other.verify(Side::Client, these, &proof));
        assert!(
            !token.verify(Side::Server, these, &proof),
            "not reflected as the server's"
        );
        let another_server = Challenges {
            server: &third,
            client: &second,
        };
        let another_client = Challenges {
            server: &first,
            client: &third,
        };
        assert!(!token.verify(Side::Client, another_server, &proof));
        assert!(!token.verify(Side::Client, another_client, &proof));
        assert!(!token.verify(Side::Client, these, &proof[..31]));
    }

    #[test]
    fn a_token_is_never_printed_and_never_empty() {
        let token = AuthToken::new("hunter2").unwrap();
        assert!(!format!("{token:?}").contains("hunter2"));
        assert!(AuthToken::new(" \n\t").is_err());
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let err = AuthToken::from_file(&missing).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        let blank = dir.path().join("blank");
        std::fs::write(&blank, "\n  \n").unwrap();
        let err = AuthToken::from_file(&blank).unwrap_err().to_string();
        assert!(err.contains("is empty"), "{err}");
        let good = dir.path().join("good");
        std::fs::write(&good, "hunter2\n").unwrap();
        let err = format!("{:?}", AuthToken::from_file(&good));
        assert!(!err.contains("hunter2"));
    }
}
