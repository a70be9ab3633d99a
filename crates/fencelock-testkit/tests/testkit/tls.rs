//! TLS servers of the testkit: `RedisServer` with `RedisConfig::with_tls`,
//! reached by redis-rs over rustls (ring), with good and bad certificates.

use std::time::Duration;

use fencelock_testkit::process::wait_process_gone;
use fencelock_testkit::{
    CertKey, ClientAuth, RedisConfig, RedisServer, ServerCert, TestCerts, TlsConfig,
};
use redis::RedisResult;

const TIMEOUT: Duration = Duration::from_secs(2);

fn tls_server(tls: TlsConfig) -> RedisServer {
    RedisServer::start_with(RedisConfig::default().with_tls(tls))
}

/// A client of `server`'s `rediss://` URL that trusts `ca` and presents
/// `client`, if any.
fn client(server: &RedisServer, ca: &str, client: Option<&CertKey>) -> redis::Client {
    fencelock_testkit::tls::install_crypto_provider();
    redis::Client::build_with_tls(server.url(), TestCerts::redis_tls(ca, client))
        .expect("a redis-rs TLS client")
}

fn ping(client: &redis::Client) -> RedisResult<String> {
    let mut con = client.get_connection_with_timeout(TIMEOUT)?;
    con.set_read_timeout(Some(TIMEOUT))?;
    con.set_write_timeout(Some(TIMEOUT))?;
    redis::cmd("PING").query(&mut con)
}

fn certs(server: &RedisServer) -> &TestCerts {
    server.tls_certs().expect("a TLS server has certificates")
}

#[test]
fn tls_server_listens_only_on_tls_and_writes_its_pem_files() {
    let server = tls_server(TlsConfig::default());
    assert!(server.is_tls());
    assert_eq!(
        server.url(),
        format!("rediss://127.0.0.1:{}/", server.port())
    );
    let files = server.tls_files().expect("TLS files");
    for path in [
        &files.ca_cert,
        &files.client_cert,
        &files.client_key,
        &files.server_cert,
        &files.server_key,
        &files.other_ca_cert,
    ] {
        assert!(path.starts_with(server.dir()), "{}", path.display());
        assert!(path.is_file(), "{}", path.display());
    }
    let ca = std::fs::read_to_string(&files.ca_cert).expect("read ca.crt");
    assert_eq!(ca, certs(&server).ca.cert_pem);

    // The testkit's own admin commands work over TLS.
    assert_eq!(server.query::<String>(&["PING"]), "PONG");
    server.cmd(&["SET", "k", "v"]);
    assert_eq!(
        server.query::<Option<String>>(&["GET", "k"]),
        Some("v".to_owned())
    );
    let port: Vec<String> = server.query(&["CONFIG", "GET", "port"]);
    assert_eq!(port, ["port", "0"], "no plaintext listener");
    assert_eq!(ping(&server.client()).expect("ping"), "PONG");
}

#[test]
fn tls_connect_with_the_right_ca_and_refused_with_another() {
    let server = tls_server(TlsConfig::default());
    let good = client(&server, &certs(&server).ca.cert_pem, None);
    assert_eq!(ping(&good).expect("right CA"), "PONG");

    let wrong = client(&server, &certs(&server).other_ca.cert_pem, None);
    let error = ping(&wrong).expect_err("a server signed by an untrusted CA");
    assert!(
        error.to_string().contains("UnknownIssuer"),
        "unexpected error: {error}"
    );
}

#[test]
fn tls_bad_server_leaves_are_refused() {
    let certs = TestCerts::generate();
    for (choice, expected) in [
        (ServerCert::OtherCa, "UnknownIssuer"),
        (ServerCert::Expired, "expired"),
        (ServerCert::WrongName, "not valid for name"),
    ] {
        // The testkit itself still reaches the server (its admin connection
        // does not check the leaf).
        let server = tls_server(TlsConfig::with_certs(certs.clone()).with_server_cert(choice));
        assert_eq!(server.query::<String>(&["PING"]), "PONG");
        let strict = client(&server, &certs.ca.cert_pem, None);
        let error = ping(&strict).expect_err("a bad server leaf must be refused");
        assert!(
            error.to_string().contains(expected),
            "{choice:?}: expected {expected}, got: {error}"
        );
    }
}

#[test]
fn tls_plaintext_to_a_tls_port_fails() {
    let server = tls_server(TlsConfig::default());
    let plain = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port()))
        .expect("plaintext client");
    assert!(
        ping(&plain).is_err(),
        "plaintext PING answered on a TLS port"
    );
    assert_eq!(server.query::<String>(&["PING"]), "PONG");
}

#[test]
fn tls_mutual_auth_needs_a_client_certificate_from_the_ca() {
    let server = tls_server(TlsConfig::default().with_client_auth(ClientAuth::Required));
    let certs = certs(&server);
    let ca = &certs.ca.cert_pem;

    assert!(
        ping(&client(&server, ca, None)).is_err(),
        "a client without a certificate was accepted"
    );
    assert!(
        ping(&client(&server, ca, Some(&certs.client_other_ca))).is_err(),
        "a client certificate from another CA was accepted"
    );
    assert!(
        ping(&client(&server, ca, Some(&certs.client_expired))).is_err(),
        "an expired client certificate was accepted"
    );
    assert_eq!(
        ping(&client(&server, ca, Some(&certs.client))).expect("mutual TLS"),
        "PONG"
    );
    assert_eq!(ping(&server.client()).expect("mutual TLS"), "PONG");
    assert_eq!(server.query::<String>(&["PING"]), "PONG");
}

#[test]
fn tls_optional_client_auth_accepts_both() {
    let server = tls_server(TlsConfig::default().with_client_auth(ClientAuth::Optional));
    let certs = certs(&server);
    assert_eq!(
        ping(&client(&server, &certs.ca.cert_pem, None)).expect("no client cert"),
        "PONG"
    );
    assert_eq!(
        ping(&client(&server, &certs.ca.cert_pem, Some(&certs.client))).expect("client cert"),
        "PONG"
    );
}

#[test]
fn tls_server_with_password_restarts_on_tls() {
    let mut server = RedisServer::start_with(
        RedisConfig::default()
            .with_password("s3cret")
            .with_tls(TlsConfig::default()),
    );
    assert_eq!(
        server.url(),
        format!("rediss://:s3cret@127.0.0.1:{}/", server.port())
    );
    assert_eq!(ping(&server.client()).expect("ping"), "PONG");
    let old_pid = server.pid();
    server.restart();
    assert!(wait_process_gone(old_pid, Duration::from_secs(5)));
    assert_eq!(ping(&server.client()).expect("ping after restart"), "PONG");

    let without_password = redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{}/", server.port()),
        TestCerts::redis_tls(&certs(&server).ca.cert_pem, None),
    )
    .expect("client");
    let error = ping(&without_password).expect_err("NOAUTH expected");
    assert!(error.to_string().contains("AUTH"), "{error}");
}

#[tokio::test]
async fn tls_async_client_connects() {
    let server = tls_server(TlsConfig::default().with_client_auth(ClientAuth::Required));
    let mut con = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("async TLS connection");
    let pong: String = redis::cmd("PING")
        .query_async(&mut con)
        .await
        .expect("PING");
    assert_eq!(pong, "PONG");
}
