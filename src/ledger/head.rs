//! The head checkpoint beside a ledger (`<ledger>.head`): how many entries are durable and
//! the hash of the last one. The writer's sync thread keeps it; verify reads it to detect
//! deleted or rewritten last lines, which a backward hash chain alone cannot see.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The head checkpoint beside a ledger: how many entries are durable and the hash of the
/// last one, so `verify` detects deleted or rewritten last lines.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub entries: u64,
    pub last: String,
}

/// `<ledger>.head`.
pub fn head_path(ledger: &Path) -> PathBuf {
    let mut p = ledger.as_os_str().to_os_string();
    p.push(".head");
    PathBuf::from(p)
}

/// Read the head checkpoint, if there is one.
pub fn read_head(ledger: &Path) -> Option<Head> {
    serde_json::from_slice(&std::fs::read(head_path(ledger)).ok()?).ok()
}

/// Size of the head record: the JSON padded with spaces and a newline, so each checkpoint
/// overwrites the last one in place (one small `pwrite`, no new inode per checkpoint: a
/// temp file renamed over it every few ms made ext4 scan its recently freed inodes).
const HEAD_RECORD: usize = 160;

/// The head record for `entries` and `last`: exactly [`HEAD_RECORD`] bytes.
fn head_record(entries: u64, last: &str) -> io::Result<Vec<u8>> {
    let mut body = serde_json::to_vec(&Head {
        entries,
        last: last.to_owned(),
    })
    .map_err(io::Error::other)?;
    if body.len() >= HEAD_RECORD {
        return Err(io::Error::other("head record too long"));
    }
    body.resize(HEAD_RECORD - 1, b' ');
    body.push(b'\n');
    Ok(body)
}

/// Write the checkpoint into `<ledger>.head`, opened once and kept in `file`. A reader
/// sees the old or the new record (one write inside one page); after a crash the record
/// may lag, which verify tolerates (it is a lower bound).
pub(crate) fn write_head(
    ledger: &Path,
    file: &mut Option<File>,
    entries: u64,
    last: &str,
) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let rec = head_record(entries, last)?;
    let f = match file {
        Some(f) => f,
        None => {
            // An explicit mode: the umask of this thread is not the daemon's concern here.
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o640)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(head_path(ledger))?;
            // An older, longer record must not leave a tail behind.
            f.set_len(HEAD_RECORD as u64)?;
            file.insert(f)
        }
    };
    if let Err(e) = f.write_all_at(&rec, 0) {
        *file = None;
        return Err(e);
    }
    Ok(())
}
