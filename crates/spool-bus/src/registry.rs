//! Discovery: a registry file mapping each running instance to its bus
//! port, pid and secret, so a caller on the same machine finds it by name.
//! `$XDG_RUNTIME_DIR/spool/bus-registry.json` (else under a 0700 directory
//! in the system's temporary directory named for the user id), 0600, in a
//! 0700 directory. Every change is made under an exclusive lock on a file
//! beside it, and written whole by rename, so instances registering at
//! once lose nothing. Entries of processes that are gone are pruned on
//! every change; [`prune_foreign`] also drops entries whose port answers
//! as another instance or not at all.
//!
//! Every process of the same user can read every secret in it, as with
//! the seed's reference; that is the bound of this design.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One instance in the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Its bus port on loopback.
    pub port: u16,
    /// Its process.
    pub pid: u32,
    /// Its bus secret.
    pub secret: String,
    /// When it registered (RFC 3339).
    pub updated_at: String,
}

/// Instances by name.
pub type Instances = BTreeMap<String, Entry>;

/// The registry's default path.
#[must_use]
pub fn default_path() -> PathBuf {
    spool_runtime::dirs::user_runtime_dir().join("bus-registry.json")
}

/// Whether process `pid` is alive.
fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Reads the registry; a missing file is empty, an unreadable entry left
/// out.
///
/// # Errors
///
/// When the file exists and cannot be read.
pub fn read(path: &Path) -> std::io::Result<Instances> {
    private(path)?;
    match std::fs::read(path) {
        Ok(bytes) => Ok(parse(&bytes)),
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(Instances::new()),
        Err(error) => Err(error),
    }
}

/// Refuses a registry another user could read or have written: the file
/// or its directory owned by someone else, the file open to its group or
/// others, or the directory writable by them. Such a registry could hand
/// out this user's secrets, or send delegations (prompts and secrets) to a
/// port another user listens on. A missing file or directory is fine: it
/// is made private.
fn private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // The owner of `/proc/self` is this process's user.
    let me = std::fs::metadata("/proc/self")?.uid();
    let refuse = |what: &Path, why: &str| {
        Err(std::io::Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "the bus registry {} {why}: only its owner may read or change it (chmod 700 the directory, 600 the file)",
                what.display()
            ),
        ))
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.uid() != me => return refuse(dir, "is another user's directory"),
            Ok(meta) if meta.mode() & 0o022 != 0 => {
                return refuse(dir, "is in a directory others can write");
            }
            Ok(_) => {}
            Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.uid() != me => refuse(path, "is another user's file"),
        Ok(meta) if meta.mode() & 0o077 != 0 => refuse(path, "may be read or written by others"),
        Ok(_) => Ok(()),
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// Entries that do not decode are dropped, not the whole registry.
fn parse(bytes: &[u8]) -> Instances {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(bytes) else {
        return Instances::new();
    };
    map.into_iter()
        .filter_map(|(name, entry)| Some((name, serde_json::from_value(entry).ok()?)))
        .collect()
}

/// Changes the registry under its lock: `change` gets the entries of live
/// processes and edits them; the result is written whole.
///
/// # Errors
///
/// When the directory, the lock or the file cannot be made or written.
pub fn update(path: &Path, change: impl FnOnce(&mut Instances)) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    private(path)?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path.with_extension("lock"))?;
    // Released when `lock` is dropped (or the process dies).
    lock.lock()?;
    let mut instances = read(path)?;
    instances.retain(|_, entry| alive(entry.pid));
    change(&mut instances);
    let partial = path.with_extension("partial");
    let bytes = serde_json::to_vec_pretty(&instances).expect("entries are plain JSON");
    {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&partial)?;
        std::io::Write::write_all(&mut file, &bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&partial, path)?;
    drop(lock);
    Ok(())
}

/// Drops the entries whose port answers as another instance, or not at
/// all (a process that reused a dead instance's pid): what a live pid
/// alone cannot tell. An entry that is merely slow to answer stays.
///
/// # Errors
///
/// As [`update`].
pub async fn prune_foreign(path: &Path) -> std::io::Result<Vec<String>> {
    let mut stale = Vec::new();
    for (name, entry) in read(path)? {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], entry.port));
        if let crate::client::Probe::Elsewhere(_) = crate::client::probe(addr, &name).await {
            stale.push((name, entry));
        }
    }
    if stale.is_empty() {
        return Ok(Vec::new());
    }
    let names = stale.iter().map(|(name, _)| name.clone()).collect();
    update(path, |instances| {
        for (name, entry) in &stale {
            // Only as probed: an instance that registered again since
            // stays.
            if instances.get(name) == Some(entry) {
                instances.remove(name);
            }
        }
    })?;
    Ok(names)
}

/// Registers `instance` (this process) with its port and secret.
///
/// # Errors
///
/// As [`update`].
pub fn register(path: &Path, instance: &str, port: u16, secret: &str) -> std::io::Result<()> {
    let updated_at = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    update(path, |instances| {
        instances.insert(
            instance.to_owned(),
            Entry {
                port,
                pid: std::process::id(),
                secret: secret.to_owned(),
                updated_at,
            },
        );
    })
}

/// Removes `instance` if this process registered it.
///
/// # Errors
///
/// As [`update`].
pub fn deregister(path: &Path, instance: &str) -> std::io::Result<()> {
    update(path, |instances| {
        if instances
            .get(instance)
            .is_some_and(|entry| entry.pid == std::process::id())
        {
            instances.remove(instance);
        }
    })
}
