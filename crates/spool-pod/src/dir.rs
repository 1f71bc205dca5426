//! A pod's runtime directory: `ROOT/NAME/` holding `sock` (0600), `pid`
//! and `status.json` (each written whole, by rename), under a root that is
//! `$XDG_RUNTIME_DIR/spool/pods`, or a 0700 directory under the system's
//! temporary directory named for the user id. A socket left by a process
//! that died is replaced; one a live pod answers on is refused; a path
//! that is not a socket is never removed.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why a pod's directory or socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirError {
    /// A pod of that name is served already.
    #[error("pod {name} is already served (its socket {} answers{})", socket.display(), pid.map(|p| format!("; pid {p}")).unwrap_or_default())]
    Live {
        /// The pod.
        name: String,
        /// Its socket.
        socket: PathBuf,
        /// The serving process, if its pid file says.
        pid: Option<u32>,
    },
    /// Something that is not a socket is where the socket goes.
    #[error("{} exists and is not a socket: it is left alone", .0.display())]
    NotASocket(PathBuf),
    /// The file system refused.
    #[error("{}: {source}", path.display())]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DirError + '_ {
    move |source| DirError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The root of pods' runtime directories: `$XDG_RUNTIME_DIR/spool/pods`,
/// or `<temp>/spool-<uid>/pods`.
#[must_use]
pub fn default_root() -> PathBuf {
    spool_runtime::dirs::user_runtime_dir().join("pods")
}

/// What `status.json` holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusFile {
    /// The pod.
    pub pod_name: String,
    /// `idle`, `running` or `paused`.
    pub state: String,
    /// The session's run id.
    pub session_id: String,
    /// The serving process.
    pub pid: u32,
}

/// One pod's runtime directory, while it is served: removed (its files)
/// when dropped.
#[derive(Debug)]
pub struct PodDir {
    dir: PathBuf,
}

impl PodDir {
    /// Makes `root/NAME` (0700, and the root's missing parents 0700), and
    /// clears the way for its socket: a stale socket is removed, a live
    /// one or a path that is not a socket refused.
    ///
    /// # Errors
    ///
    /// [`DirError`].
    pub fn create(root: &Path, name: &str) -> Result<Self, DirError> {
        let dir = root.join(name);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io(&dir))?;
        // Checked before `Self` exists: its drop removes the pod's files,
        // which are not ours until the way is clear.
        let socket = dir.join("sock");
        match std::fs::symlink_metadata(&socket) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(DirError::NotASocket(socket));
            }
            Ok(_) => match std::os::unix::net::UnixStream::connect(&socket) {
                Ok(_) => {
                    let pid = std::fs::read_to_string(dir.join("pid"))
                        .ok()
                        .and_then(|p| p.trim().parse().ok());
                    return Err(DirError::Live {
                        name: name.to_owned(),
                        socket,
                        pid,
                    });
                }
                Err(_) => std::fs::remove_file(&socket).map_err(io(&socket))?,
            },
            Err(error) if error.kind() == ErrorKind::NotFound => {}
            Err(error) => return Err(io(&socket)(error)),
        }
        let pod = Self { dir };
        write_whole(
            &pod.dir.join("pid"),
            std::process::id().to_string().as_bytes(),
        )?;
        Ok(pod)
    }

    /// The socket's path.
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.join("sock")
    }

    /// Binds the socket, 0600.
    ///
    /// # Errors
    ///
    /// When binding or setting its mode fails.
    pub fn bind(&self) -> Result<tokio::net::UnixListener, DirError> {
        let socket = self.socket();
        let listener = tokio::net::UnixListener::bind(&socket).map_err(io(&socket))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .map_err(io(&socket))?;
        Ok(listener)
    }

    /// Writes `status.json` whole.
    ///
    /// # Errors
    ///
    /// When writing fails.
    pub fn write_status(&self, status: &StatusFile) -> Result<(), DirError> {
        let text = serde_json::to_vec_pretty(status).expect("a status is plain JSON");
        write_whole(&self.dir.join("status.json"), &text)
    }
}

impl Drop for PodDir {
    fn drop(&mut self) {
        for file in ["sock", "pid", "status.json"] {
            let _ = std::fs::remove_file(self.dir.join(file));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Writes `path` by writing a sibling and renaming it over: a reader sees
/// the old file or the new one, never half of one.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), DirError> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bytes).map_err(io(&partial))?;
    std::fs::rename(&partial, path).map_err(io(path))
}

/// A pod found in a root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its name.
    pub name: String,
    /// Whether its socket answers.
    pub live: bool,
    /// Its last `status.json`, if readable.
    pub status: Option<StatusFile>,
}

/// The pods under `root`, by name.
#[must_use]
pub fn list(root: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<Found> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| {
            let dir = entry.path();
            Found {
                name: entry.file_name().to_string_lossy().into_owned(),
                live: std::os::unix::net::UnixStream::connect(dir.join("sock")).is_ok(),
                status: std::fs::read(dir.join("status.json"))
                    .ok()
                    .and_then(|bytes| serde_json::from_slice(&bytes).ok()),
            }
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}
