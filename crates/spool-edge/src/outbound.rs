//! How Spool reaches out over HTTP, the one way every outbound client
//! does (the model engines, the HTTP channel's client and a node's
//! forwarding, the bus client, the OTLP exporter): a connection with a
//! deadline, TLS with one trust policy, and an HTTP/1.1 handshake.
//!
//! The trust policy: rustls with ring, the public web roots
//! (`webpki-roots`, the same on every machine, no system store to drift),
//! plus the certificates in the PEM file `SSL_CERT_FILE` names (the
//! variable OpenSSL, curl and Python's clients read) for a network whose
//! proxy or private authority signs its own. A file that cannot be read or
//! holds no certificate is an error, never a silent fallback to the web
//! roots alone. HTTP/1.1 by ALPN.
//!
//! PostgreSQL's TLS is not here: it follows libpq's `sslmode` and
//! `sslrootcert` rules (`spool-journal-pg`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// The environment variable naming extra trusted certificates (PEM).
pub const EXTRA_ROOTS_VARIABLE: &str = "SSL_CERT_FILE";

/// How long a connection may take to open: a host that has gone silent
/// (a partition, a machine that is off) is reported, not waited on for the
/// operating system's minutes.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why TLS could not be set up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TrustError {
    /// The extra roots' file could not be read as PEM.
    #[error("{}: {reason}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The extra roots' file holds no certificate rustls can use.
    #[error("{} holds no usable certificate", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// rustls refused the configuration.
    #[error("TLS: {0}")]
    Config(String),
}

/// The TLS client configuration of the trust policy, with the
/// certificates in `extra_roots` trusted beside the web roots: for a
/// caller that read [`EXTRA_ROOTS_VARIABLE`] (or its own setting) itself.
///
/// # Errors
///
/// [`TrustError`] when `extra_roots` cannot be read or holds no
/// certificate.
pub fn client_config(extra_roots: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TrustError> {
    let mut roots =
        rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_roots {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let unreadable = |e: rustls::pki_types::pem::Error| TrustError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let certificates = CertificateDer::pem_file_iter(path)
            .map_err(unreadable)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(unreadable)?;
        let (added, _) = roots.add_parsable_certificates(certificates);
        if added == 0 {
            return Err(TrustError::NoCertificate {
                path: path.to_owned(),
            });
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TrustError::Config(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The trust policy's configuration with the roots [`EXTRA_ROOTS_VARIABLE`]
/// names, built once per process at its first use (a client that never
/// speaks TLS never pays for it).
///
/// # Errors
///
/// As [`client_config`], naming the variable.
pub fn environment_config() -> Result<Arc<rustls::ClientConfig>, TrustError> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, TrustError>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let extra = std::env::var_os(EXTRA_ROOTS_VARIABLE).map(PathBuf::from);
            client_config(extra.as_deref())
        })
        .clone()
}

/// Opens a connection with `connecting`, failing after
/// [`CONNECT_TIMEOUT`] with [`std::io::ErrorKind::TimedOut`].
///
/// # Errors
///
/// The connection's error, or the timeout.
pub async fn connect<S>(
    connecting: impl Future<Output = std::io::Result<S>>,
) -> std::io::Result<S> {
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(connected) => connected,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
        )),
    }
}

/// TLS over `stream` to `host`, trusted by `config`.
///
/// # Errors
///
/// A host that is not a valid name, or the handshake's error (a
/// certificate refused among them).
pub async fn tls<S>(
    stream: S,
    host: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
}

/// An HTTP/1.1 connection over `stream`, its task running until the
/// response it serves (or its body) is done.
///
/// # Errors
///
/// The handshake's error.
pub async fn handshake<S>(stream: S) -> Result<SendRequest<Full<Bytes>>, hyper::Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(target: "spool::outbound", %error, "a client connection closed");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_builds_with_the_web_roots_alone() {
        let config = client_config(None).unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
    }

    #[test]
    fn an_extra_roots_file_without_a_certificate_or_missing_is_an_error() {
        let dir = std::env::temp_dir().join(format!("spool-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert!(matches!(
            client_config(Some(&empty)),
            Err(TrustError::NoCertificate { .. })
        ));
        assert!(matches!(
            client_config(Some(&dir.join("absent.pem"))),
            Err(TrustError::Unreadable { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
