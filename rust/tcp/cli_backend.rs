//! `ferrodist-store --backend`: where the server keeps its state.
//!
//! `memory` (the default) is the in-process engine: fastest, and gone with the process.
//! `etcd://host:port[,host:port...]/PREFIX` serves every request from an etcd cluster through
//! an `EtcdStore` under `PREFIX/`, so the server holds nothing of its own: one that is killed
//! and started again, or a second one beside it, serves every key clients were answered about.
//! Login and TLS come from the `--etcd-*` flags (the password from a file or
//! `FERRODIST_ETCD_PASSWORD`, never the command line, which `ps` shows to every user).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::error::{Error, Result};
use crate::store::etcd::TlsFiles;
use crate::store::EtcdOptions;

/// Where the password of `--etcd-username` comes from when no file is given.
pub const PASSWORD_ENV: &str = "FERRODIST_ETCD_PASSWORD";

/// The `--backend` flag and the etcd options that go with it.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Where the state lives: `memory`, or `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (every key
    /// under `PREFIX/` in that etcd cluster; `https://` endpoints inside the list also work).
    #[arg(long, default_value = "memory", value_name = "memory|etcd://...")]
    pub backend: String,
    /// etcd: deadline of each etcd call in seconds (waits have none: clients bound them).
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub etcd_timeout: f64,
    /// etcd: user name, for clusters with auth enabled.
    #[arg(long)]
    pub etcd_username: Option<String>,
    /// etcd: file holding the password of `--etcd-username` (else `FERRODIST_ETCD_PASSWORD`).
    #[arg(long, value_name = "FILE", requires = "etcd_username")]
    pub etcd_password_file: Option<PathBuf>,
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

/// `(endpoints, prefix)` of an `etcd://` URL.
pub fn parse_etcd_url(url: &str) -> Result<(Vec<String>, String)> {
    let bad = |why: &str| {
        Error::InvalidArgument(format!(
            "--backend {url:?}: {why} (want etcd://HOST:PORT[,HOST:PORT...]/PREFIX)"
        ))
    };
    let rest = url
        .strip_prefix("etcd://")
        .ok_or_else(|| bad("not memory nor an etcd:// URL"))?;
    let (hosts, prefix) = rest.split_once('/').ok_or_else(|| bad("no /PREFIX"))?;
    if hosts.contains('@') {
        return Err(bad("give the user with --etcd-username, not in the URL"));
    }
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
        let user = match &self.etcd_username {
            None => None,
            Some(name) => Some((name.clone(), self.password()?)),
        };
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

    fn password(&self) -> Result<String> {
        match &self.etcd_password_file {
            Some(path) => std::fs::read_to_string(path)
                .map(|p| p.trim_end_matches(['\r', '\n']).to_owned())
                .map_err(|err| {
                    Error::InvalidArgument(format!(
                        "--etcd-password-file {}: {err}",
                        path.display()
                    ))
                }),
            None => Ok(std::env::var(PASSWORD_ENV).unwrap_or_default()),
        }
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
        assert!(
            parse_etcd_url("etcd://u:pw@a:2379/p").is_err(),
            "user in the URL"
        );
        assert!(parse_etcd_url("redis://a/p").is_err());
    }
}
