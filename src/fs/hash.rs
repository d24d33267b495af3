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
    ///
    /// The stamp returned is never newer than the bytes hashed: a file written while it
    /// is read is read again (twice at most), and if it never holds still the stamp from
    /// before the last read is returned, so whoever compares it with the file later sees
    /// a change and hashes again. (A stamp from after the read would vouch for bytes the
    /// hash never saw: a passthrough write landing while `--record async` hashed a close
    /// was taken as recorded, and its agent's next open of the file as stale.)
    pub fn hash(&self, file: &File) -> io::Result<([u8; 32], Stamp)> {
        let mut tries = 0;
        loop {
            let before = stamp_of(&sys::stat_fd(file.as_fd())?);
            if let Some(h) = self.cached(&before) {
                return Ok((h, before));
            }
            let (h, n) = hash_stream(file)?;
            self.hashed.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(n, Ordering::Relaxed);
            let after = stamp_of(&sys::stat_fd(file.as_fd())?);
            if after == before {
                self.insert(after, h);
                return Ok((h, after));
            }
            tries += 1;
            if tries == 3 {
                return Ok((h, before));
            }
        }
    }

    /// The file is gone (its last name removed): its entry would only take room until the
    /// cap (a hash is recomputed if the inode is still open and asked about).
    pub fn forget(&self, dev: u64, ino: u64) {
        self.map.lock().remove(&(dev, ino));
    }

    /// The hash of `bytes`, a whole file's content read while its stamp was `at` (`None`:
    /// the stamp moved, the bytes match no stamp): the cached hash when `at`'s is known,
    /// else hashed (and counted) and, under `at`, kept.
    pub fn of_bytes(&self, at: Option<Stamp>, bytes: &[u8]) -> [u8; 32] {
        if let Some(h) = at.and_then(|s| self.cached(&s)) {
            return h;
        }
        let h: [u8; 32] = Sha256::digest(bytes).into();
        self.hashed.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if let Some(s) = at {
            self.insert(s, h);
        }
        h
    }

    /// A rename moved a file whose bytes, read at the stamp `before`, hash to `h`, and
    /// the file now has the stamp `after`: when only the change time moved (the
    /// rename's own), the same bytes are known under `after`. A write in between moves
    /// the modification time as well (on Linux 6.13+ filesystems with multigrain
    /// timestamps, always to a later one than the `stat` before it saw), and the hash is
    /// then not kept. Without it, the next open of a file written under a temporary name
    /// and renamed into place (editors, `sed -i`, `os.replace`) hashed it again.
    pub fn carry_over_rename(&self, before: &Stamp, h: [u8; 32], after: &Stamp) {
        let same_bytes = before.dev == after.dev
            && before.ino == after.ino
            && before.size == after.size
            && before.mtime == after.mtime;
        if same_bytes {
            self.insert(*after, h);
        }
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
    feed(file, &mut hasher, &mut buf, &mut off, None)?;
    Ok((hasher.finalize().into(), off))
}

/// Hash `file`'s bytes from `*off` up to `upto` (an error if the file ends before), or to
/// its end (`None`), through `buf`; `*off` follows what was hashed.
fn feed(
    file: &File,
    hasher: &mut Sha256,
    buf: &mut [u8],
    off: &mut u64,
    upto: Option<u64>,
) -> io::Result<()> {
    loop {
        let want = match upto {
            Some(u) if *off >= u => return Ok(()),
            Some(u) => ((u - *off) as usize).min(buf.len()),
            None => buf.len(),
        };
        match file.read_at(&mut buf[..want], *off) {
            Ok(0) if upto.is_none() => return Ok(()),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(n) => {
                hasher.update(&buf[..n]);
                *off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Read a whole small file (pre-images for line ranges).
pub fn read_small(file: &File, limit: u64) -> Option<Vec<u8>> {
    let st = sys::stat_fd(file.as_fd()).ok()?;
    if st.st_size as u64 > limit {
        return None;
    }
    sys::pread_exact_or_eof(file, 0, st.st_size as usize).ok()
}

/// [`read_small`], with the stamp the bytes are the content of: `None` when the file
/// changed while it was read (the bytes then match no stamp, and their hash is not kept).
pub fn read_small_stamped(file: &File, limit: u64) -> Option<(Vec<u8>, Option<Stamp>)> {
    let before = stamp_of(&sys::stat_fd(file.as_fd()).ok()?);
    if before.size > limit {
        return None;
    }
    let bytes = sys::pread_exact_or_eof(file, 0, before.size as usize).ok()?;
    let after = sys::stat_fd(file.as_fd()).ok().map(|s| stamp_of(&s));
    let at = (after == Some(before) && before.size == bytes.len() as u64).then_some(before);
    Some((bytes, at))
}

/// Below this many bytes written in order, a file is hashed at close as any other.
const SEQ_MIN: u64 = 4 * 1024 * 1024;

/// The content hash of a file written front to back through one handle, taken while it
/// is written: past [`SEQ_MIN`] bytes a helper thread reads each written range back (from
/// the page cache, behind the writer) and hashes it on another core, so closing a large
/// file does not hash it all at once. Only for a handle that found the file empty; a
/// write anywhere but at the end, a truncation, `fallocate`, `copy_file_range`, or anyone
/// else's change in between turns it off, and the file is hashed at close as before.
#[derive(Default)]
pub enum SeqHash {
    #[default]
    Off,
    /// `len` bytes written, all in order from offset 0.
    On { len: u64, worker: Option<SeqWorker> },
}

/// The helper thread of one [`SeqHash`]: told how far the file is written, it hashes up
/// to there; told to finish, it answers the hash of the first `len` bytes.
pub struct SeqWorker {
    tx: crossbeam_channel::Sender<(u64, bool)>,
    done: crossbeam_channel::Receiver<io::Result<[u8; 32]>>,
}

impl SeqWorker {
    fn spawn(file: File) -> io::Result<SeqWorker> {
        let (tx, rx) = crossbeam_channel::unbounded::<(u64, bool)>();
        let (dtx, done) = crossbeam_channel::bounded(1);
        std::thread::Builder::new()
            .name("intentfs-seqhash".into())
            .spawn(move || {
                let mut hasher = Sha256::new();
                let mut buf = vec![0u8; BUF];
                let mut off = 0u64;
                // Ends when the handle drops its worker (the channel closes).
                while let Ok((upto, finish)) = rx.recv() {
                    let r = feed(&file, &mut hasher, &mut buf, &mut off, Some(upto));
                    if finish || r.is_err() {
                        let _ = dtx.send(r.map(|()| hasher.clone().finalize().into()));
                        return;
                    }
                }
            })?;
        Ok(SeqWorker { tx, done })
    }
}

impl SeqHash {
    /// A handle opened on an empty file: follow what it writes.
    pub fn start() -> SeqHash {
        SeqHash::On {
            len: 0,
            worker: None,
        }
    }

    /// The handle wrote `n` bytes at `offset`; `undisturbed`: nobody changed the file
    /// between this handle's previous write and this one. `reader` opens the file for
    /// the helper thread when one is needed.
    pub fn wrote(
        &mut self,
        offset: u64,
        n: u64,
        undisturbed: bool,
        reader: impl FnOnce() -> Option<File>,
    ) {
        let SeqHash::On { len, worker } = self else {
            return;
        };
        if !undisturbed || offset != *len {
            *self = SeqHash::Off;
            return;
        }
        *len += n;
        if worker.is_none() && *len >= SEQ_MIN {
            match reader().map(SeqWorker::spawn) {
                Some(Ok(w)) => *worker = Some(w),
                _ => {
                    *self = SeqHash::Off;
                    return;
                }
            }
        }
        if let Some(w) = worker {
            if w.tx.send((*len, false)).is_err() {
                *self = SeqHash::Off;
            }
        }
    }

    /// Stop following (the handle changed the file other than by writing at its end).
    pub fn off(&mut self) {
        *self = SeqHash::Off;
    }

    /// The hash of the `size` bytes written, if they are all this handle wrote in order
    /// (and a helper thread followed them); turns tracking off either way.
    pub fn finish(&mut self, size: u64) -> Option<[u8; 32]> {
        match std::mem::take(self) {
            SeqHash::On {
                len,
                worker: Some(w),
            } if len == size => {
                w.tx.send((len, true)).ok()?;
                w.done.recv().ok()?.ok()
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod carry_tests {
    use super::*;

    fn stamp(ino: u64, size: u64, mtime: i64, ctime: i64) -> Stamp {
        Stamp {
            dev: 1,
            ino,
            size,
            mtime: (mtime, 0),
            ctime: (ctime, 0),
        }
    }

    #[test]
    fn a_rename_carries_a_hash_only_when_nothing_but_the_change_time_moved() {
        let before = stamp(7, 10, 100, 100);
        // The rename's own ctime: kept under the new stamp.
        let c = HashCache::default();
        let renamed = stamp(7, 10, 100, 101);
        c.carry_over_rename(&before, [9; 32], &renamed);
        assert_eq!(c.cached(&renamed), Some([9; 32]));
        // A write in between (mtime moved, or the size), or another file there: not kept.
        let c = HashCache::default();
        for after in [
            stamp(7, 10, 101, 101),
            stamp(7, 11, 100, 101),
            stamp(8, 10, 100, 101),
        ] {
            c.carry_over_rename(&before, [9; 32], &after);
            assert_eq!(c.cached(&after), None, "{after:?}");
        }
    }
}
