//! The journal's owner file: one process at a time drives a journal
//! directory, and a second is refused with who holds it.

use super::*;

/// The lock file that marks a journal's owner.
pub const OWNER_FILE: &str = "owner.lock";

/// The claim of one process to drive a journal's runs: an exclusive
/// advisory lock on `owner.lock` in the journal's directory, held until
/// dropped (or the process dies, when the OS lets it go).
///
/// The store itself stays safe under several writers (an append checks
/// the run's head, so a chain never forks); what one owner protects is the
/// runtime above it: two processes recovering the same journal would both
/// resume its interrupted turns and run their tools twice. `spool serve`,
/// `spool run` and `spool chat` claim the journal before they open it.
#[derive(Debug)]
pub struct Owner {
    _file: std::fs::File,
}

impl Owner {
    /// Claims the journal in `dir` (creating the directory when needed)
    /// for this process.
    ///
    /// # Errors
    ///
    /// [`JournalError::InUse`] when another process holds it, with that
    /// process's id; [`JournalError::Storage`] when the lock file cannot
    /// be used.
    pub fn claim(dir: impl AsRef<Path>) -> Result<Self, JournalError> {
        use std::io::{Read, Write};
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| JournalError::storage(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join(OWNER_FILE);
        let failed = |e: std::io::Error| JournalError::storage(format!("{}: {e}", path.display()));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(failed)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                // The holder's pid is a courtesy in the message; without
                // it the refusal stands all the same.
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(JournalError::InUse {
                    dir: dir.to_owned(),
                    holder: holder.trim().parse().ok(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(failed(e)),
        }
        // The holder's pid, for the message another process shows: written
        // over the last one, and the file cut only when that was longer.
        // A truncation costs a synchronous journal update even to the same
        // length (ext4: 0.3 ms, traced, of a one-shot run's 6 to 9), and
        // to nothing it freed the file's block only to allocate another.
        let pid = std::process::id().to_string();
        let before = file.metadata().map_err(failed)?.len();
        file.write_all(pid.as_bytes()).map_err(failed)?;
        if before > pid.len() as u64 {
            file.set_len(pid.len() as u64).map_err(failed)?;
        }
        Ok(Self { _file: file })
    }
}
