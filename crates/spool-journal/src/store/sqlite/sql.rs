//! Small SQL helpers every part of the store uses: conversions of
//! positions, ids and times, errors, and the write-ahead log's checks.

use super::*;

/// Refuses to open a journal whose write-ahead log went missing.
///
/// A writer that stops cleanly leaves neither `-wal` nor `-shm`. After a
/// crash both stay, and SQLite's WAL index (`-shm`, laid out in SQLite's
/// documented WAL format) records in its header how many frames of the
/// log hold committed transactions. A log that is gone or shorter than
/// that (deleted by hand, or lost in a copy) would make SQLite open the
/// database as of its last checkpoint: every event acknowledged since
/// would silently vanish. The index is in memory-mapped pages a power
/// loss may leave older, never newer, than the synced log, so the check
/// never refuses a journal that is whole.
pub(super) fn check_wal(path: &Path) -> Result<(), JournalError> {
    let index = path.with_file_name(format!("{FILE_NAME}-shm"));
    let wal = path.with_file_name(format!("{FILE_NAME}-wal"));
    // The header only: the index itself grows with the log. Without one
    // (or with one a writer left half written) nothing can be concluded.
    let Some(expected) = std::fs::File::open(&index)
        .ok()
        .and_then(|file| ahead::read_header(&file))
        .as_ref()
        .and_then(ahead::wal_end)
    else {
        return Ok(());
    };
    let found = std::fs::metadata(&wal).map_or(0, |m| m.len());
    if found < expected {
        return Err(JournalError::WalMissing {
            wal,
            index,
            expected,
            found,
        });
    }
    Ok(())
}

/// `path` as an SQLite URI that opens it immutable: the bytes a URI gives
/// meaning to, and any byte that is not ASCII, are percent-encoded.
pub(super) fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for &byte in path.as_os_str().as_encoded_bytes() {
        if byte.is_ascii() && !b"%?#".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// A stored body or hash as bytes. Rows are written as blobs; text with the
/// same bytes is read too (it is what SQL string functions leave), and
/// anything else is `None`, which the caller reports as tampering.
pub(super) fn stored_bytes(value: rusqlite::types::ValueRef<'_>) -> Option<Vec<u8>> {
    match value {
        rusqlite::types::ValueRef::Blob(bytes) | rusqlite::types::ValueRef::Text(bytes) => {
            Some(bytes.to_vec())
        }
        _ => None,
    }
}

/// Executes a statement through the connection's statement cache: the
/// writer runs the same few statements for every operation (and `BEGIN`
/// and `COMMIT` for every commit and read), and parsing them each time
/// would cost more than running them.
pub(super) fn exec(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

pub(super) fn storage(error: rusqlite::Error) -> JournalError {
    JournalError::storage_from(error)
}

pub(super) fn seq_sql(seq: Seq) -> Result<i64, JournalError> {
    i64::try_from(seq.0)
        .map_err(|_| JournalError::storage(format!("seq {seq} does not fit SQLite's integers")))
}

pub(super) fn stored_run_id(text: &str) -> Result<RunId, JournalError> {
    RunId::new(text).map_err(|e| JournalError::storage(format!("a stored run id is invalid: {e}")))
}

pub(super) fn nanos(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

pub(super) fn from_nanos(nanos: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(nanos))
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}
