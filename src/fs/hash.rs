//! Content hashes (SHA-256, streamed), cached by file stamp so an unchanged file is never
//! hashed twice, whoever asks: stale checks, read records and ledger entries share it.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::sys;
use crate::guard::stale::Stamp;

/// Streaming buffer: a 10 GiB file costs this much memory, no more.
const BUF: usize = 256 * 1024;
/// Most cached hashes before the cache starts over (about 100 bytes each).
const MAX_ENTRIES: usize = 200_000;

/// The stamp of a `stat`.
pub fn stamp_of(st: &sys::Stat) -> Stamp {
    Stamp {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime: (st.st_mtime, st.st_mtime_nsec),
        ctime: (st.st_ctime, st.st_ctime_nsec),
    }
}

/// `sha256:<hex>`.
pub fn to_string(h: &[u8; 32]) -> String {
    format!("sha256:{}", hex::encode(h))
}

/// `(device, inode)` -> the stamp a hash was taken at, and the hash.
type HashMapByInode = HashMap<(u64, u64), (Stamp, [u8; 32])>;

/// Hashes by (device, inode), valid while the stamp matches.
#[derive(Default)]
pub struct HashCache {
    map: Mutex<HashMapByInode>,
    /// Files actually hashed (cache misses), for status and tests.
    pub hashed: AtomicU64,
    /// Bytes hashed.
    pub bytes: AtomicU64,
}

impl HashCache {
    /// The cached hash for this exact stamp, if any (never reads the file).
    pub fn cached(&self, s: &Stamp) -> Option<[u8; 32]> {
        self.map
            .lock()
            .get(&(s.dev, s.ino))
            .filter(|(st, _)| st == s)
            .map(|(_, h)| *h)
    }

    /// The hash of `file`'s content (read with `pread`, so its offset is untouched). Cached
    /// when the stamp did not change while hashing.
    pub fn hash(&self, file: &File) -> io::Result<([u8; 32], Stamp)> {
        let before = stamp_of(&sys::stat_fd(file.as_fd())?);
        if let Some(h) = self.cached(&before) {
            return Ok((h, before));
        }
        let (h, n) = hash_stream(file)?;
        self.hashed.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(n, Ordering::Relaxed);
        let after = stamp_of(&sys::stat_fd(file.as_fd())?);
        if after == before {
            let mut m = self.map.lock();
            if m.len() >= MAX_ENTRIES {
                m.clear();
            }
            m.insert((after.dev, after.ino), (after, h));
        }
        Ok((h, after))
    }

    /// Remember a hash computed elsewhere (e.g. from bytes already in memory).
    pub fn insert(&self, s: Stamp, h: [u8; 32]) {
        let mut m = self.map.lock();
        if m.len() >= MAX_ENTRIES {
            m.clear();
        }
        m.insert((s.dev, s.ino), (s, h));
    }
}

/// SHA-256 of a whole file by streaming `pread`s; returns the hash and the byte count.
pub fn hash_stream(file: &File) -> io::Result<([u8; 32], u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF];
    let mut off = 0u64;
    loop {
        let n = match file.read_at(&mut buf, off) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        off += n as u64;
    }
    Ok((hasher.finalize().into(), off))
}

/// Read a whole small file (pre-images for line ranges).
pub fn read_small(file: &File, limit: u64) -> Option<Vec<u8>> {
    let st = sys::stat_fd(file.as_fd()).ok()?;
    if st.st_size as u64 > limit {
        return None;
    }
    let mut out = vec![0u8; st.st_size as usize];
    let mut off = 0;
    while off < out.len() {
        match file.read_at(&mut out[off..], off as u64) {
            Ok(0) => break,
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
    out.truncate(off);
    Some(out)
}
