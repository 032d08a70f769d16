//! etcd login credentials: where the password may come from, and when it may be sent.
//!
//! Why a type of its own: the password must never reach a message, a log line or a `Debug`
//! dump (options structs are printed with `{:?}` when something goes wrong), and it must never
//! come from a command line, which `ps` and `/proc/PID/cmdline` show to every user of the host.
//! So it comes from the caller's memory (an API argument), a file or `FERRODIST_ETCD_PASSWORD`;
//! a user name with no password is an error (etcd would refuse the login anyway, later and
//! less clearly); and the pair only goes over TLS: etcd's `Authenticate` call carries the
//! password in clear over plain HTTP/2, as does every request's token after it. Sending it
//! without TLS takes an explicit `insecure_plaintext_credentials`, and is logged as a warning.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The environment variable a password is read from when no file (and no value) is given.
pub const PASSWORD_ENV: &str = "FERRODIST_ETCD_PASSWORD";

/// An etcd user name and its password. `Debug` shows the name and never the password.
#[derive(Clone)]
pub struct Credentials {
    user: String,
    password: String,
    /// Whether the pair may go to a member over plain (non-TLS) HTTP/2.
    insecure_plaintext: bool,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("insecure_plaintext", &self.insecure_plaintext)
            .finish()
    }
}

/// Where a caller's password comes from; at most one of `value` and `file`.
#[derive(Debug, Clone, Default)]
pub struct PasswordSource {
    /// Given in memory (the Python API's `password=`), never from a command line.
    pub value: Option<Redacted>,
    /// A file holding the password (one trailing newline dropped).
    pub file: Option<PathBuf>,
}

/// A string whose `Debug` never shows it.
#[derive(Clone)]
pub struct Redacted(pub String);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// For command-line parsers that take a value only to refuse it.
impl std::str::FromStr for Redacted {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(Redacted(s.to_owned()))
    }
}

impl Credentials {
    /// A user and password checked for emptiness (plaintext not allowed).
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Result<Self> {
        let (user, password) = (user.into(), password.into());
        if user.is_empty() {
            return Err(Error::InvalidArgument(
                "etcd credentials: the user name is empty".into(),
            ));
        }
        if password.is_empty() {
            return Err(no_password(&user));
        }
        Ok(Credentials {
            user,
            password,
            insecure_plaintext: false,
        })
    }

    /// The credentials a caller names: `None` without a user (a password or password file
    /// without a user is an error: it would be dropped unseen). The password comes from
    /// `source`, else from [`PASSWORD_ENV`]; none at all, or an empty one, is an error.
    pub fn resolve(user: Option<String>, source: PasswordSource) -> Result<Option<Self>> {
        let Some(user) = user else {
            if source.value.is_some() || source.file.is_some() {
                return Err(Error::InvalidArgument(
                    "etcd credentials: a password was given without a user name".into(),
                ));
            }
            return Ok(None);
        };
        let password = match (source.value, source.file) {
            (Some(_), Some(_)) => {
                return Err(Error::InvalidArgument(
                    "etcd credentials: give the password or a password file, not both".into(),
                ))
            }
            (Some(Redacted(value)), None) => value,
            (None, Some(path)) => read_password_file(&path)?,
            (None, None) => std::env::var(PASSWORD_ENV).unwrap_or_default(),
        };
        Self::new(user, password).map(Some)
    }

    /// The same credentials, allowed (or not) to go over plain HTTP/2: the caller's explicit
    /// `insecure_plaintext_credentials`.
    pub fn with_insecure_plaintext(mut self, allowed: bool) -> Self {
        self.insecure_plaintext = allowed;
        self
    }

    /// Whether they may go over plain HTTP/2.
    pub fn insecure_plaintext(&self) -> bool {
        self.insecure_plaintext
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password, for the login call only.
    pub(super) fn password(&self) -> &str {
        &self.password
    }
}

fn no_password(user: &str) -> Error {
    Error::InvalidArgument(format!(
        "etcd credentials: user {user:?} has no password; put it in a file (password_file, \
         ferrodist-store --etcd-password-file) or in the environment variable {PASSWORD_ENV}"
    ))
}

/// The password a file holds, without its trailing line end. The message of a failure names
/// the file and the reason, never what was read.
pub fn read_password_file(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|err| {
        Error::InvalidArgument(format!(
            "etcd credentials: cannot read the password file {}: {}",
            path.display(),
            err.kind()
        ))
    })?;
    Ok(text.trim_end_matches(['\r', '\n']).to_owned())
}

/// Whether `endpoint` is a URL with `user[:password]@` in it (refused: a password there ends
/// up wherever the endpoint list is printed).
pub fn has_userinfo(endpoint: &str) -> bool {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    rest.split('/')
        .next()
        .is_some_and(|authority| authority.contains('@'))
}

/// Whether a connection to `endpoint` is plain HTTP/2 (etcd-client's rule: `http://`, or a bare
/// `host:port` when no TLS options are given).
pub fn is_plaintext(endpoint: &str, tls: bool) -> bool {
    let endpoint = endpoint.trim();
    endpoint.starts_with("http://") || (!endpoint.starts_with("https://") && !tls)
}

#[cfg(test)]
mod tests {
    use super::super::{EtcdOptions, TlsFiles};
    use super::*;

    #[test]
    fn debug_never_shows_the_password() {
        let c = Credentials::new("root", "hunter2-secret").unwrap();
        let shown = format!("{c:?} {:?}", Redacted("hunter2-secret".into()));
        assert!(
            shown.contains("root") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn a_user_needs_a_password_and_a_password_needs_a_user() {
        let value = |v: &str| PasswordSource {
            value: Some(Redacted(v.into())),
            file: None,
        };
        assert!(Credentials::resolve(Some("u".into()), value("")).is_err());
        assert!(Credentials::resolve(None, value("p")).is_err());
        assert!(Credentials::resolve(None, PasswordSource::default())
            .unwrap()
            .is_none());
        let both = PasswordSource {
            value: Some(Redacted("p".into())),
            file: Some("/x".into()),
        };
        assert!(Credentials::resolve(Some("u".into()), both).is_err());
        let err = Credentials::resolve(Some("u".into()), value("")).unwrap_err();
        assert!(err.to_string().contains(PASSWORD_ENV), "{err}");
    }

    fn options(endpoints: &[&str], tls: bool, user: Option<Credentials>) -> EtcdOptions {
        EtcdOptions {
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            prefix: "p".into(),
            timeout: std::time::Duration::from_secs(1),
            user,
            tls: tls.then(TlsFiles::default),
        }
    }

    #[test]
    fn credentials_need_tls_unless_explicitly_insecure_and_never_show() {
        let user = || Credentials::new("root", "hunter2-secret").unwrap();
        let plain = options(&["h:1"], false, Some(user()));
        let err = plain.validate().unwrap_err().to_string();
        assert!(err.contains("insecure_plaintext_credentials"), "{err}");
        assert!(!format!("{plain:?} {err}").contains("hunter2"));
        let allowed = options(&["h:1"], false, Some(user().with_insecure_plaintext(true)));
        assert!(allowed.validate().is_ok());
        assert_eq!(allowed.plaintext_endpoint(), Some("h:1"));
        assert!(options(&["h:1", "https://g:2"], true, Some(user()))
            .validate()
            .is_ok());
        assert!(options(&["https://g:2"], false, Some(user()))
            .validate()
            .is_ok());
        let mixed = options(&["https://g:2", "http://h:1"], true, Some(user()));
        assert!(
            mixed.validate().is_err(),
            "one plain member is enough to refuse"
        );
        assert!(options(&["h:1"], false, None).validate().is_ok());
        let userinfo = options(&["http://root:hunter2@h:1"], false, None);
        let err = userinfo.validate().unwrap_err().to_string();
        assert!(
            err.contains("user info") && !err.contains("hunter2"),
            "{err}"
        );
    }

    #[test]
    fn endpoints_with_userinfo_and_plaintext_ones_are_told_apart() {
        assert!(has_userinfo("http://u:p@h:1"));
        assert!(has_userinfo("u:p@h:1"));
        assert!(!has_userinfo("h:1"));
        assert!(!has_userinfo("https://h:1/a@b"));
        assert!(is_plaintext("http://h:1", true));
        assert!(is_plaintext("h:1", false));
        assert!(!is_plaintext("h:1", true));
        assert!(!is_plaintext("https://h:1", false));
    }
}
