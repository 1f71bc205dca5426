//! The PostgreSQL store against a real server: the conformance suite, and
//! what sharing one database between processes adds.
//!
//! The server is named by `JOURNAL_PG_URL` (`cargo xtask ci` starts a
//! throwaway one and sets it). Without it these tests say so and pass,
//! unless `SPOOL_REQUIRE_PG` is set, as CI sets it: there a missing server
//! fails them.
#![allow(clippy::unwrap_used)]
#![allow(clippy::print_stderr, reason = "a skipped test says why")]

mod cluster;
mod conformance;
mod shared;
mod tls;

use std::sync::Arc;

use spool_journal_pg::{Options, PgJournal};

/// The test server's URL, or `None` (after saying so) to skip.
pub(crate) fn server() -> Option<String> {
    match std::env::var("JOURNAL_PG_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var_os("SPOOL_REQUIRE_PG").is_none(),
                "SPOOL_REQUIRE_PG is set but JOURNAL_PG_URL is not: start PostgreSQL with `cargo xtask pg`"
            );
            eprintln!(
                "skipped: JOURNAL_PG_URL is not set (`cargo xtask pg -- cargo nextest run -p spool-journal-pg` runs it)"
            );
            None
        }
    }
}

/// A schema no other test uses.
pub(crate) fn fresh_schema() -> String {
    format!("t_{:016x}", fastrand::u64(..))
}

/// A database of its own on the test server, for a test that does what
/// would disturb others sharing one (cutting every connection).
pub(crate) async fn fresh_database(url: &str) -> String {
    let name = format!("d_{:016x}", fastrand::u64(..));
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').unwrap();
    format!("{base}/{name}")
}

/// A journal in a schema of its own.
pub(crate) async fn journal(url: &str, schema: &str) -> Arc<PgJournal> {
    let options = Options {
        schema: Some(schema.to_owned()),
        ..Options::default()
    };
    Arc::new(PgJournal::connect(url, options).await.unwrap())
}
