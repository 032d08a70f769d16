//! The servers this process hosts, by port, and the configuration each was started with.
//!
//! `multi_tenant` masters of one process that ask for the same port share one server, as in
//! torch. A server has one configuration, though: a second master that asked for another token,
//! other limits, another stance on stock torch clients or another metrics address would get
//! the first one's without a word, and believe its store guarded by what it asked for. So a
//! master joins a running server only when it asks for the same configuration; otherwise it
//! fails with an error that names what differs (and never a token's value).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use super::TcpStoreOptions;
use crate::error::{Error, Result};
use crate::tcp::auth::AuthToken;
use crate::tcp::codec::Limits;
use crate::tcp::server::Server;

/// What a hosted server enforces, as a master asked for it: every field of
/// [`TcpStoreOptions`] that the server (not the client) acts on.
#[derive(Clone)]
pub(super) struct HostedConfig {
    auth_token: Option<AuthToken>,
    limits: Limits,
    allow_unauthenticated_torch_clients: bool,
    metrics_addr: Option<String>,
}

impl HostedConfig {
    /// The server configuration `options` asks for.
    pub(super) fn of(options: &TcpStoreOptions) -> HostedConfig {
        HostedConfig {
            auth_token: options.auth_token.clone(),
            limits: options.limits,
            allow_unauthenticated_torch_clients: options.allow_unauthenticated_torch_clients,
            metrics_addr: options.metrics_addr.clone(),
        }
    }

    /// How `asked` differs from this (the running server's) configuration, one phrase per
    /// difference; empty when they agree. Tokens are compared, never shown.
    fn differences(&self, asked: &HostedConfig) -> Vec<String> {
        let mut found = Vec::new();
        match (&self.auth_token, &asked.auth_token) {
            (Some(running), Some(wanted)) if running != wanted => {
                found.push("auth token differs".to_owned());
            }
            (Some(_), None) => {
                found.push("one has a token, the other none (the running server has one)".into());
            }
            (None, Some(_)) => {
                found.push("one has a token, the other none (this master has one)".into());
            }
            _ => {}
        }
        let limits = [
            (
                "max_key_bytes",
                self.limits.max_key_bytes,
                asked.limits.max_key_bytes,
            ),
            (
                "max_value_bytes",
                self.limits.max_value_bytes,
                asked.limits.max_value_bytes,
            ),
            ("max_keys", self.limits.max_keys, asked.limits.max_keys),
            (
                "max_request_bytes",
                self.limits.max_request_bytes,
                asked.limits.max_request_bytes,
            ),
        ];
        for (name, running, wanted) in limits {
            if running != wanted {
                found.push(format!(
                    "limit {name} differs (running {running}, asked {wanted})"
                ));
            }
        }
        if self.allow_unauthenticated_torch_clients != asked.allow_unauthenticated_torch_clients {
            found.push(format!(
                "allow_unauthenticated_torch_clients differs (running {}, asked {})",
                self.allow_unauthenticated_torch_clients, asked.allow_unauthenticated_torch_clients
            ));
        }
        if self.metrics_addr != asked.metrics_addr {
            let show = |addr: &Option<String>| addr.clone().unwrap_or_else(|| "none".to_owned());
            found.push(format!(
                "metrics address differs (running {}, asked {})",
                show(&self.metrics_addr),
                show(&asked.metrics_addr)
            ));
        }
        found
    }
}

/// One hosted server and the configuration it was started with.
pub(super) struct Tenant {
    server: Weak<Server>,
    config: HostedConfig,
}

/// The hosted servers of this process by port. Held locked from the look-up of a port to the
/// registration of a new server on it, so two masters cannot both start one.
pub(super) struct Tenants(MutexGuard<'static, HashMap<u16, Tenant>>);

impl Tenants {
    /// Locks the registry.
    pub(super) fn lock() -> Tenants {
        static TENANTS: OnceLock<Mutex<HashMap<u16, Tenant>>> = OnceLock::new();
        let map = TENANTS.get_or_init(Default::default);
        Tenants(map.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The running server on `port`, if any.
    pub(super) fn live(&self, port: u16) -> Option<Arc<Server>> {
        self.0
            .get(&port)
            .and_then(|tenant| tenant.server.upgrade())
            .filter(|server| !server.is_stopped())
    }

    /// The running server on `port` for a master that asks for `asked`: `Ok(None)` when no
    /// server runs there, an [`Error::InvalidArgument`] naming each difference when one runs
    /// with another configuration.
    pub(super) fn join(&self, port: u16, asked: &HostedConfig) -> Result<Option<Arc<Server>>> {
        let Some(server) = self.live(port) else {
            return Ok(None);
        };
        let running = &self.0[&port].config;
        let differences = running.differences(asked);
        if differences.is_empty() {
            return Ok(Some(server));
        }
        Err(Error::InvalidArgument(format!(
            "TCPStore(multi_tenant=True): this process already hosts a store server on port \
             {port} with another configuration: {}. Masters that share a port share one server \
             and so one configuration: ask for the same options, or use another port",
            differences.join("; ")
        )))
    }

    /// Records `server`, started with `config`, under its port.
    pub(super) fn register(&mut self, server: &Arc<Server>, config: HostedConfig) {
        self.0.retain(|_, tenant| tenant.server.strong_count() > 0);
        let tenant = Tenant {
            server: Arc::downgrade(server),
            config,
        };
        self.0.insert(server.local_addr().port(), tenant);
    }
}
