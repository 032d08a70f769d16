//! `ferrodist-store --backend`: where the server keeps its state.
//!
//! `memory` (the default) is the in-process engine: fastest, and gone with the process.
//! `etcd://host:port[,host:port...]/PREFIX` serves every request from an etcd cluster through
//! an `EtcdStore` of job `PREFIX` (etcd keys `PREFIX:...`; a prefix that could nest in another
//! job's is refused), so the server holds nothing of its own: one that is killed
//! and started again, or a second one beside it, serves every key clients were answered about.
//! Login and TLS come from the `--etcd-*` flags (the password from a file or
//! `FERRODIST_ETCD_PASSWORD`, never the command line, which `ps` shows to every user: a
//! `--etcd-password` or a `user:password@` in the URL is refused with a message that says where
//! it goes instead, and that does not repeat it). A user name needs a password, and the two go
//! only over TLS unless `--etcd-insecure-plaintext-credentials` says otherwise.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use ferrodist::error::{Error, Result};
use ferrodist::store::etcd::credentials::{Redacted, PASSWORD_ENV};
use ferrodist::store::etcd::{Credentials, PasswordSource, TlsFiles};
use ferrodist::store::EtcdOptions;

/// The `--backend` flag and the etcd options that go with it.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Where the state lives: `memory`, or `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (every key
    /// under `PREFIX:` in that etcd cluster, PREFIX being letters, digits, `.`, `_`, `-` in
    /// segments joined by single `/`; `https://` endpoints inside the list also work).
    #[arg(long, default_value = "memory", value_name = "memory|etcd://...")]
    pub backend: String,
    /// etcd: deadline of each etcd call in seconds (waits have none: clients bound them).
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub etcd_timeout: f64,
    /// etcd: user name, for clusters with auth enabled. Needs a password
    /// (`--etcd-password-file` or `FERRODIST_ETCD_PASSWORD`) and TLS (`--etcd-ca-file`, or
    /// `--etcd-insecure-plaintext-credentials`).
    #[arg(long)]
    pub etcd_username: Option<String>,
    /// etcd: file holding the password of `--etcd-username` (else `FERRODIST_ETCD_PASSWORD`).
    /// There is no `--etcd-password`: the command line is readable by every user of the host.
    #[arg(long, value_name = "FILE", requires = "etcd_username")]
    pub etcd_password_file: Option<PathBuf>,
    /// Refused: a password on the command line (see `--etcd-password-file`). Taken only to say
    /// so; its value is never shown.
    #[arg(long, hide = true, value_name = "REFUSED", num_args = 0..=1)]
    pub etcd_password: Option<Option<Redacted>>,
    /// etcd: send the user name and password over plain http (no TLS), where anyone on the
    /// path can read them. Without it, credentials with a non-TLS endpoint are refused.
    #[arg(long, requires = "etcd_username")]
    pub etcd_insecure_plaintext_credentials: bool,
    /// etcd: CA bundle (PEM) that signed the members' certificates; turns on TLS.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// etcd: client certificate (PEM), with `--etcd-key-file`; turns on TLS.
    #[arg(long, value_name = "FILE", requires = "etcd_key_file")]
    pub etcd_cert_file: Option<PathBuf>,
    /// etcd: the client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert_file")]
    pub etcd_key_file: Option<PathBuf>,
    /// etcd: name the members' certificates are checked against, when not the host's.
    #[arg(long, value_name = "NAME")]
    pub etcd_tls_domain: Option<String>,
}

/// `url` as it may be shown: everything before its last `@` replaced (the user info runs to
/// the last `@`, so a password with an unescaped `/` in it is hidden too).
fn shown(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].rfind('@') {
        None => url.to_owned(),
        Some(at) => format!("{}<redacted>@{}", &url[..start], &url[start + at + 1..]),
    }
}

/// `(endpoints, prefix)` of an `etcd://` URL.
pub fn parse_etcd_url(url: &str) -> Result<(Vec<String>, String)> {
    let bad = |why: &str| {
        Error::InvalidArgument(format!(
            "--backend {:?}: {why} (want etcd://HOST:PORT[,HOST:PORT...]/PREFIX)",
            shown(url)
        ))
    };
    let rest = url
        .strip_prefix("etcd://")
        .ok_or_else(|| bad("not memory nor an etcd:// URL"))?;
    if rest.contains('@') {
        return Err(bad(
            "no user or password in the URL: give the user with --etcd-username and the \
             password with --etcd-password-file or FERRODIST_ETCD_PASSWORD",
        ));
    }
    let (hosts, prefix) = rest.split_once('/').ok_or_else(|| bad("no /PREFIX"))?;
    let endpoints: Vec<String> = hosts.split(',').map(|h| h.trim().to_owned()).collect();
    if endpoints.iter().any(String::is_empty) {
        return Err(bad("an empty endpoint"));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        return Err(bad("an empty PREFIX"));
    }
    Ok((endpoints, prefix.to_owned()))
}

impl BackendArgs {
    /// The etcd cluster these flags name (its files read), or `None` for `memory`.
    pub fn etcd_options(&self) -> Result<Option<EtcdOptions>> {
        if self.etcd_password.is_some() {
            return Err(Error::InvalidArgument(format!(
                "--etcd-password is refused: the command line is readable by every user of \
                 the host (ps); put the password in a file named by --etcd-password-file, or \
                 in the environment variable {PASSWORD_ENV}"
            )));
        }
        if self.backend == "memory" {
            return Ok(None);
        }
        let (endpoints, prefix) = parse_etcd_url(&self.backend)?;
        let timeout = Duration::try_from_secs_f64(self.etcd_timeout)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "--etcd-timeout: want positive seconds, got {}",
                    self.etcd_timeout
                ))
            })?;
        let source = PasswordSource {
            value: None,
            file: self.etcd_password_file.clone(),
        };
        let user = Credentials::resolve(self.etcd_username.clone(), source)?
            .map(|c| c.with_insecure_plaintext(self.etcd_insecure_plaintext_credentials));
        let tls_asked = self.etcd_ca_file.is_some()
            || self.etcd_cert_file.is_some()
            || self.etcd_tls_domain.is_some();
        let tls = tls_asked.then(|| TlsFiles {
            ca_file: self.etcd_ca_file.clone(),
            cert_file: self.etcd_cert_file.clone(),
            key_file: self.etcd_key_file.clone(),
            domain: self.etcd_tls_domain.clone(),
        });
        Ok(Some(EtcdOptions {
            endpoints,
            prefix,
            timeout,
            user,
            tls,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls_name_endpoints_and_a_prefix() {
        let (endpoints, prefix) = parse_etcd_url("etcd://a:2379, b:2379/job/x/").unwrap();
        assert_eq!(endpoints, ["a:2379", "b:2379"]);
        assert_eq!(prefix, "job/x");
        assert!(parse_etcd_url("etcd://a:2379").is_err(), "no prefix");
        assert!(parse_etcd_url("etcd://a:2379/").is_err(), "empty prefix");
        assert!(
            parse_etcd_url("etcd://a:2379,/p").is_err(),
            "empty endpoint"
        );
        let err = parse_etcd_url("etcd://u:pw-secret@a:2379/p").unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("--etcd-password-file"), "{shown}");
        assert!(
            !shown.contains("pw-secret") && !shown.contains("u:"),
            "{shown}"
        );
        for url in [
            "etcd://u:pw-secret@a:2379",
            "etcd://u:pw/secret@a:2379/p",
            "u:secret@a",
        ] {
            let err = parse_etcd_url(url).unwrap_err().to_string();
            assert!(!err.contains("secret"), "{err}");
        }
        assert!(parse_etcd_url("redis://a/p").is_err());
    }
}
