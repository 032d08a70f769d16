//! Access control for the store: a shared token, proven by a challenge and response so that it
//! never travels and never reaches a log.
//!
//! torch's protocol has no authentication: anyone who reaches the port reads and writes every
//! key. A server started with a token admits only clients that prove they hold it, inside the
//! handshake torch already has, so nothing changes for anyone who does not use it:
//!
//! 1. The client sends VALIDATE and PING with [`FERRODIST_PING`](crate::tcp::codec::FERRODIST_PING) in
//!    one write, as always.
//! 2. A server with a token answers [`FERRODIST_PONG_AUTH`] (instead of `FERRODIST_PONG`) and a
//!    fresh random challenge of [`CHALLENGE_LEN`] bytes.
//! 3. The client answers HMAC-SHA256(token, [`PROOF_CONTEXT`] ‖ challenge): [`PROOF_LEN`] raw
//!    bytes, outside torch's request framing (only a server that asked ever sees them).
//! 4. The server compares in constant time and answers one byte: [`ADMITTED`], or [`REFUSED`]
//!    and closes the connection, so the client can say "authentication failed" rather than
//!    report a broken connection or time out.
//!
//! A server without a token answers the marker PING as before, and torch's servers echo it, so
//! a client that holds a token still talks to either (it has nothing to prove to them). A
//! stock torch client sends its pid as the PING nonce and cannot prove anything: a server with
//! a token refuses it unless the operator admits torch's clients as they are
//! (`--allow-unauthenticated-torch-clients`). The challenge is fresh per connection, so a
//! recorded proof is worth nothing on another connection; the exchange does not encrypt the
//! traffic that follows (run the store on a private network, or tunnel it, for that).
//!
//! [`AuthToken`] never shows its bytes: its `Debug` is redacted and no error or log line is
//! built from it.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};

/// What a server that requires a token answers to ferrodist's PING (then the challenge follows).
pub const FERRODIST_PONG_AUTH: u32 = 0xF0D1_57C3;
/// Bytes of the server's challenge.
pub const CHALLENGE_LEN: usize = 32;
/// Bytes of the client's proof (an HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// The server's answer to a valid proof.
pub const ADMITTED: u8 = 0;
/// The server's answer to a wrong proof, just before it closes the connection.
pub const REFUSED: u8 = 1;
/// [`ADMITTED`] from a server whose state outlives it (see
/// [`FERRODIST_PONG_DURABLE`](crate::tcp::codec::FERRODIST_PONG_DURABLE)).
pub const ADMITTED_DURABLE: u8 = 2;
/// Prefixed to the challenge before it is MACed, so a proof means nothing to any other use of
/// the same token.
pub const PROOF_CONTEXT: &[u8] = b"ferrodist-store-auth-v1\0";

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

    /// The proof for `challenge`: HMAC-SHA256(token, [`PROOF_CONTEXT`] ‖ challenge).
    pub fn prove(&self, challenge: &[u8]) -> [u8; PROOF_LEN] {
        self.mac(challenge).finalize().into_bytes().into()
    }

    /// Whether `proof` answers `challenge`, compared in constant time.
    pub fn verify(&self, challenge: &[u8], proof: &[u8]) -> bool {
        self.mac(challenge).verify_slice(proof).is_ok()
    }

    fn mac(&self, challenge: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(PROOF_CONTEXT);
        mac.update(challenge);
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
    fn a_proof_verifies_only_for_its_token_and_its_challenge() {
        let token = AuthToken::new("  s3cret\n").unwrap();
        let other = AuthToken::new("s3cret!").unwrap();
        let first = challenge().unwrap();
        let second = challenge().unwrap();
        assert_ne!(first, second, "challenges are fresh");
        let proof = token.prove(&first);
        assert!(token.verify(&first, &proof));
        assert!(
            AuthToken::new("s3cret").unwrap().verify(&first, &proof),
            "trimmed"
        );
        assert!(!other.verify(&first, &proof));
        assert!(!token.verify(&second, &proof));
        assert!(!token.verify(&first, &proof[..31]));
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
