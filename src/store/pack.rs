//! Packs: the small objects a mounted daemon keeps, appended to one file of its own (see
//! the store's module documentation for the format), found by every reader, and unpacked
//! into loose objects by `gc` once sealed.
//!
//! A pack is in use while a daemon holds it under an exclusive `flock`: from its making
//! (under a temporary name, locked before it is renamed into place) until the group commit
//! after its seal has made it durable. Sealing dates it now (its mtime), so every object
//! the daemon found in it while it appended there is at least as young as the seal for
//! `gc`, as a loose object refreshed by [`Store::touch`] is.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use super::{
    parse_hash, verified, with_path, Kind, Object, Pack, Scanned, Store, PACKS, PACK_MAGIC,
    RECORD_HEADER, RECORD_MAGIC, SEAL_AFTER, TMP_PREFIX,
};

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
/// power cut left): what comes before it is read. A file that does not start with a pack's
/// header is an error.
fn scan(f: &File, len: u64) -> io::Result<Vec<([u8; 32], u64, u64)>> {
    let mut magic = [0u8; 16];
    if len < magic.len() as u64 {
        return Ok(Vec::new());
    }
    let mut r = io::BufReader::with_capacity(256 * 1024, f);
    r.read_exact(&mut magic)?;
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
        r.read_exact(&mut head)?;
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
        // (Past the frame: within the buffer when it is there.)
        let far = i64::try_from(n).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        r.seek_relative(far)?;
    }
    Ok(out)
}

/// What a loose copy of an object `n` bytes long takes on disk (whole 4 KiB blocks): what
/// a sealed pack's object takes once `gc` unpacked it.
fn loose_disk(n: u64) -> u64 {
    n.div_ceil(4096).max(1) * 4096
}

impl Store {
    fn packs_dir(&self) -> PathBuf {
        self.dir.join(PACKS)
    }

    /// Whether the object `hex` is in the pack this store appends to.
    pub(super) fn in_own_pack(&self, hex: &str) -> bool {
        let pack = self.pack.lock();
        let Some(p) = pack.as_ref() else { return false };
        key_of(hex).is_some_and(|k| p.index.contains_key(&k))
    }

    /// Append the frame `compressed` of the object `hex` to this store's pack (starting
    /// one when there is none, or when it is older than [`SEAL_AFTER`]). One `pwrite`; the
    /// group commit's [`Store::sync`] makes it durable.
    pub(super) fn append_packed(&self, hex: &str, compressed: &[u8]) -> io::Result<()> {
        let key = key_of(hex).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut guard = self.pack.lock();
        if guard
            .as_ref()
            .is_some_and(|p| p.born.elapsed() >= SEAL_AFTER)
        {
            if let Some(old) = guard.take() {
                self.retire(old);
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
                if let Some(old) = guard.take() {
                    self.retire(old);
                }
            }
            return Err(with_path(e, "cannot append to", &self.packs_dir()));
        }
        p.index
            .insert(key, (p.end + RECORD_HEADER, compressed.len() as u64));
        p.end += rec.len() as u64;
        self.pack_unsynced.store(true, Ordering::Release);
        Ok(())
    }

    /// Seal `old`: dated now, its index kept for lookups, and left locked until the next
    /// [`Store::sync`] has made it durable (then gc may unpack it).
    fn retire(&self, old: Pack) {
        if let Err(e) = old.file.set_modified(SystemTime::now()) {
            tracing::warn!(
                "content store: dating the sealed {}: {e}",
                old.path.display()
            );
        }
        self.scans.lock().packs.insert(
            old.path.clone(),
            Scanned {
                len: old.end,
                records: old.index,
            },
        );
        self.retired.lock().push(old.file);
        self.pack_unsynced.store(true, Ordering::Release);
    }

    /// `fdatasync` the pack appended to and every pack sealed since the last call (whose
    /// locks go once they are durable). An error leaves what failed for the next call.
    pub(super) fn sync_packs(&self) -> io::Result<()> {
        if !self.pack_unsynced.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let current = self.pack.lock().as_ref().map(|p| p.file.clone());
        let retired = std::mem::take(&mut *self.retired.lock());
        let mut failed = Vec::new();
        let mut first_err = None;
        for f in current.iter().chain(retired.iter()) {
            if let Err(e) = f.sync_data() {
                first_err.get_or_insert(e);
                failed.push(f.clone());
            }
        }
        if let Some(e) = first_err {
            // (The pack still appended to is synced again anyway: it is not kept twice.)
            let cur = current.as_ref();
            self.retired.lock().extend(
                failed
                    .into_iter()
                    .filter(|f| cur.is_none_or(|c| !Arc::ptr_eq(c, f))),
            );
            self.pack_unsynced.store(true, Ordering::Release);
            return Err(e);
        }
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
        let secs = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = format!(
            "{secs}-{}-{}.pack",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let tmp = dir.join(format!("{TMP_PREFIX}{name}"));
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

    /// The packs in the store, by name (not a pack being made).
    pub(super) fn pack_paths(&self) -> io::Result<Vec<PathBuf>> {
        let dir = self.packs_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(with_path(e, "cannot list", &dir)),
        };
        let mut out: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with(TMP_PREFIX))
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "pack"))
            .collect();
        out.sort();
        Ok(out)
    }

    /// The records of the pack at `path` (hash -> frame offset and length), read now.
    /// None when it is gone.
    fn read_records(path: &Path) -> io::Result<Option<Scanned>> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(with_path(e, "cannot read", path)),
        };
        let len = file.metadata()?.len();
        let records = scan(&file, len)
            .map_err(|e| with_path(e, "cannot read", path))?
            .into_iter()
            .map(|(k, off, n)| (k, (off, n)))
            .collect();
        Ok(Some(Scanned { len, records }))
    }

    /// Look the store's packs over again: the ones gone forgotten, the new ones and those
    /// that grew read (outside the lock). A pack that cannot be read is remembered empty,
    /// at its length, with a warning (looked at again when it changes).
    fn refresh_packs(&self, own: Option<&Path>) {
        let Ok(paths) = self.pack_paths() else { return };
        let stale: Vec<PathBuf> = {
            let mut scans = self.scans.lock();
            scans.packs.retain(|p, _| paths.contains(p));
            paths
                .iter()
                .filter(|p| Some(p.as_path()) != own)
                .filter(|p| {
                    let len = fs::metadata(p).map(|m| m.len()).ok();
                    scans.packs.get(*p).map(|s| s.len) != len
                })
                .cloned()
                .collect()
        };
        for path in stale {
            let scanned = match Self::read_records(&path) {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("content store: skipping a pack: {e}");
                    Scanned {
                        len: fs::metadata(&path).map_or(0, |m| m.len()),
                        records: HashMap::new(),
                    }
                }
            };
            self.scans.lock().packs.insert(path, scanned);
        }
    }

    /// Where `hash`'s frame is in a pack: `(pack, offset, length)`. The packs seen before
    /// are searched first (one `stat` of the pack found); only a miss looks the packs over
    /// again.
    pub(super) fn find_packed(&self, hash: &str) -> Option<(PathBuf, u64, u64)> {
        let key = key_of(parse_hash(hash).ok()?)?;
        let own = match self.pack.lock().as_ref() {
            Some(p) => match p.index.get(&key) {
                Some(&(off, n)) => return Some((p.path.clone(), off, n)),
                None => Some(p.path.clone()),
            },
            None => None,
        };
        let search = |store: &Store| {
            store
                .scans
                .lock()
                .packs
                .iter()
                .filter(|(p, _)| Some(*p) != own.as_ref())
                .find_map(|(p, s)| s.records.get(&key).map(|&(off, n)| (p.clone(), off, n)))
        };
        if let Some(found) = search(self) {
            // (Still there: gc may have unpacked and removed it since it was read.)
            if fs::symlink_metadata(&found.0).is_ok() {
                return Some(found);
            }
        }
        self.refresh_packs(own.as_deref());
        search(self)
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
                self.scans.lock().packs.remove(&path);
                return self.get_loose(hash);
            }
            Err(e) => return Err(with_path(e, "cannot read", &path)),
        };
        let mut frame = vec![0u8; n as usize];
        f.read_exact_at(&mut frame, off)
            .map_err(|e| with_path(e, "cannot read", &path))?;
        let data = zstd::stream::decode_all(&frame[..])
            .map_err(|e| with_path(e, "cannot decompress an object of", &path))?;
        verified(data, hash, &path).map(Some)
    }

    /// Every packed object, as [`Store::objects`] lists them: a hash in several packs
    /// once, `in_use` when a daemon holds one of them. An object of a sealed pack counts
    /// the bytes a loose copy takes (what it takes once `gc` unpacked it). A pack that
    /// cannot be read is skipped with a warning.
    pub(super) fn packed_objects(&self) -> io::Result<Vec<Object>> {
        let mut out: HashMap<[u8; 32], Object> = HashMap::new();
        let own = self.pack.lock().as_ref().map(|p| p.path.clone());
        for path in self.pack_paths()? {
            let scanned = match Self::read_records(&path) {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("content store: skipping a pack: {e}");
                    continue;
                }
            };
            let mtime = fs::metadata(&path).and_then(|m| m.modified()).ok();
            let in_use = own.as_ref() == Some(&path)
                || File::open(&path)
                    .and_then(|f| take_lock(&f))
                    .is_ok_and(|free| !free);
            for (key, (_, n)) in scanned.records {
                let o = out.entry(key).or_insert_with(|| Object {
                    hash: format!("sha256:{}", hex::encode(key)),
                    path: path.clone(),
                    kind: Kind::Packed,
                    size: n,
                    disk: if in_use {
                        n + RECORD_HEADER
                    } else {
                        loose_disk(n)
                    },
                    mtime,
                    in_use,
                });
                // (In use if any copy is; dated by its youngest pack.)
                o.in_use |= in_use;
                o.mtime = o.mtime.max(mtime);
            }
        }
        Ok(out.into_values().collect())
    }

    /// Unpack every sealed pack (one no daemon holds) and remove it: each object not in
    /// `drop` becomes a loose object dated with its pack (the pack's last append, or its
    /// seal), made durable, unless a loose copy is there already (which is dated no older
    /// than the pack); the objects in `drop` are left out (gc removes them this way).
    /// Returns how many packs were unpacked and the hashes left out. A pack that cannot be
    /// read is left as it is, with a warning.
    pub fn unpack_sealed(&self, drop: &HashSet<String>) -> io::Result<(usize, HashSet<String>)> {
        let mut n = 0;
        let mut dropped = HashSet::new();
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
            let records = match scan(&f, meta.len()) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("content store: leaving {} as it is: {e}", path.display());
                    continue;
                }
            };
            for (key, off, len) in records {
                let hex = hex::encode(key);
                if drop.contains(&format!("sha256:{hex}")) {
                    dropped.insert(format!("sha256:{hex}"));
                    continue;
                }
                if let Some((p, _)) = self.locate(&hex) {
                    // (A whole loose copy: kept, dated no older than its pack. An empty one,
                    // which a power cut left, is written again.)
                    if let Ok(m) = fs::metadata(&p) {
                        if m.len() > 0 {
                            if m.modified().is_ok_and(|t| t < mtime) {
                                let _ = File::options()
                                    .write(true)
                                    .open(&p)
                                    .and_then(|lf| lf.set_modified(mtime));
                            }
                            continue;
                        }
                    }
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
            self.scans.lock().packs.remove(&path);
            n += 1;
        }
        Ok((n, dropped))
    }
}
