//! TLS to the server as a URL's `sslmode` asks, read as libpq reads it:
//! the test server (`cargo xtask pg`) offers TLS with a certificate for
//! `localhost` signed by itself, which `JOURNAL_PG_CA` names.

use spool_journal::conformance::{created, run};
use spool_journal::{Journal, Seq};
use spool_journal_pg::{Options, PgJournal};

/// The server's URL and the file of the root its certificate chains to,
/// or `None` (after saying so) to skip.
fn tls_server() -> Option<(String, String)> {
    let url = crate::server()?;
    match std::env::var("JOURNAL_PG_CA") {
        Ok(ca) if !ca.is_empty() => Some((url, ca)),
        _ => {
            assert!(
                std::env::var_os("SPOOL_REQUIRE_PG").is_none(),
                "SPOOL_REQUIRE_PG is set but JOURNAL_PG_CA is not: `cargo xtask pg` sets both"
            );
            eprintln!("skipped: JOURNAL_PG_CA is not set (the server's TLS root)");
            None
        }
    }
}

/// `url` with its host named `localhost` (what the certificate is for),
/// still reaching the loopback address the server listens on.
fn as_localhost(url: &str) -> String {
    let joined = if url.contains('?') { '&' } else { '?' };
    format!(
        "{}{joined}hostaddr=127.0.0.1",
        url.replace("@127.0.0.1:", "@localhost:")
    )
}

/// Whether the server sees the session named `application` encrypted.
async fn encrypted(url: &str, application: &str) -> bool {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty(), "a session named {application} is open");
    rows.iter().all(|row| row.get::<_, bool>(0))
}

/// A journal at `url` (in a schema of its own, its sessions named
/// `application`), or why it could not connect.
async fn open(url: &str, query: &str, application: &str) -> Result<PgJournal, String> {
    let options = Options {
        schema: Some(crate::fresh_schema()),
        ..Options::default()
    };
    let url = format!("{url}&application_name={application}{query}");
    PgJournal::connect(&url, options).await.map_err(|e| {
        // The whole chain, as `spool` prints it: the handshake's error
        // says what was wrong with the certificate.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message = format!("{message}: {cause}");
            source = cause.source();
        }
        message
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_connects_over_tls_to_a_server_whose_certificate_names_its_host() {
    let Some((url, ca)) = tls_server() else {
        return;
    };
    let journal = open(
        &as_localhost(&url),
        &format!("&sslmode=verify-full&sslrootcert={ca}"),
        "tls_full",
    )
    .await
    .unwrap();
    let r = run("over-tls");
    journal.append(&r, Seq(0), vec![created()]).await.unwrap();
    assert_eq!(journal.read(&r, Seq(0)).await.unwrap().len(), 1);
    assert!(encrypted(&url, "tls_full").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_for_another_host_where_verify_ca_accepts_it() {
    let Some((url, ca)) = tls_server() else {
        return;
    };
    // The URL names 127.0.0.1; the certificate is for `localhost`.
    let plain = format!("{url}?connect_timeout=10");
    let refused = open(
        &plain,
        &format!("&sslmode=verify-full&sslrootcert={ca}"),
        "tls_wrong_name",
    )
    .await
    .map(drop)
    .expect_err("a certificate for another name is refused");
    assert!(refused.contains("certificate"), "{refused}");
    let _open = open(
        &plain,
        &format!("&sslmode=verify-ca&sslrootcert={ca}"),
        "tls_ca",
    )
    .await
    .unwrap();
    assert!(encrypted(&url, "tls_ca").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_no_trusted_root_signed() {
    let Some((url, _)) = tls_server() else {
        return;
    };
    // Without `sslrootcert` the roots are the webpki ones, and no public
    // authority signed the test server's certificate.
    let refused = open(&as_localhost(&url), "&sslmode=verify-full", "tls_untrusted")
        .await
        .map(drop)
        .expect_err("a certificate no trusted root signed is refused");
    assert!(refused.contains("certificate"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_without_sslmode_encrypts_when_the_server_offers_tls_and_disable_does_not() {
    let Some((url, _)) = tls_server() else {
        return;
    };
    let plain = format!("{url}?connect_timeout=10");
    let _prefer = open(&plain, "", "tls_prefer").await.unwrap();
    assert!(encrypted(&url, "tls_prefer").await);
    let _disable = open(&plain, "&sslmode=disable", "tls_disable")
        .await
        .unwrap();
    assert!(!encrypted(&url, "tls_disable").await);
}

/// The tests' certificates (the server's, and a client's for the role
/// `spool_cert`, which the test server admits only with it).
const TLS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../spool-engines/tests/tls");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_in_sslcert_and_sslkey_admits_a_role_the_server_admits_only_with_one()
{
    let Some((url, ca)) = tls_server() else {
        return;
    };
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    // Tests run side by side: a role another test made is fine.
    admin
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE spool_cert LOGIN SUPERUSER; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
        )
        .await
        .unwrap();
    let as_role = as_localhost(&url).replace("://postgres@", "://spool_cert@");
    let verified = format!("&sslmode=verify-full&sslrootcert={ca}");
    let _journal = open(
        &as_role,
        &format!("{verified}&sslcert={TLS_DIR}/client.pem&sslkey={TLS_DIR}/client.key"),
        "tls_client_cert",
    )
    .await
    .unwrap();
    let shown = admin
        .query_one(
            "SELECT s.client_dn FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'tls_client_cert' LIMIT 1",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        shown.get::<_, Option<String>>(0).as_deref(),
        Some("/CN=spool_cert"),
        "the server saw the client's certificate"
    );
    let refused = open(&as_role, &verified, "tls_no_client_cert")
        .await
        .map(drop)
        .expect_err("without the certificate the role is refused");
    assert!(refused.contains("certificate"), "{refused}");
}
