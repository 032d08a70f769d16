//! What `EtcdStore` needs to reach a cluster: endpoints, job prefix, timeout, login and TLS,
//! and the connection built from them.
//!
//! The connection is etcd-client's balanced gRPC channel over every endpoint, so a dead member
//! costs a retry, not the store. HTTP/2 keep-alives find a silently dead member within 15 s,
//! and `require_leader` makes a member cut off from its leader refuse at once (a retry goes
//! elsewhere) instead of serving a watch that will never fire.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::credentials::{has_userinfo, is_plaintext, Credentials};
use super::layout::check_prefix;
use super::retry::retrying;
use crate::error::{Error, Result};
use crate::store::Deadline;

/// Keep-alive ping interval and how long a ping may go unanswered. etcd (a gRPC server)
/// refuses pings closer than 5 s apart by closing the connection (`too_many_pings`).
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(5));

/// Longest time one TCP/TLS connect may take before the next endpoint is tried.
const CONNECT_LIMIT: Duration = Duration::from_secs(3);

/// PEM files for TLS; any may be absent (system roots and no client certificate).
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// CA bundle that signed the members' certificates.
    pub ca_file: Option<PathBuf>,
    /// Client certificate, for clusters that require one (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key.
    pub key_file: Option<PathBuf>,
    /// Name to verify the members' certificates against, when it differs from the host.
    pub domain: Option<String>,
}

/// Everything an [`super::EtcdStore`] is built from.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `host:port` or `http(s)://host:port` of one or more members.
    pub endpoints: Vec<String>,
    /// The job's prefix: every key of the store lives under `<prefix>:` (`layout.rs` says why;
    /// [`super::check_prefix`] says which prefixes are valid).
    pub prefix: String,
    /// Default timeout of blocking calls, and the deadline of every other call.
    pub timeout: Duration,
    /// etcd user name and password (etcd's auth), if the cluster has auth enabled. Sent only
    /// over TLS unless they say otherwise; `Debug` never shows the password.
    pub user: Option<Credentials>,
    /// TLS, if the members serve https.
    pub tls: Option<TlsFiles>,
}

fn read_pem(path: &PathBuf, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|err| {
        Error::InvalidArgument(format!(
            "EtcdStore: cannot read {what} {}: {err}",
            path.display()
        ))
    })
}

fn tls_options(files: &TlsFiles) -> Result<TlsOptions> {
    let mut tls = TlsOptions::new();
    if let Some(ca) = &files.ca_file {
        tls = tls.ca_certificate(Certificate::from_pem(read_pem(ca, "ca_file")?));
    }
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let (cert, key) = (read_pem(cert, "cert_file")?, read_pem(key, "key_file")?);
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        (None, None) => {}
        _ => {
            return Err(Error::InvalidArgument(
                "EtcdStore: cert_file and key_file go together".into(),
            ))
        }
    }
    if let Some(domain) = &files.domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(tls)
}

impl EtcdOptions {
    /// Checks the options a caller can get wrong before anything is sent.
    pub fn validate(&self) -> Result<()> {
        check_prefix(&self.prefix)?;
        if self.endpoints.is_empty() || self.endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(Error::InvalidArgument(
                "EtcdStore: endpoints must name at least one host:port, and no empty one".into(),
            ));
        }
        if self.endpoints.iter().any(|e| has_userinfo(e)) {
            // The endpoint itself is not echoed: its user info may hold a password.
            return Err(Error::InvalidArgument(
                "EtcdStore: an endpoint carries user info (user:password@); give the user as \
                 username and the password in a file or FERRODIST_ETCD_PASSWORD"
                    .into(),
            ));
        }
        if let Some(plain) = self.plaintext_endpoint() {
            if !self
                .user
                .as_ref()
                .is_some_and(Credentials::insecure_plaintext)
            {
                return Err(Error::InvalidArgument(format!(
                    "EtcdStore: refusing to send the etcd user name and password without TLS \
                     (endpoint {plain} is plain http): give ca_file (and https endpoints), or \
                     allow it explicitly with insecure_plaintext_credentials=1 \
                     (ferrodist-store: --etcd-insecure-plaintext-credentials)"
                )));
            }
        }
        Ok(())
    }

    /// The first endpoint that credentials would reach over plain HTTP/2, if there are
    /// credentials at all.
    pub fn plaintext_endpoint(&self) -> Option<&str> {
        self.user.as_ref()?;
        let tls = self.tls.is_some();
        self.endpoints
            .iter()
            .map(|e| e.trim())
            .find(|e| is_plaintext(e, tls))
    }

    /// A client of the cluster, connected (and logged in) before `deadline`.
    pub async fn connect(&self, deadline: Deadline) -> Result<Client> {
        self.validate()?;
        let mut options = ConnectOptions::new()
            .with_keep_alive(KEEP_ALIVE.0, KEEP_ALIVE.1)
            .with_keep_alive_while_idle(true)
            .with_connect_timeout(CONNECT_LIMIT)
            .with_require_leader(true);
        if let Some(credentials) = &self.user {
            if let Some(plain) = self.plaintext_endpoint() {
                tracing::warn!(
                    user = credentials.user(),
                    endpoint = plain,
                    "sending etcd credentials without TLS (insecure_plaintext_credentials)"
                );
            }
            options = options.with_user(credentials.user(), credentials.password());
        }
        if let Some(files) = &self.tls {
            options = options.with_tls(tls_options(files)?);
        }
        let endpoints = self.endpoints.clone();
        retrying("connect", deadline, || {
            let (endpoints, options) = (endpoints.clone(), options.clone());
            async move { Client::connect(endpoints, Some(options)).await.map(Ok) }
        })
        .await
    }
}
