//! Packs: the small objects a mounted daemon keeps, appended to one file of its own (see
//! the store's module documentation for the format), found by every reader, and unpacked
//! into loose objects by `gc` once sealed.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    parse_hash, with_path, Kind, Object, Pack, Scanned, Store, PACKS, PACK_MAGIC, RECORD_HEADER,
    RECORD_MAGIC, SEAL_AFTER,
};

/// A mutex's guard, whatever a panicking holder left (the data is plain).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key_of(hex: &str) -> Option<[u8; 32]> {
    hex::decode(hex).ok()?.try_into().ok()
}

/// Whether another process holds `f` under `flock` (a daemon appending to it). Takes the
/// lock when free: the caller keeps it as long as `f` is open.
pub(super) fn take_lock(f: &File) -> io::Result<bool> {
    use rustix::fs::{flock, FlockOperation};
    match flock(f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The records of the pack `f` (`len` bytes long): `(hash, frame offset, frame length)`.
/// Reading stops at the first record that is not whole (a tail an interrupted append or a
/// power cut left): what comes before it is read.
fn scan(f: &File, len: u64) -> io::Result<Vec<([u8; 32], u64, u64)>> {
    let mut magic = [0u8; 16];
    if len < magic.len() as u64 {
        return Ok(Vec::new());
    }
    f.read_exact_at(&mut magic, 0)?;
    if &magic != PACK_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a pack of intentfs's content store (no header)",
        ));
    }
    let mut out = Vec::new();
    let mut off = PACK_MAGIC.len() as u64;
    let mut head = [0u8; RECORD_HEADER as usize];
    while off + RECORD_HEADER <= len {
        f.read_exact_at(&mut head, off)?;
        if &head[..4] != RECORD_MAGIC {
            break;
        }
        let mut key = [0u8; 32];
        key.copy_from_slice(&head[8..40]);
        let mut len_bytes = [0u8; 8];
        len_bytes.copy_from_slice(&head[40..48]);
        let n = u64::from_le_bytes(len_bytes);
        let start = off + RECORD_HEADER;
        if n == 0 || start.checked_add(n).is_none_or(|end| end > len) {
            break;
        }
        out.push((key, start, n));
        off = start + n;
    }
    Ok(out)
}

impl Store {
    fn packs_dir(&self) -> PathBuf {
        self.dir.join(PACKS)
    }

    /// Whether the object `hex` is in the pack this store appends to.
    pub(super) fn in_own_pack(&self, hex: &str) -> bool {
        let pack = lock(&self.pack);
        let Some(p) = pack.as_ref() else { return false };
        key_of(hex).is_some_and(|k| p.index.contains_key(&k))
    }

    /// Append the frame `compressed` of the object `hex` to this store's pack (starting
    /// one when there is none, or when it is older than [`SEAL_AFTER`]). One `pwrite`; the
    /// group commit's [`Store::sync`] makes it durable.
    pub(super) fn append_packed(&self, hex: &str, compressed: &[u8]) -> io::Result<()> {
        let key = key_of(hex).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut guard = lock(&self.pack);
        if guard
            .as_ref()
            .is_some_and(|p| p.born.elapsed() >= SEAL_AFTER)
        {
            // Sealed: durable now, and left to gc (its lock goes with the file).
            if let Some(old) = guard.take() {
                old.file.sync_data()?;
            }
        }
        let p = match guard.as_mut() {
            Some(p) => p,
            None => guard.insert(self.new_pack()?),
        };
        let mut rec = Vec::with_capacity(RECORD_HEADER as usize + compressed.len());
        rec.extend_from_slice(RECORD_MAGIC);
        rec.extend_from_slice(&[0u8; 4]);
        rec.extend_from_slice(&key);
        rec.extend_from_slice(&(compressed.len() as u64).to_le_bytes());
        rec.extend_from_slice(compressed);
        if let Err(e) = p.file.write_all_at(&rec, p.end) {
            // No half record stays: cut back, or give the pack up (the next put starts
            // another; readers stop at the torn record anyway).
            if p.file.set_len(p.end).is_err() {
                guard.take();
            }
            return Err(with_path(e, "cannot append to", &self.packs_dir()));
        }
        p.index
            .insert(key, (p.end + RECORD_HEADER, compressed.len() as u64));
        p.end += rec.len() as u64;
        self.pack_unsynced.store(true, Ordering::Release);
        Ok(())
    }

    /// A new pack of this process's, locked, its header written. (Made under a temporary
    /// name and locked before it is renamed into place: gc never finds it unlocked.)
    fn new_pack(&self) -> io::Result<Pack> {
        let dir = self.packs_dir();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| with_path(e, "cannot create", &dir))?;
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = format!(
            "{secs}-{}-{}.pack",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let tmp = dir.join(format!("{}{name}", super::TMP_PREFIX));
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| with_path(e, "cannot create", &tmp))?;
        let made = take_lock(&file)
            .and_then(|free| {
                free.then_some(())
                    .ok_or_else(|| io::Error::other("locked by another process"))
            })
            .and_then(|()| file.write_all_at(PACK_MAGIC, 0))
            .and_then(|()| {
                // (Never over another pack.)
                use rustix::fs::{renameat_with, RenameFlags, CWD};
                Ok(renameat_with(
                    CWD,
                    &tmp,
                    CWD,
                    &path,
                    RenameFlags::NOREPLACE,
                )?)
            });
        if let Err(e) = made {
            let _ = fs::remove_file(&tmp);
            return Err(with_path(e, "cannot make the pack", &path));
        }
        // Its name durable with the records in it: the next group commit's `syncfs` (the
        // pack's own `fdatasync` commits its data, not the directory's entry).
        if self.deferred.load(Ordering::Relaxed) {
            self.unsynced.store(true, Ordering::Release);
        } else {
            File::open(&dir).and_then(|d| d.sync_all())?;
        }
        Ok(Pack {
            path,
            file: Arc::new(file),
            end: PACK_MAGIC.len() as u64,
            born: std::time::Instant::now(),
            index: HashMap::new(),
        })
    }

    /// The packs in the store, by name.
    pub(super) fn pack_paths(&self) -> io::Result<Vec<PathBuf>> {
        let dir = self.packs_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(with_path(e, "cannot list", &dir)),
        };
        let mut out: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "pack"))
            .collect();
        out.sort();
        Ok(out)
    }

    /// `f` of the objects of the pack at `path` (hash -> frame offset and length), scanned
    /// again only when its length changed since the last look (one `stat` otherwise). None
    /// when it is gone.
    fn with_records<R>(
        &self,
        path: &Path,
        f: impl FnOnce(&HashMap<[u8; 32], (u64, u64)>) -> R,
    ) -> io::Result<Option<R>> {
        let len = match fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(with_path(e, "cannot read", path)),
        };
        let mut seen = lock(&self.scanned);
        if let Some(s) = seen.get(path).filter(|s| s.len == len) {
            return Ok(Some(f(&s.records)));
        }
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(with_path(e, "cannot read", path)),
        };
        // (Scanned up to the length looked at: a record appended since is found next time.)
        let records: HashMap<[u8; 32], (u64, u64)> = scan(&file, len)
            .map_err(|e| with_path(e, "cannot read", path))?
            .into_iter()
            .map(|(k, off, n)| (k, (off, n)))
            .collect();
        let r = f(&records);
        seen.insert(path.to_path_buf(), Scanned { len, records });
        Ok(Some(r))
    }

    /// Where `hash`'s frame is in a pack: `(pack, offset, length)`.
    pub(super) fn find_packed(&self, hash: &str) -> Option<(PathBuf, u64, u64)> {
        let key = key_of(parse_hash(hash).ok()?)?;
        let own = match lock(&self.pack).as_ref() {
            Some(p) => match p.index.get(&key) {
                Some(&(off, n)) => return Some((p.path.clone(), off, n)),
                None => Some(p.path.clone()),
            },
            None => None,
        };
        // (Not the pack this store appends to: its index is whole, and scanning it again
        // after each append would read it all.)
        for path in self
            .pack_paths()
            .ok()?
            .into_iter()
            .filter(|p| Some(p) != own.as_ref())
        {
            let found = self.with_records(&path, |records| records.get(&key).copied());
            if let Ok(Some(Some((off, n)))) = found {
                return Some((path, off, n));
            }
        }
        None
    }

    /// [`Store::get`] of an object that is not loose: from its pack, checked against its
    /// hash. A pack gc unpacked meanwhile: the loose object it left.
    pub(super) fn get_packed(&self, hash: &str) -> io::Result<Option<Vec<u8>>> {
        let Some((path, off, n)) = self.find_packed(hash) else {
            return Ok(None);
        };
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return match self.locate(hash) {
                    Some(_) => self.get(hash),
                    None => Ok(None),
                };
            }
            Err(e) => return Err(with_path(e, "cannot read", &path)),
        };
        let mut frame = vec![0u8; n as usize];
        f.read_exact_at(&mut frame, off)
            .map_err(|e| with_path(e, "cannot read", &path))?;
        let data = zstd::stream::decode_all(&frame[..])
            .map_err(|e| with_path(e, "cannot decompress an object of", &path))?;
        if crate::ledger::sha256_bytes(&data) != format!("sha256:{}", parse_hash(hash)?) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "object {hash} in {} is damaged: its content does not hash to its name",
                    path.display()
                ),
            ));
        }
        Ok(Some(data))
    }

    /// Every packed object, as [`Store::objects`] lists them (a hash in several packs,
    /// once). An object of a pack a daemon is appending to is `in_use`.
    pub(super) fn packed_objects(&self) -> io::Result<Vec<Object>> {
        let mut out: Vec<Object> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let own = lock(&self.pack).as_ref().map(|p| p.path.clone());
        for path in self.pack_paths()? {
            let Some(records) = self.with_records(&path, |r| {
                r.iter().map(|(k, &(_, n))| (*k, n)).collect::<Vec<_>>()
            })?
            else {
                continue;
            };
            let meta = match fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let in_use = own.as_ref() == Some(&path)
                || File::open(&path)
                    .and_then(|f| take_lock(&f))
                    .is_ok_and(|free| !free);
            for (key, n) in records {
                if !seen.insert(key) {
                    continue;
                }
                out.push(Object {
                    hash: format!("sha256:{}", hex::encode(key)),
                    path: path.clone(),
                    kind: Kind::Packed,
                    size: n + RECORD_HEADER,
                    disk: n + RECORD_HEADER,
                    mtime: meta.modified().ok(),
                    in_use,
                });
            }
        }
        Ok(out)
    }

    /// Unpack every sealed pack (one no daemon holds) into loose objects, each with its
    /// pack's mtime (the time of its last append: no object gets older than it is), made
    /// durable, then remove the pack. Returns how many packs were unpacked. Run by `gc`
    /// before it applies the retention, which then judges every object alike.
    pub fn unpack_sealed(&self) -> io::Result<usize> {
        let mut n = 0;
        for path in self.pack_paths()? {
            let f = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(with_path(e, "cannot open", &path)),
            };
            if !take_lock(&f)? {
                continue;
            }
            let meta = f.metadata()?;
            let mtime = meta.modified()?;
            let records = scan(&f, meta.len()).map_err(|e| with_path(e, "cannot read", &path))?;
            for (key, off, len) in records {
                let hex = hex::encode(key);
                if self.locate(&hex).is_some() {
                    continue;
                }
                let mut frame = vec![0u8; len as usize];
                f.read_exact_at(&mut frame, off)?;
                let (tmp, out) = self.temp(&hex)?;
                let r = (|| {
                    out.write_all_at(&frame, 0)?;
                    out.set_modified(mtime)?;
                    out.sync_data()
                })();
                self.commit(r, &tmp, &hex, Kind::Zstd)?;
            }
            // Every object is loose and durable (its directory entry too) before the pack goes.
            File::open(&self.dir).and_then(|d| Ok(rustix::fs::syncfs(&d)?))?;
            fs::remove_file(&path).map_err(|e| with_path(e, "cannot remove", &path))?;
            lock(&self.scanned).remove(&path);
            n += 1;
        }
        Ok(n)
    }
}
