//! TLS to the database: a URL's `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey` read as libpq reads them (so a URL that works with `psql`
//! works here), over rustls.
//!
//! tokio-postgres knows only `disable`, `prefer` and `require`, and
//! verifies nothing itself; the certificate checks each mode asks for
//! are made here, in the rustls configuration the connections use.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use spool_journal::store::JournalError;
use tokio_postgres::Config;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How much a connection checks of the server's certificate: libpq's
/// `sslmode` values, from least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, its certificate not checked
    /// (libpq's default: encrypted if possible, not authenticated).
    Prefer,
    /// TLS or no connection, its certificate not checked (unless a root
    /// certificate is given, which makes it `VerifyCa`, as in libpq).
    Require,
    /// TLS, the certificate signed by a trusted root; any host name.
    VerifyCa,
    /// TLS, the certificate signed by a trusted root and naming the host.
    VerifyFull,
}

/// A URL read: the connection settings, and the TLS every connection
/// made with them uses.
pub(crate) fn parse(url: &str) -> Result<(Config, MakeRustlsConnect), JournalError> {
    let refused = |why: String| JournalError::storage(format!("`{}`: {why}", crate::redact(url)));
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut mode = Mode::Prefer;
    let mut root_file = None;
    let (mut cert_file, mut key_file) = (None, None);
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| refused(format!("the value of `{key}` is not UTF-8")))?;
        match key {
            "sslmode" => {
                mode = match &*decoded {
                    "disable" => Mode::Disable,
                    "prefer" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    "allow" => {
                        return Err(refused(
                            "`sslmode=allow` is not supported: use `disable` or `prefer`".into(),
                        ));
                    }
                    other => {
                        return Err(refused(format!(
                            "`sslmode={other}` is not one of disable, prefer, require, verify-ca, verify-full"
                        )));
                    }
                };
            }
            "sslrootcert" => root_file = Some(decoded.into_owned()),
            "sslcert" => cert_file = Some(decoded.into_owned()),
            "sslkey" => key_file = Some(decoded.into_owned()),
            "sslpassword" => {
                return Err(refused(
                    "`sslpassword`: encrypted client keys are not supported; give `sslkey` an unencrypted key (`openssl pkey -in KEY -out KEY.plain`)".into(),
                ));
            }
            _ => rest.push(pair),
        }
    }
    // libpq falls back to `~/.postgresql/postgresql.{crt,key}`; here a
    // client certificate is used only when the URL names both files.
    let identity = match (cert_file, key_file) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            Some(identity_from(Path::new(&cert), Path::new(&key)).map_err(&refused)?)
        }
        (Some(_), None) => {
            return Err(refused(
                "`sslcert` needs `sslkey`, the certificate's private key".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(refused(
                "`sslkey` needs `sslcert`, the key's certificate".into(),
            ));
        }
    };
    if mode == Mode::Require && root_file.is_some() {
        mode = Mode::VerifyCa;
    }
    let plain = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config: Config = plain.parse().map_err(|e: tokio_postgres::Error| {
        // The cause (an unknown option, a bad value) is the error's source.
        let cause = std::error::Error::source(&e).map_or_else(String::new, |c| format!(": {c}"));
        refused(format!(
            "not a PostgreSQL URL that Spool can use: {e}{cause}"
        ))
    })?;
    config.ssl_mode(match mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
    });
    let roots = match root_file.as_deref() {
        // libpq's word for the system's store; ours is the webpki roots,
        // as for the model providers.
        None | Some("system") => {
            RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned())
        }
        Some(path) => roots_from(Path::new(path)).map_err(refused)?,
    };
    let tls = client_config(mode, roots, identity)?;
    Ok((config, MakeRustlsConnect::new(tls)))
}

/// A client certificate's chain and its private key, from PEM files.
type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn identity_from(cert: &Path, key: &Path) -> Result<Identity, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("sslcert {}: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("sslcert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "sslcert {} holds no PEM certificate",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("sslkey {} holds no PEM private key", key.display())
        }
        other => format!("sslkey {}: {other}", key.display()),
    })?;
    Ok((chain, private))
}

/// The certificates in a PEM file, as the only roots trusted.
fn roots_from(path: &Path) -> Result<RootCertStore, String> {
    let shown = path.display();
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("sslrootcert {shown}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("sslrootcert {shown}: {e}"))?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certificates);
    if added == 0 {
        return Err(format!("sslrootcert {shown} holds no usable certificate"));
    }
    Ok(roots)
}

fn client_config(
    mode: Mode,
    roots: RootCertStore,
    identity: Option<Identity>,
) -> Result<rustls::ClientConfig, JournalError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls_error = |e: rustls::Error| JournalError::storage(format!("TLS set-up: {e}"));
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        Mode::Disable | Mode::Prefer | Mode::Require => Arc::new(Verifier {
            chain: None,
            algorithms,
        }),
        Mode::VerifyCa => Arc::new(Verifier {
            chain: Some(webpki(roots, &provider)?),
            algorithms,
        }),
        Mode::VerifyFull => webpki(roots, &provider)?,
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match identity {
        // rustls checks that the key is the certificate's.
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| JournalError::storage(format!("sslkey does not go with sslcert: {e}")))?,
        None => builder.with_no_client_auth(),
    };
    // What libpq 17 sends, and what a server expects on a direct TLS
    // connection.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(config)
}

fn webpki(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, JournalError> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| JournalError::storage(format!("TLS set-up: {e}")))
}

/// What `prefer`, `require` (no chain checked) and `verify-ca` (a chain
/// to a trusted root, any name) check; `verify-full` uses rustls's own
/// verifier. The handshake's signatures are always checked: the server
/// holds the key of the certificate it sent.
#[derive(Debug)]
struct Verifier {
    /// The chain's verifier, for `verify-ca`: it checks the name after
    /// the chain, so a name mismatch means the chain held.
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(url: &str) -> String {
        parse(url).map(drop).expect_err("refused").to_string()
    }

    #[test]
    fn libpq_modes_map_onto_the_connections_tls_mode() {
        for (query, expected) in [
            ("", SslMode::Prefer),
            ("?sslmode=disable", SslMode::Disable),
            ("?sslmode=prefer", SslMode::Prefer),
            ("?sslmode=require", SslMode::Require),
            ("?sslmode=verify-ca", SslMode::Require),
            ("?sslmode=verify-full&connect_timeout=5", SslMode::Require),
        ] {
            let (config, _) = parse(&format!("postgres://u:secret@db:5432/x{query}")).unwrap();
            assert_eq!(config.get_ssl_mode(), expected, "{query}");
        }
        // The options Spool reads are not passed on; the others are.
        let (config, _) =
            parse("postgres://db/x?sslmode=verify-full&sslrootcert=system&connect_timeout=5")
                .unwrap();
        assert_eq!(
            config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(5))
        );
    }

    #[test]
    fn modes_and_options_it_cannot_honour_are_refused_by_name_without_the_password() {
        let allow = refusal("postgres://u:secret@db/x?sslmode=allow");
        assert!(
            allow.contains("`sslmode=allow` is not supported"),
            "{allow}"
        );
        assert!(!allow.contains("secret"), "{allow}");
        let unknown = refusal("postgres://db/x?sslmode=verify");
        assert!(
            unknown.contains("`sslmode=verify` is not one of"),
            "{unknown}"
        );
        let password = refusal("postgres://db/x?sslcert=/c.pem&sslkey=/c.key&sslpassword=p");
        assert!(
            password.contains("encrypted client keys are not supported"),
            "{password}"
        );
        let other = refusal("postgres://db/x?sslcrl=/tmp/crl.pem");
        assert!(other.contains("unknown option `sslcrl`"), "{other}");
    }

    const TLS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../spool-engines/tests/tls");

    #[test]
    fn a_client_certificate_needs_its_key_and_a_key_of_another_certificate_is_refused() {
        let alone = refusal(&format!("postgres://db/x?sslcert={TLS_DIR}/client.pem"));
        assert!(alone.contains("`sslcert` needs `sslkey`"), "{alone}");
        let alone = refusal(&format!("postgres://db/x?sslkey={TLS_DIR}/client.key"));
        assert!(alone.contains("`sslkey` needs `sslcert`"), "{alone}");
        let other = refusal(&format!(
            "postgres://db/x?sslcert={TLS_DIR}/client.pem&sslkey={TLS_DIR}/localhost.key"
        ));
        assert!(other.contains("sslkey does not go with sslcert"), "{other}");
        let missing = refusal(&format!(
            "postgres://db/x?sslcert=/nonexistent/c.pem&sslkey={TLS_DIR}/client.key"
        ));
        assert!(missing.contains("sslcert /nonexistent/c.pem"), "{missing}");
        assert!(
            parse(&format!(
                "postgres://db/x?sslcert={TLS_DIR}/client.pem&sslkey={TLS_DIR}/client.key"
            ))
            .is_ok(),
            "a certificate with its own key is taken"
        );
    }

    #[test]
    fn a_root_file_that_is_missing_or_holds_no_certificate_is_refused() {
        let missing =
            refusal("postgres://db/x?sslmode=verify-full&sslrootcert=/nonexistent/root.pem");
        assert!(
            missing.contains("sslrootcert /nonexistent/root.pem"),
            "{missing}"
        );
        let dir = std::env::temp_dir().join(format!("spool-pg-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let url = format!(
            "postgres://db/x?sslmode=verify-full&sslrootcert={}",
            empty.display()
        );
        let refused = refusal(&url);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(refused.contains("holds no usable certificate"), "{refused}");
    }
}
