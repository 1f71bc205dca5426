//! Written blocks kept ahead of the write-ahead log's last frame, so a
//! commit's sync writes its frames and not the file's size too.
//!
//! SQLite appends a commit's frames to the log, and a log that grows makes
//! every `fdatasync` also write the file's new size (its inode): a second
//! synchronous write per commit. Once a checkpoint lets SQLite start the
//! log over, it writes over frames the file already holds and syncs
//! nothing but them. On this project's machine one-page commits synced at
//! 2.3–2.9 k/s into a growing log and at 4.7–6.2 k/s over one it had
//! already written (plain SQLite, `synchronous=FULL`); a server's first
//! 40 MiB of log after each start, and every turn of a run in that time,
//! paid the difference. The writer therefore extends the file with zeros,
//! a chunk at a time, before SQLite reaches its end: the size is written
//! once per chunk, by the next commit's sync. SQLite reads a log only as
//! far as its frames check out (salt and checksum), so zeros past the last
//! frame are no frames at all, as the frames of an earlier pass over the
//! file are not.
//!
//! Only the writer's thread calls it, inside its write transaction (SQLite's
//! write lock on the log): no other connection appends frames meanwhile.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// How far past the log's last frame its file is kept written.
const AHEAD: u64 = 512 * 1024;

/// How much the file grows at a time when it falls short.
const CHUNK: u64 = 2 * 1024 * 1024;

/// What the file is extended with.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// SQLite's WAL index header, both copies: where the log's committed
/// frames end.
const HEADER: usize = 96;

/// Where the committed frames of the log end, in bytes, as the WAL index
/// header (`-shm`, SQLite's documented WAL format) says; `None` when its
/// two copies differ (a writer between its writes), it is not
/// initialized, or no frame is committed.
pub(super) fn wal_end(header: &[u8; HEADER]) -> Option<u64> {
    if header[..48] != header[48..] {
        return None;
    }
    let u32_at = |at: usize| {
        u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let version = u32_at(0);
    let initialized = header[12] == 1;
    let page_size = match u16::from_ne_bytes([header[14], header[15]]) {
        1 => 65_536,
        size => u64::from(size),
    };
    let frames = u64::from(u32_at(16));
    if version != 3_007_000 || !initialized || frames == 0 || page_size < 512 {
        return None;
    }
    // The log's 32-byte header, then per frame a 24-byte header and a page.
    Some(32 + frames * (24 + page_size))
}

/// Reads the WAL index header of `index`, if the file has one.
pub(super) fn read_header(index: &File) -> Option<[u8; HEADER]> {
    let mut header = [0_u8; HEADER];
    index.read_exact_at(&mut header, 0).ok()?;
    Some(header)
}

/// The writer's hold on the log's file and its index.
pub(super) struct Ahead {
    wal: PathBuf,
    index: PathBuf,
    /// Both files, opened once SQLite has made them.
    files: Option<(File, File)>,
    /// The log file's length as last seen: SQLite only lengthens it while
    /// the writer holds it (it cuts it back only at close, or to
    /// `limit` when it starts the log over).
    len: u64,
    /// The longest the file is made: past SQLite's own limit, it would cut
    /// the zeros off again.
    limit: u64,
}

impl Ahead {
    pub(super) fn new(wal: &Path, limit: u64) -> Self {
        let index = wal.with_file_name(
            wal.file_name()
                .map(|name| name.to_string_lossy().replace("-wal", "-shm"))
                .unwrap_or_default(),
        );
        Self {
            wal: wal.to_owned(),
            index,
            files: None,
            len: 0,
            limit,
        }
    }

    /// Extends the log's file with zeros when its last frame is nearer its
    /// end than [`AHEAD`]: returns the bytes written.
    pub(super) fn keep(&mut self) -> std::io::Result<u64> {
        if self.files.is_none() {
            // Before the first commit SQLite has written neither file.
            let (Ok(wal), Ok(index)) = (
                std::fs::OpenOptions::new().write(true).open(&self.wal),
                File::open(&self.index),
            ) else {
                return Ok(0);
            };
            self.len = wal.metadata()?.len();
            self.files = Some((wal, index));
        }
        let Some((wal, index)) = &self.files else {
            return Ok(0);
        };
        let Some(end) = read_header(index).as_ref().and_then(wal_end) else {
            return Ok(0);
        };
        if end + AHEAD <= self.len {
            return Ok(0);
        }
        // SQLite may have lengthened it past what was seen, or cut it back.
        self.len = wal.metadata()?.len();
        if end + AHEAD <= self.len || self.len + CHUNK > self.limit {
            return Ok(0);
        }
        // From one small static buffer, a piece at a time: freeing a
        // 2 MiB allocation raises glibc's threshold for mapping large
        // blocks to that size, so later blocks up to it stay in the
        // arenas (a server held about 1.3 MB more after 1 000 runs).
        let mut at = self.len;
        while at < self.len + CHUNK {
            wal.write_all_at(&ZEROS, at)?;
            at += ZEROS.len() as u64;
        }
        self.len = at;
        Ok(CHUNK)
    }
}
