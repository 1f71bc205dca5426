//! TLS served by the server itself: a certificate chain and its key from
//! PEM files, read again when either file changes, so a renewed
//! certificate (certbot, cert-manager, a rotated secret) is served from
//! the next connection on without a restart.
//!
//! The files are checked (two `stat` calls, no read) at each handshake,
//! which costs far less than the handshake itself. A renewal caught
//! halfway (the new certificate beside the old key) does not load; the
//! certificate in use stays until both files agree, and each failed load
//! is logged once per change of the files.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// A certificate and key that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no PEM item of its kind.
    #[error("{path}: {cause}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        cause: String,
    },
    /// The key is not the certificate's, or of a kind rustls cannot sign
    /// with.
    #[error("{key} does not go with {cert}: {cause}")]
    Mismatch {
        /// The certificate chain's file.
        cert: PathBuf,
        /// The key's file.
        key: PathBuf,
        /// rustls's reason.
        cause: String,
    },
}

/// A server's TLS identity: the chain in `cert` (the server's certificate
/// first, then its intermediates) and the private key in `key`, both PEM.
#[derive(Debug)]
pub struct CertificateFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    /// The files' stamps when last read.
    seen: Stamp,
}

/// What tells that a file changed: its inode (a renewal that renames a
/// new file into place), modification time and length (one that writes
/// in place). `None` for a file that cannot be inspected just now.
type Stamp = [Option<(u64, SystemTime, u64)>; 2];

impl CertificateFiles {
    /// Reads the chain and key, and checks that they go together.
    ///
    /// # Errors
    ///
    /// [`TlsError`] naming the file, or the pair, that cannot be served.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let seen = stamp(cert, key);
        let loaded = read(cert, key, &provider)?;
        Ok(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            current: Mutex::new(Loaded {
                key: Arc::new(loaded),
                seen,
            }),
        })
    }

    /// A server configuration serving these files: TLS 1.2 and 1.3 with
    /// rustls's safe defaults, HTTP/1.1 by ALPN, no client certificates.
    ///
    /// # Errors
    ///
    /// Only if the crypto provider refuses its own default versions.
    pub fn server_config(self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::clone(&self.provider);
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::File {
                path: self.cert.clone(),
                cause: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(self));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The certificate to present now: the files' contents, read again if
    /// they changed since last read and they load.
    fn current(&self) -> Arc<CertifiedKey> {
        let now = stamp(&self.cert, &self.key);
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if now != current.seen {
            current.seen = now;
            match read(&self.cert, &self.key, &self.provider) {
                Ok(renewed) => {
                    tracing::info!(target: "spool::http", cert = %self.cert.display(), "serving the renewed certificate");
                    current.key = Arc::new(renewed);
                }
                Err(error) => {
                    tracing::warn!(target: "spool::http", %error, "the certificate files changed but do not load; still serving the previous certificate");
                }
            }
        }
        Arc::clone(&current.key)
    }
}

impl ResolvesServerCert for CertificateFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let of = |path: &Path| {
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.ino(), meta.modified().ok()?, meta.len()))
    };
    [of(cert), of(key)]
}

fn read(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let file = |path: &Path, cause: String| TlsError::File {
        path: path.to_owned(),
        cause,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file(cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file(cert, "holds no PEM certificate".into()));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        file(
            key,
            match e {
                rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM private key".into(),
                other => other.to_string(),
            },
        )
    })?;
    CertifiedKey::from_der(chain, private, provider).map_err(|e| TlsError::Mismatch {
        cert: cert.to_owned(),
        key: key.to_owned(),
        cause: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TLS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../spool-engines/tests/tls");

    fn test_file(name: &str) -> PathBuf {
        Path::new(TLS_DIR).join(name)
    }

    #[test]
    fn a_certificate_and_its_own_key_load() {
        let files =
            CertificateFiles::load(&test_file("localhost.pem"), &test_file("localhost.key"));
        assert!(files.is_ok(), "{files:?}");
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_naming_both_files() {
        let refused =
            CertificateFiles::load(&test_file("localhost.pem"), &test_file("renewed.key"))
                .unwrap_err();
        assert!(matches!(refused, TlsError::Mismatch { .. }), "{refused:?}");
        let said = refused.to_string();
        assert!(
            said.contains("renewed.key does not go with") && said.contains("localhost.pem"),
            "{said}"
        );
    }

    #[test]
    fn a_missing_file_or_one_without_pem_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let refused = CertificateFiles::load(&missing, &test_file("localhost.key")).unwrap_err();
        assert!(refused.to_string().contains("missing.pem"), "{refused}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem\n").unwrap();
        let refused = CertificateFiles::load(&empty, &test_file("localhost.key")).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("empty.pem: holds no PEM certificate"),
            "{refused}"
        );
        let refused = CertificateFiles::load(&test_file("localhost.pem"), &empty).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("empty.pem: holds no PEM private key"),
            "{refused}"
        );
    }
}
