//! Where a user's local sockets and discovery files go: a host concern
//! every local transport shares (a pod's socket, the bus registry), kept
//! here so that a transport needing only a directory builds no HTTP stack.

/// Where a user's local sockets and discovery files go (a pod's socket,
/// the bus registry): `$XDG_RUNTIME_DIR/spool`, or `<temp>/spool-<uid>`
/// where there is no `XDG_RUNTIME_DIR`.
#[must_use]
pub fn user_runtime_dir() -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => std::path::PathBuf::from(dir).join("spool"),
        None => {
            // The owner of `/proc/self` is this process's user.
            let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
            std::env::temp_dir().join(format!("spool-{uid}"))
        }
    }
}
