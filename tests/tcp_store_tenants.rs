//! `multi_tenant` masters of one process on one port share one server, and so one configuration
//! (issue 27 item 3): a second master that asks for another token, other limits, another stance
//! on stock torch clients or another metrics address is refused with an error that names what
//! differs, instead of silently getting the first one's.

use std::time::Duration;

use ferrodist::store::Store;
use ferrodist::tcp::auth::AuthToken;
use ferrodist::tcp::codec::Limits;
use ferrodist::tcp::{TcpStore, TcpStoreOptions};
use ferrodist::Error;

const SECRET: &str = "tenant-secret-7f3a";

fn token(text: &str) -> Option<AuthToken> {
    Some(AuthToken::new(text).unwrap())
}

/// Options of a multi-tenant master on `port` (0: a free one).
fn tenant(port: u16) -> TcpStoreOptions {
    TcpStoreOptions {
        port,
        is_master: true,
        multi_tenant: true,
        timeout: Duration::from_secs(10),
        ..TcpStoreOptions::default()
    }
}

/// The first master, with `options` on a free port, and that port.
fn first(options: TcpStoreOptions) -> (TcpStore, u16) {
    let store = TcpStore::new(options).expect("the first master starts");
    let port = store.port();
    (store, port)
}

/// The message of the error a second master with `options` gets; it must be InvalidArgument.
fn refused(options: TcpStoreOptions) -> String {
    match TcpStore::new(options) {
        Err(Error::InvalidArgument(message)) => message,
        Err(other) => panic!("expected InvalidArgument, got {other:?}"),
        Ok(_) => panic!("a second master with another configuration was let share the server"),
    }
}

#[test]
fn same_configuration_shares_the_server() {
    let (a, port) = first(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(0)
    });
    let b = TcpStore::new(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(port)
    })
    .expect("a second master with the same configuration shares the server");
    assert!(std::sync::Arc::ptr_eq(
        a.server().unwrap(),
        b.server().unwrap()
    ));
    b.set("k", b"v").unwrap();
    assert_eq!(a.get("k").unwrap(), b"v");
}

#[test]
fn another_token_is_refused_without_showing_either() {
    let (_a, port) = first(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(0)
    });
    let message = refused(TcpStoreOptions {
        auth_token: token("another-secret-91c2"),
        ..tenant(port)
    });
    assert!(message.contains("auth token differs"), "{message}");
    assert!(message.contains(&port.to_string()), "{message}");
    assert!(
        !message.contains(SECRET) && !message.contains("another-secret"),
        "{message}"
    );
}

#[test]
fn a_token_on_one_side_only_is_refused_both_ways() {
    let (_a, port) = first(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(0)
    });
    let message = refused(tenant(port));
    assert!(
        message.contains("one has a token, the other none"),
        "{message}"
    );
    assert!(!message.contains(SECRET), "{message}");

    let (_c, port) = first(tenant(0));
    let message = refused(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(port)
    });
    assert!(
        message.contains("one has a token, the other none"),
        "{message}"
    );
    assert!(!message.contains(SECRET), "{message}");
}

#[test]
fn other_limits_are_refused_naming_the_limit() {
    let (_a, port) = first(tenant(0));
    let message = refused(TcpStoreOptions {
        limits: Limits {
            max_value_bytes: 1024,
            ..Limits::default()
        },
        ..tenant(port)
    });
    assert!(message.contains("max_value_bytes"), "{message}");
    assert!(message.contains("1024"), "{message}");
    assert!(!message.contains("max_key_bytes"), "{message}");
}

#[test]
fn another_stance_on_torch_clients_is_refused() {
    let (_a, port) = first(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(0)
    });
    let message = refused(TcpStoreOptions {
        auth_token: token(SECRET),
        allow_unauthenticated_torch_clients: true,
        ..tenant(port)
    });
    assert!(
        message.contains("allow_unauthenticated_torch_clients differs"),
        "{message}"
    );
}

#[test]
fn another_metrics_address_is_refused() {
    let (_a, port) = first(TcpStoreOptions {
        metrics_addr: Some("127.0.0.1:0".into()),
        ..tenant(0)
    });
    let message = refused(tenant(port));
    assert!(message.contains("metrics address differs"), "{message}");
    assert!(message.contains("127.0.0.1:0"), "{message}");
}

#[test]
fn every_difference_is_named_at_once() {
    let (_a, port) = first(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(0)
    });
    let message = refused(TcpStoreOptions {
        auth_token: token("another-secret-91c2"),
        limits: Limits {
            max_keys: 7,
            ..Limits::default()
        },
        metrics_addr: Some("127.0.0.1:0".into()),
        ..tenant(port)
    });
    for part in ["auth token differs", "max_keys", "metrics address differs"] {
        assert!(message.contains(part), "{part} missing: {message}");
    }
}

#[test]
fn a_refused_master_leaves_the_running_server_alone() {
    let (a, port) = first(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(0)
    });
    a.set("before", b"1").unwrap();
    refused(tenant(port));
    assert_eq!(a.get("before").unwrap(), b"1");
    // A master that asks for the same configuration still joins it.
    let b = TcpStore::new(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(port)
    })
    .unwrap();
    assert_eq!(b.get("before").unwrap(), b"1");
}

#[test]
fn a_stopped_server_is_replaced_by_one_with_the_new_configuration() {
    let (a, port) = first(TcpStoreOptions {
        auth_token: token(SECRET),
        ..tenant(0)
    });
    a.stop_server();
    drop(a);
    let b = TcpStore::new(tenant(port)).expect("a new server, with no token, on the freed port");
    b.set("k", b"v").unwrap();
    assert_eq!(b.get("k").unwrap(), b"v");
}
