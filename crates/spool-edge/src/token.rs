//! The built-in authenticator: a file of named bearer tokens, stored as
//! SHA-256 hashes, one `name sha256:<hex>` per line, optionally followed by
//! scopes: `admin` (the principal then carries the attribute `admin =
//! "true"`, which lets it reach every run when runs belong to their
//! creators) and `trigger` (`trigger = "true"`: it may trigger schedules).
//! The file must not be readable by others. A presented token is hashed and compared with every
//! entry in constant time, so neither timing nor the file reveals a token.
//!
//! `spool token new NAME` prints a fresh token once and appends its hash;
//! `spool token list` shows names, scopes and fingerprints (a prefix of the
//! stored hash, never a token); `spool token revoke NAME` removes a line.
//! A served file is read again when it changes ([`TokenFile::watch`]):
//! a revoked token is refused from the next request on, and the streams
//! and WebSockets it opened end (see [`Authenticator::changes`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use spool_journal::Principal;
use spool_runtime::{AuthError, Authenticator, BoxFuture, Credentials};

/// A token file, loaded. Clones share it: a reload is seen by all.
#[derive(Clone)]
pub struct TokenFile {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// Replaced whole when the file is read again.
    entries: RwLock<Vec<Entry>>,
    /// What the file looked like when it was last read.
    stamp: RwLock<Option<Stamp>>,
    /// Counts the reloads: sessions check their credentials again on each.
    changes: tokio::sync::watch::Sender<u64>,
}

/// A file's identity and last change, to notice it was rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    inode: u64,
    length: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            inode: meta.ino(),
            length: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// What `spool token list` shows of one token: never the token, nor the
/// whole hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenInfo {
    /// The token's name (its principal's id).
    pub name: String,
    /// Its scopes (of [`SCOPES`]).
    pub scopes: Vec<&'static str>,
    /// `sha256:` and the first 12 hex digits of the stored hash: enough to
    /// tell two tokens apart, too little to search for the token.
    pub fingerprint: String,
}

/// How often a served token file is checked for changes: a revocation
/// takes effect within this, plus the time to re-check open sessions.
pub const RELOAD_PERIOD: Duration = Duration::from_secs(1);

/// One token: its name, its hash, and its scopes (of [`SCOPES`]).
#[derive(Clone)]
struct Entry {
    name: String,
    hash: [u8; 32],
    scopes: Vec<&'static str>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: hashes stay out of logs too.
        let entries = self
            .inner
            .entries
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        f.debug_struct("TokenFile")
            .field("path", &self.inner.path)
            .field("names", &names)
            .finish()
    }
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenFileError {
    /// It could not be read or written.
    #[error("token file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Its group or others have some access to it.
    #[error(
        "token file {path} has mode {mode:04o}: its group or others can {what}; run `chmod 600` on it"
    )]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// What they can do (`read`, `write`, `execute`, joined).
        what: String,
    },
    /// It holds no token, so it would lock every client out.
    #[error("token file {0} holds no token: make one with `spool token new NAME --token-file {0}`")]
    Empty(PathBuf),
    /// A line is not `name sha256:<64 hex>`, optionally with `admin`.
    #[error(
        "token file {path}, line {line}: expected `name sha256:<64 hex digits>`, optionally followed by scopes (`admin`, `trigger`), each once"
    )]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
    },
    /// A name is taken, or not a plain name.
    #[error("token name `{0}` is taken or invalid (use letters, digits, `.`, `_`, `-`)")]
    BadName(String),
}

impl TokenFile {
    /// Loads a token file.
    ///
    /// # Errors
    ///
    /// When it cannot be read, its group or others have any access to it,
    /// a line is malformed, or it holds no token.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let stamp = Stamp::of(path);
        let entries = Self::entries(path)?;
        if entries.is_empty() {
            return Err(TokenFileError::Empty(path.to_owned()));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                entries: RwLock::new(entries),
                stamp: RwLock::new(stamp),
                changes: tokio::sync::watch::channel(0).0,
            }),
        })
    }

    /// Reads the file again when it changed since it was last read, and
    /// says whether it did. A file emptied of tokens is taken as it is
    /// (every token revoked: every caller is refused).
    ///
    /// # Errors
    ///
    /// When the changed file cannot be read, is open to others or is
    /// malformed: the tokens read before stay in force.
    pub fn reload(&self) -> Result<bool, TokenFileError> {
        let inner = &self.inner;
        let stamp = Stamp::of(&inner.path);
        if *inner.stamp.read().unwrap_or_else(PoisonError::into_inner) == stamp {
            return Ok(false);
        }
        let entries = Self::entries(&inner.path)?;
        *inner
            .entries
            .write()
            .unwrap_or_else(PoisonError::into_inner) = entries;
        *inner.stamp.write().unwrap_or_else(PoisonError::into_inner) = stamp;
        inner.changes.send_modify(|n| *n += 1);
        Ok(true)
    }

    /// Reads the file again every `period` while the returned task runs
    /// (it stops once every clone of this file is dropped). A file that
    /// cannot be read keeps the tokens read before, and says why in the
    /// log once per change.
    pub fn watch(&self, period: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut said: Option<Option<Stamp>> = None;
            loop {
                tokio::time::sleep(period).await;
                // The file's users are gone: so is the watch.
                let Some(inner) = weak.upgrade() else { return };
                let file = Self { inner };
                match file.reload() {
                    Ok(true) => {
                        let count = file
                            .inner
                            .entries
                            .read()
                            .unwrap_or_else(PoisonError::into_inner)
                            .len();
                        tracing::info!(target: "spool::http", path = %file.inner.path.display(), tokens = count, "the token file was read again");
                    }
                    Ok(false) => {}
                    Err(error) => {
                        let now = Stamp::of(&file.inner.path);
                        if said != Some(now) {
                            tracing::error!(target: "spool::http", %error, "the token file changed and cannot be used; the tokens read before stay in force");
                            said = Some(now);
                        }
                    }
                }
            }
        })
    }

    /// The tokens in the file at `path`: names, scopes and fingerprints.
    ///
    /// # Errors
    ///
    /// When it cannot be read, is open to others, or is malformed.
    pub fn list(path: &Path) -> Result<Vec<TokenInfo>, TokenFileError> {
        Ok(Self::entries(path)?
            .into_iter()
            .map(|entry| TokenInfo {
                fingerprint: format!("sha256:{}", &to_hex(&entry.hash)[..12]),
                name: entry.name,
                scopes: entry.scopes,
            })
            .collect())
    }

    /// Removes the token named `name` from the file at `path` (rewritten
    /// whole, 0600, then moved into place), and says whether it was there.
    /// A server watching the file refuses the token within
    /// [`RELOAD_PERIOD`], and ends the streams and WebSockets it opened.
    ///
    /// # Errors
    ///
    /// When the file cannot be read or written, is open to others, or is
    /// malformed.
    pub fn revoke(path: &Path, name: &str) -> Result<bool, TokenFileError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| TokenFileError::Io {
            path: path.to_owned(),
            source,
        };
        // Checked first: permissions and form.
        let entries = Self::entries(path)?;
        if !entries.iter().any(|e| e.name == name) {
            return Ok(false);
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let kept: String = text
            .lines()
            .filter(|line| line.split_whitespace().next() != Some(name))
            .map(|line| format!("{line}\n"))
            .collect();
        let temporary = path.with_extension("revoking");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(io)?;
        file.write_all(kept.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&temporary, path).map_err(io)?;
        Ok(true)
    }

    /// The file's entries, after its permissions are checked; none for a
    /// file that only `spool token new` is about to fill.
    fn entries(path: &Path) -> Result<Vec<Entry>, TokenFileError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |source| TokenFileError::Io {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            let what: Vec<&str> = [(0o044, "read"), (0o022, "write"), (0o011, "execute")]
                .into_iter()
                .filter(|(bits, _)| mode & bits != 0)
                .map(|(_, what)| what)
                .collect();
            return Err(TokenFileError::TooOpen {
                path: path.to_owned(),
                mode,
                what: what.join(" and "),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let mut entries = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let malformed = || TokenFileError::Malformed {
                path: path.to_owned(),
                line: index + 1,
            };
            let mut words = line.split_whitespace();
            let (Some(name), Some(hash)) = (words.next(), words.next()) else {
                return Err(malformed());
            };
            let hex = hash.strip_prefix("sha256:").ok_or_else(malformed)?;
            let mut scopes = Vec::new();
            for word in words {
                let scope = SCOPES
                    .iter()
                    .find(|scope| **scope == word)
                    .ok_or_else(malformed)?;
                if scopes.contains(scope) {
                    return Err(malformed());
                }
                scopes.push(*scope);
            }
            entries.push(Entry {
                name: name.to_owned(),
                hash: parse_hex(hex).ok_or_else(malformed)?,
                scopes,
            });
        }
        Ok(entries)
    }

    /// Makes a fresh token named `name`, appends its hash to the file at
    /// `path` (created 0600 when missing), and returns the token: the only
    /// time it is ever shown.
    ///
    /// # Errors
    ///
    /// When the name is taken or invalid, or the file cannot be written.
    pub fn issue(path: &Path, name: &str) -> Result<String, TokenFileError> {
        Self::issue_scoped(path, name, &[])
    }

    /// [`TokenFile::issue`], for an administrator: the token's principal
    /// carries `admin = "true"`.
    ///
    /// # Errors
    ///
    /// As [`TokenFile::issue`].
    pub fn issue_admin(path: &Path, name: &str) -> Result<String, TokenFileError> {
        Self::issue_scoped(path, name, &[ADMIN_ATTRIBUTE])
    }

    /// [`TokenFile::issue`] with `scopes` (of [`SCOPES`]) written after
    /// the hash.
    ///
    /// # Errors
    ///
    /// As [`TokenFile::issue`]; [`TokenFileError::BadName`] also for an
    /// unknown scope.
    pub fn issue_scoped(
        path: &Path,
        name: &str,
        scopes: &[&str],
    ) -> Result<String, TokenFileError> {
        if let Some(unknown) = scopes.iter().find(|s| !SCOPES.contains(s)) {
            return Err(TokenFileError::BadName(format!(
                "{name} (scope `{unknown}`)"
            )));
        }
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        let existing = if path.exists() {
            Self::entries(path)?
        } else {
            Vec::new()
        };
        if !valid || existing.iter().any(|e| e.name == name) {
            return Err(TokenFileError::BadName(name.to_owned()));
        }
        let token = fresh_token().map_err(|source| TokenFileError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| TokenFileError::Io {
                path: path.to_owned(),
                source,
            })?;
        let scopes: String = scopes.iter().map(|scope| format!(" {scope}")).collect();
        writeln!(
            file,
            "{name} sha256:{}{scopes}",
            to_hex(&Sha256::digest(token.as_bytes()).into()),
        )
        .map_err(|source| TokenFileError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(token)
    }

    /// The entry whose token this is.
    fn find(&self, token: &str) -> Option<Entry> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        // Every entry is compared, matched or not, so the time taken does not
        // say which entry (or how much of one) matched.
        let entries = self
            .inner
            .entries
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        for entry in entries.iter() {
            if constant_time_eq(&presented, &entry.hash) {
                found = Some(entry);
            }
        }
        found.cloned()
    }
}

impl Authenticator for TokenFile {
    fn authenticate<'a>(
        &'a self,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<Option<Principal>, AuthError>> {
        Box::pin(async move {
            let token = credentials.bearer().ok_or(AuthError::Unauthenticated)?;
            let entry = self.find(token).ok_or(AuthError::Unauthenticated)?;
            let mut principal = Principal {
                authenticator: "token".into(),
                kind: "token".into(),
                id: entry.name.clone(),
                ..Principal::default()
            };
            for scope in &entry.scopes {
                principal.attributes.insert((*scope).into(), "true".into());
            }
            Ok(Some(principal))
        })
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.inner.changes.subscribe())
    }
}

/// The attribute that marks an administrator's principal: `admin = "true"`.
pub const ADMIN_ATTRIBUTE: &str = spool_runtime::access::ADMIN_ATTRIBUTE;

/// The attribute that lets a principal trigger schedules: `trigger =
/// "true"`.
pub const TRIGGER_ATTRIBUTE: &str = "trigger";

/// The scopes a token file line may name after its hash; each becomes an
/// attribute `SCOPE = "true"` of the token's principal.
pub const SCOPES: &[&str] = &[ADMIN_ATTRIBUTE, TRIGGER_ATTRIBUTE];

/// Whether two digests are equal, in time that depends on neither.
#[must_use]
pub fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 32 random bytes from the OS, as 64 hex digits: a token, a secret, an
/// id nobody can guess.
///
/// # Errors
///
/// When the OS's randomness cannot be read.
pub fn fresh_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(to_hex(&bytes))
}

fn to_hex(bytes: &[u8; 32]) -> String {
    let mut out = String::with_capacity(64);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}
