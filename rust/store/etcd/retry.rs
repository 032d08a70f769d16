//! Every etcd call runs under a deadline and is retried while etcd is only briefly unable to
//! answer.
//!
//! A member that dies, a leader election, a connection that breaks: etcd's clients see these
//! as `Unavailable`, `leader changed`, a transport error or an attempt that never answers. They
//! pass within an election timeout or two, so an attempt that fails that way is tried again
//! (another endpoint of the balanced channel serves it) with a short growing pause, until the
//! call's deadline. What cannot pass by waiting (a refused login, a value over etcd's size
//! limit, bad TLS files) fails at once.
//!
//! Retrying is only safe for calls whose repetition changes nothing: reads, `set`, and the
//! read-modify-write calls of [`super::rmw`], which carry a receipt for exactly that reason.

use std::future::Future;
use std::time::Duration;

use tonic::Code;

use crate::error::{Error, Result};
use crate::store::Deadline;

/// Longest single attempt: a request to a member that lost its leader can hang for etcd's own
/// request timeout (seconds); cutting it short lets the next attempt go to a healthy member.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(2);

/// First pause between attempts; doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_PAUSE: Duration = Duration::from_millis(400);

/// Whether `err` is one etcd gets over by itself (an election, a member restarting).
pub fn is_transient(err: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match err {
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Aborted
            | Code::Internal
            | Code::Cancelled => true,
            // A connection the server closed (HTTP/2 GOAWAY) comes as "resource exhausted" too;
            // etcd's own "database space exceeded" does not pass by retrying.
            Code::ResourceExhausted => status.message().contains("h2 protocol error"),
            _ => false,
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        _ => false,
    }
}

/// The crate error for an etcd failure that retrying cannot fix.
pub fn fatal(what: &str, err: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    match err {
        E::InvalidArgs(msg) => Error::InvalidArgument(format!("etcd {what}: {msg}")),
        E::InvalidUri(uri) => Error::InvalidArgument(format!("etcd endpoint: {uri}")),
        E::TransportError(e) => Error::Network(format!("etcd {what}: {e}")),
        E::GRpcStatus(status) if status.code() == Code::InvalidArgument => {
            Error::InvalidArgument(format!("etcd {what}: {}", status.message()))
        }
        other => Error::Store(format!("etcd {what}: {other}")),
    }
}

/// The error for a call whose deadline passed while etcd kept failing (or never answered).
pub fn gave_up(what: &str, deadline: &Deadline, last: Option<&etcd_client::Error>) -> Error {
    let last = last.map_or_else(|| "no answer".to_owned(), |e| e.to_string());
    Error::NetworkTimeout(format!(
        "etcd {what} did not complete within {}ms (last error: {last})",
        deadline.timeout().as_millis()
    ))
}

/// Runs `attempt` until it gives an answer (a `Ok(result)`, which may itself be the call's
/// error), fails for good, or `deadline` passes. Each attempt is cut at [`ATTEMPT_LIMIT`].
pub async fn retrying<T, F, Fut>(what: &str, deadline: Deadline, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<Result<T>, etcd_client::Error>>,
{
    let mut pause = FIRST_PAUSE;
    let mut last: Option<etcd_client::Error> = None;
    loop {
        let limit = deadline
            .remaining()
            .map_or(ATTEMPT_LIMIT, |left| left.min(ATTEMPT_LIMIT));
        if limit.is_zero() {
            return Err(gave_up(what, &deadline, last.as_ref()));
        }
        match tokio::time::timeout(limit, attempt()).await {
            Ok(Ok(answer)) => return answer,
            Ok(Err(err)) if !is_transient(&err) => return Err(fatal(what, err)),
            Ok(Err(err)) => {
                tracing::debug!(what, error = %err, "etcd call failed, retrying");
                last = Some(err);
            }
            Err(_) => tracing::debug!(what, "etcd attempt timed out, retrying"),
        }
        let nap = deadline.remaining().map_or(pause, |left| left.min(pause));
        tokio::time::sleep(nap).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}
