//! The content store: the bytes behind the ledger's content hashes, so a `content_hash` or
//! `prev_content_hash` can be turned back into the file it names (diff, restore, rewind).
//!
//! Layout: `<dir>/<first 2 hex>/<other 62 hex>.zst` (one zstd frame of the whole content)
//! or `.raw` (a reflink clone made with `FICLONE`, uncompressed: it shares the file's
//! blocks, so it costs no copy and no space until the file changes). The name is the
//! SHA-256 the ledger records (`"sha256:<64 hex>"`), so equal contents are one object.
//!
//! A mounted daemon appends the small objects it keeps to a pack instead ([`Store::use_packs`]):
//! `<dir>/packs/<name>.pack`, a header then records of `"IOBJ"`, 4 bytes of flags, the
//! 32-byte SHA-256 and the frame's length (little-endian u64), each followed by its zstd
//! frame. One `pwrite` per object instead of a file made, written and renamed; one
//! `fdatasync` of the pack per group commit instead of a `syncfs` (the edit loop with new
//! content: 206 → 183 ms). The daemon holds its pack under an exclusive `flock` and seals it
//! after [`SEAL_AFTER`] (then starts another); `gc` judges packed objects as loose ones and
//! unpacks a sealed pack into loose objects, less those it removes
//! ([`Store::unpack_sealed`]), so every rule below holds for packed objects too. Readers
//! find an object loose or in any pack.
//!
//! A loose object is complete or absent: written under a temporary name in its directory, then
//! renamed into place. A daemon killed at any point leaves either no object or the whole
//! one (and at worst a `.tmp.*` file, which [`Store::sweep_temps`] removes). Callers write
//! the object before the ledger entry that names it.
//!
//! Durability against a power cut: by default each object is `fdatasync`'d before its
//! rename. A mounted daemon defers it instead ([`Store::defer_sync`]): the ledger's group
//! commit calls [`Store::sync`] (one `syncfs` of the store's filesystem) before each
//! `fdatasync` of the ledger, so an entry that is durable names durable objects, and a
//! syscall does not wait for a disk flush per new object (about 5 ms each on the virtual
//! disk measured, against 0.25 ms for the rest of a put). An object a power cut caught
//! half-written is empty (ext4's delayed allocation) and counts as absent: it is written
//! again by the next put of its content.
//!
//! No knowledge of FUSE, intents or the policy: bytes and hashes in, bytes out.

pub mod gc;
mod pack;

#[cfg(test)]
mod tests;

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::ledger::sha256_bytes;

/// zstd level. Objects are compressed on the write path (before the entry naming them),
/// so speed wins over size: on the benchmark's 24.6 MB of Rust sources, level 1 compresses
/// at 468 MB/s to 6.5x, level 3 (zstd's default) at 320 MB/s to 7.5x; compressing was the
/// largest single cost of `tar x` through the mount at level 3 (12% of the daemon's CPU).
const LEVEL: i32 = 1;
/// Streaming buffer for files compressed from disk.
const BUF: usize = 256 * 1024;
/// The hash of empty content: every created file's first version. Always "present"
/// (nothing to keep), so a `tar x` of 10,000 files costs no object and no syscall for it.
pub const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// Prefix of a temporary object name (an interrupted put leaves one behind).
const TMP_PREFIX: &str = ".tmp.";
/// The directory of the packs, in the store.
const PACKS: &str = "packs";
/// A pack's first bytes.
const PACK_MAGIC: &[u8; 16] = b"intentfs pack 1\n";
/// A record's first bytes.
const RECORD_MAGIC: &[u8; 4] = b"IOBJ";
/// A record's header: magic, flags (0), SHA-256, the frame's length.
const RECORD_HEADER: u64 = 4 + 4 + 32 + 8;
/// Objects larger than this (compressed) stay loose files even when packing.
const PACK_MAX_OBJECT: usize = 1 << 20;
/// A daemon's pack is sealed this long after it was started (the next put starts another):
/// half of gc's [`gc::GRACE`], so every object older than the grace is in a sealed pack,
/// which gc may unpack.
pub const SEAL_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// How an object is kept on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A zstd frame of the content.
    Zstd,
    /// A reflink clone of the file (uncompressed, sharing blocks with it).
    Raw,
    /// A zstd frame in a pack.
    Packed,
}

impl Kind {
    fn ext(self) -> &'static str {
        match self {
            Kind::Zstd | Kind::Packed => "zst",
            Kind::Raw => "raw",
        }
    }
}

/// The pack a daemon appends to.
#[derive(Debug)]
struct Pack {
    path: PathBuf,
    /// Open for writing, under an exclusive `flock` (released when closed): `gc` leaves a
    /// locked pack alone.
    file: std::sync::Arc<File>,
    /// Where the next record goes.
    end: u64,
    born: std::time::Instant,
    /// The objects in it: where each frame starts, and its length.
    index: std::collections::HashMap<[u8; 32], (u64, u64)>,
}

/// The packs a store has read, by path.
#[derive(Debug, Default)]
struct Scans {
    packs: std::collections::HashMap<PathBuf, Scanned>,
}

/// One pack as a reader found it: its length when scanned, and where each of its objects'
/// frames is (offset, length).
#[derive(Debug, Default)]
struct Scanned {
    len: u64,
    records: std::collections::HashMap<[u8; 32], (u64, u64)>,
}

/// What `put_*` did, for counters and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// The object was already there (deduplicated: nothing written).
    Present,
    /// Written as a zstd frame.
    Compressed,
    /// Written as a reflink clone.
    Cloned,
}

/// Counters of one open store (status, benchmarks, tests).
#[derive(Default, Debug)]
pub struct Counters {
    /// Objects written (compressed or cloned).
    pub written: AtomicU64,
    /// Puts answered by an object already present.
    pub deduplicated: AtomicU64,
    /// Objects written as reflink clones.
    pub cloned: AtomicU64,
    /// Content bytes written (before compression).
    pub bytes_in: AtomicU64,
    /// Bytes on disk of the objects written.
    pub bytes_out: AtomicU64,
}

/// A content store rooted at one directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    /// Distinguishes this process's temporary names from each other.
    seq: AtomicU64,
    /// Whether `FICLONE` may still work here: off after the first "not supported" (most
    /// filesystems: ext4, tmpfs, overlayfs), so the fallback costs one failed ioctl.
    reflink: std::sync::atomic::AtomicBool,
    /// Objects are made durable by [`Store::sync`], not one `fdatasync` each.
    deferred: std::sync::atomic::AtomicBool,
    /// Objects were written since the last [`Store::sync`].
    unsynced: std::sync::atomic::AtomicBool,
    /// Small objects go to a pack ([`Store::use_packs`]).
    packing: std::sync::atomic::AtomicBool,
    /// The pack being appended to, once the first object went to one.
    pack: parking_lot::Mutex<Option<Pack>>,
    /// Records were appended (or a pack sealed) since the last [`Store::sync`].
    pack_unsynced: std::sync::atomic::AtomicBool,
    /// Packs sealed and not yet made durable: still locked (gc leaves them alone) until
    /// [`Store::sync`] has synced them.
    retired: parking_lot::Mutex<Vec<std::sync::Arc<File>>>,
    /// The packs read, by path (read again when their length changed).
    scans: parking_lot::Mutex<Scans>,
    pub counters: Counters,
}

/// The 64 hex digits of a ledger hash string, lowercase, or an error naming what is wrong.
pub fn parse_hash(hash: &str) -> io::Result<&str> {
    let hex = hash.strip_prefix("sha256:").unwrap_or(hash);
    if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(hex)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{hash:?} is not a content hash (expected \"sha256:\" and 64 lowercase hex digits)"
            ),
        ))
    }
}

/// The store directory of a workspace for readers (`gc`, `diff`, `restore`...): the one
/// the last `MOUNT` entry of its ledger names (`detail.store`, what `--store` chose), else
/// the default, `<workspace>/.orchestration/objects`.
pub fn dir_of(workspace: &Path, ledger: &Path) -> PathBuf {
    crate::ledger::read_entries(ledger)
        .ok()
        .and_then(|entries| {
            entries.into_iter().rev().find_map(|(_, e)| {
                (e.mutation_type == crate::ledger::MutationType::Mount)
                    .then(|| e.detail?.get("store")?.as_str().map(PathBuf::from))
                    .flatten()
            })
        })
        .unwrap_or_else(|| Store::default_dir(workspace))
}

impl Store {
    /// `<workspace>/.orchestration/objects`
    pub fn default_dir(workspace: &Path) -> PathBuf {
        workspace.join(".orchestration").join("objects")
    }

    /// Open (creating, mode 0700) the store at `dir`.
    pub fn open(dir: &Path) -> io::Result<Store> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| with_path(e, "cannot create the content store", dir))?;
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("content store {} is not a directory", dir.display()),
            ));
        }
        Ok(Store::at(dir))
    }

    /// Open an existing store read-only (for CLI readers); Ok(None) when absent.
    pub fn open_existing(dir: &Path) -> io::Result<Option<Store>> {
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(Some(Store::at(dir))),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("content store {} is not a directory", dir.display()),
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(with_path(e, "cannot read the content store", dir)),
        }
    }

    fn at(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
            seq: AtomicU64::new(0),
            reflink: std::sync::atomic::AtomicBool::new(true),
            deferred: std::sync::atomic::AtomicBool::new(false),
            unsynced: std::sync::atomic::AtomicBool::new(false),
            packing: std::sync::atomic::AtomicBool::new(false),
            pack: parking_lot::Mutex::new(None),
            pack_unsynced: std::sync::atomic::AtomicBool::new(false),
            retired: Default::default(),
            scans: Default::default(),
            counters: Counters::default(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// From now on, leave objects' durability to [`Store::sync`] (called by the ledger's
    /// group commit before it makes entries durable) instead of one `fdatasync` per object.
    pub fn defer_sync(&self) {
        self.deferred.store(true, Ordering::Relaxed);
    }

    /// From now on, append small objects to a pack of this process's (see the module's
    /// documentation) instead of writing a file for each.
    pub fn use_packs(&self) {
        self.packing.store(true, Ordering::Relaxed);
    }

    /// Make every object written since the last call durable: one `fdatasync` of the pack
    /// appended to, and one `syncfs` of the store's filesystem when loose objects were
    /// written (nothing when none was written).
    pub fn sync(&self) -> io::Result<()> {
        self.sync_packs()?;
        if !self.unsynced.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let r = File::open(&self.dir).and_then(|d| Ok(rustix::fs::syncfs(&d)?));
        if r.is_err() {
            self.unsynced.store(true, Ordering::Release);
        }
        r
    }

    /// Make a just-written object file durable, now or at the next [`Store::sync`].
    fn durable(&self, f: &File) -> io::Result<()> {
        if self.deferred.load(Ordering::Relaxed) {
            self.unsynced.store(true, Ordering::Release);
            Ok(())
        } else {
            f.sync_data()
        }
    }

    /// Where the object for `hex` (64 digits) of `kind` lives.
    fn object_path(&self, hex: &str, kind: Kind) -> PathBuf {
        self.dir
            .join(&hex[..2])
            .join(format!("{}.{}", &hex[2..], kind.ext()))
    }

    /// The object file for `hash` and how it is kept, if present.
    pub fn locate(&self, hash: &str) -> Option<(PathBuf, Kind)> {
        let hex = parse_hash(hash).ok()?;
        [Kind::Raw, Kind::Zstd].into_iter().find_map(|k| {
            let p = self.object_path(hex, k);
            p.exists().then_some((p, k))
        })
    }

    /// Whether the object for `hash` is present (loose or in a pack; loose looked at again
    /// after the packs: gc may have unpacked it meanwhile).
    pub fn has(&self, hash: &str) -> bool {
        hash == EMPTY
            || self.locate(hash).is_some()
            || self.find_packed(hash).is_some()
            || self.locate(hash).is_some()
    }

    /// Whether the object for `hash` is present, refreshing its mtime when it is: a put
    /// that reuses an object counts as a use for gc ([`gc`]'s age), so a gc running beside
    /// the daemon does not remove an object an entry is about to name.
    pub fn touch(&self, hash: &str) -> bool {
        if hash == EMPTY {
            return true;
        }
        let Ok(hex) = parse_hash(hash) else {
            return false;
        };
        // In the pack being appended to: a locked pack, which gc leaves alone.
        if self.in_own_pack(hex) {
            return true;
        }
        let now = rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        };
        let times = rustix::fs::Timestamps {
            last_access: now,
            last_modification: now,
        };
        [Kind::Zstd, Kind::Raw].into_iter().any(|k| {
            let p = self.object_path(hex, k);
            // An empty object file is one a power cut caught before its data reached the
            // disk (no content's object is empty: the empty content has none): absent.
            match fs::symlink_metadata(&p) {
                Ok(m) if m.len() > 0 => {}
                _ => return false,
            }
            rustix::fs::utimensat(
                rustix::fs::CWD,
                &p,
                &times,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .is_ok()
        })
    }

    /// Store bytes; returns their hash. Deduplicated (no write when present).
    pub fn put_bytes(&self, data: &[u8]) -> io::Result<String> {
        let hash = sha256_bytes(data);
        self.put_bytes_hashed(data, &hash)?;
        Ok(hash)
    }

    /// Count a put answered by an object already there: found by the put itself, or known
    /// to the caller, which stored (or refreshed) it so lately (see `fs::versions`).
    pub fn reused(&self) {
        self.counters.deduplicated.fetch_add(1, Ordering::Relaxed);
    }

    /// Store bytes whose hash the caller already computed (the filesystem hashed them for
    /// the ledger): no second hash. The caller vouches that `hash` is theirs.
    pub fn put_bytes_hashed(&self, data: &[u8], hash: &str) -> io::Result<Put> {
        let hex = parse_hash(hash)?;
        if self.touch(hash) {
            self.reused();
            return Ok(Put::Present);
        }
        let compressed = compress_bytes(data)?;
        if self.packing.load(Ordering::Relaxed) && compressed.len() <= PACK_MAX_OBJECT {
            match self.append_packed(hex, &compressed) {
                Ok(()) => {
                    self.count_written(data.len() as u64, compressed.len() as u64, false);
                    return Ok(Put::Compressed);
                }
                // (Kept as a loose object instead; the pack is given up for the next.)
                Err(e) => tracing::warn!("content store: cannot append to a pack: {e}"),
            }
        }
        let (tmp, f) = self.temp(hex)?;
        let r = (|| {
            f.write_all_at(&compressed, 0)?;
            self.durable(&f)
        })();
        self.commit(r, &tmp, hex, Kind::Zstd)?;
        self.count_written(data.len() as u64, compressed.len() as u64, false);
        Ok(Put::Compressed)
    }

    /// Store the content of an open file whose hash the caller knows (reflink when the
    /// filesystem allows, else zstd); no-op when present.
    pub fn put_file(&self, file: &File, hash: &str) -> io::Result<()> {
        self.put_file_counted(file, hash).map(|_| ())
    }

    /// [`Store::put_file`], saying what it did. The file is read with `pread` (its offset
    /// is untouched). When compressing, the bytes are hashed as they stream and an object
    /// whose bytes do not match `hash` (the file changed since the caller hashed it) is
    /// not kept: an `InvalidData` error says so. A clone is checked by the file's stamp
    /// (size, mtime, ctime) not moving across the clone.
    pub fn put_file_counted(&self, file: &File, hash: &str) -> io::Result<Put> {
        let hex = parse_hash(hash)?;
        if self.touch(hash) {
            self.reused();
            return Ok(Put::Present);
        }
        if self.reflink.load(Ordering::Relaxed) {
            if let Some(size) = self.try_clone(file, hex)? {
                self.count_written(size, size, true);
                return Ok(Put::Cloned);
            }
        }
        let (tmp, f) = self.temp(hex)?;
        let (got, size, on_disk) = match compress_into(file, &f).and_then(|r| {
            self.durable(&f)?;
            Ok(r)
        }) {
            Ok(r) => r,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        if got != hex {
            let _ = fs::remove_file(&tmp);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the file changed while it was stored: its bytes hash to sha256:{got}, not {hash}"),
            ));
        }
        self.commit(Ok(()), &tmp, hex, Kind::Zstd)?;
        self.count_written(size, on_disk, false);
        Ok(Put::Compressed)
    }

    /// Store the content of an open file whose hash the caller does not know, hashing it
    /// as it is stored (one read of the file, not one to hash and one to store); returns
    /// the hash. The caller checks the file did not change meanwhile (its stamp) before
    /// taking the hash as the file's.
    pub fn put_file_hashing(&self, file: &File) -> io::Result<(String, Put)> {
        let (tmp, f) = self.temp_in(&self.dir, "unhashed")?;
        let r = compress_into(file, &f).and_then(|r| {
            self.durable(&f)?;
            Ok(r)
        });
        let (hex, size, on_disk) = match r {
            Ok(r) => r,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let hash = format!("sha256:{hex}");
        if self.touch(&hash) {
            let _ = fs::remove_file(&tmp);
            self.reused();
            return Ok((hash, Put::Present));
        }
        let sub = self.dir.join(&hex[..2]);
        if let Err(e) = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&sub)
        {
            let _ = fs::remove_file(&tmp);
            return Err(with_path(e, "cannot create", &sub));
        }
        self.commit(Ok(()), &tmp, &hex, Kind::Zstd)?;
        self.count_written(size, on_disk, false);
        Ok((hash, Put::Compressed))
    }

    /// A reflink clone of `file` as the object `hex`: `Ok(Some(size))` when made,
    /// `Ok(None)` when this filesystem cannot clone (the caller compresses instead).
    fn try_clone(&self, file: &File, hex: &str) -> io::Result<Option<u64>> {
        let before = file.metadata()?;
        let (tmp, f) = self.temp(hex)?;
        if let Err(e) = rustix::fs::ioctl_ficlone(&f, file) {
            let _ = fs::remove_file(&tmp);
            // Not supported here (EOPNOTSUPP, EINVAL), or across filesystems (EXDEV): stop
            // trying for this store. Anything else (EBADF...) is worth the next attempt.
            if matches!(
                e,
                rustix::io::Errno::OPNOTSUPP
                    | rustix::io::Errno::INVAL
                    | rustix::io::Errno::XDEV
                    | rustix::io::Errno::NOSYS
                    | rustix::io::Errno::NOTTY
            ) {
                self.reflink.store(false, Ordering::Relaxed);
            }
            return Ok(None);
        }
        let after = file.metadata()?;
        use std::os::unix::fs::MetadataExt;
        let same = before.len() == after.len()
            && (before.mtime(), before.mtime_nsec()) == (after.mtime(), after.mtime_nsec())
            && (before.ctime(), before.ctime_nsec()) == (after.ctime(), after.ctime_nsec());
        if !same {
            let _ = fs::remove_file(&tmp);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the file changed while it was cloned into the content store",
            ));
        }
        let r = self.durable(&f);
        self.commit(r, &tmp, hex, Kind::Raw)?;
        Ok(Some(after.len()))
    }

    /// The content for `hash`, or None when not kept. The bytes are checked against the
    /// hash: a damaged object is an `InvalidData` error, never wrong content.
    pub fn get(&self, hash: &str) -> io::Result<Option<Vec<u8>>> {
        parse_hash(hash)?;
        if hash == EMPTY {
            return Ok(Some(Vec::new()));
        }
        match self.get_loose(hash) {
            Ok(Some(d)) => Ok(Some(d)),
            Ok(None) => match self.get_packed(hash)? {
                Some(d) => Ok(Some(d)),
                // (gc may have unpacked it between the two looks.)
                None => self.get_loose(hash),
            },
            // A damaged loose copy (an empty one a power cut left): a packed copy may be
            // whole.
            Err(e) => match self.get_packed(hash) {
                Ok(Some(d)) => Ok(Some(d)),
                _ => Err(e),
            },
        }
    }

    /// [`Store::get`] of a loose object.
    fn get_loose(&self, hash: &str) -> io::Result<Option<Vec<u8>>> {
        let Some((path, kind)) = self.locate(hash) else {
            return Ok(None);
        };
        let data = match kind {
            Kind::Raw => match fs::read(&path) {
                Ok(d) => d,
                // Removed (gc) between locate and read.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(with_path(e, "cannot read object", &path)),
            },
            Kind::Zstd | Kind::Packed => {
                let f = match File::open(&path) {
                    Ok(f) => f,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(with_path(e, "cannot read object", &path)),
                };
                let mut out = Vec::new();
                zstd::stream::Decoder::new(f)?
                    .read_to_end(&mut out)
                    .map_err(|e| with_path(e, "cannot decompress object", &path))?;
                out
            }
        };
        verified(data, hash, &path).map(Some)
    }

    /// Every object present: `(hash, path, bytes on disk)`, in no particular order. A
    /// packed object's path is its pack's.
    pub fn objects(&self) -> io::Result<Vec<Object>> {
        let mut packed: std::collections::HashMap<String, Object> = self
            .packed_objects()?
            .into_iter()
            .map(|o| (o.hash.clone(), o))
            .collect();
        let mut out = self.loose_objects()?;
        // An object both loose and packed is listed once, as the loose file, in use if a
        // daemon holds a pack with it.
        for o in &mut out {
            if let Some(p) = packed.remove(&o.hash) {
                o.in_use |= p.in_use;
            }
        }
        out.extend(packed.into_values());
        Ok(out)
    }

    /// The loose objects, as [`Store::objects`] lists them.
    fn loose_objects(&self) -> io::Result<Vec<Object>> {
        let mut out = Vec::new();
        let top = match fs::read_dir(&self.dir) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(with_path(e, "cannot list the content store", &self.dir)),
        };
        for sub in top {
            let sub = sub?;
            let prefix = sub.file_name().to_string_lossy().into_owned();
            if prefix.len() != 2 || !sub.file_type()?.is_dir() {
                continue;
            }
            for e in fs::read_dir(sub.path())? {
                let e = e?;
                let name = e.file_name().to_string_lossy().into_owned();
                let Some((rest, kind)) = name
                    .strip_suffix(".zst")
                    .map(|r| (r, Kind::Zstd))
                    .or_else(|| name.strip_suffix(".raw").map(|r| (r, Kind::Raw)))
                else {
                    continue;
                };
                let hash = format!("sha256:{prefix}{rest}");
                if parse_hash(&hash).is_err() {
                    continue;
                }
                let meta = match e.metadata() {
                    Ok(m) => m,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                use std::os::unix::fs::MetadataExt;
                out.push(Object {
                    hash,
                    path: e.path(),
                    kind,
                    size: meta.len(),
                    disk: meta.blocks() * 512,
                    mtime: meta.modified().ok(),
                    in_use: false,
                });
            }
        }
        Ok(out)
    }

    /// Remove the object for `hash` (both forms, if both exist). Ok(false) when absent.
    pub fn remove(&self, hash: &str) -> io::Result<bool> {
        let hex = parse_hash(hash)?;
        let mut removed = false;
        for k in [Kind::Raw, Kind::Zstd] {
            match fs::remove_file(self.object_path(hex, k)) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }

    /// Remove temporary files older than `age` (left by a put a crash interrupted; a
    /// younger one may be a put in progress). Returns how many were removed.
    pub fn sweep_temps(&self, age: std::time::Duration) -> io::Result<usize> {
        let mut n = 0;
        let Ok(top) = fs::read_dir(&self.dir) else {
            return Ok(0);
        };
        let now = std::time::SystemTime::now();
        // The store's own directory (puts that hash as they write) and each prefix one.
        let dirs = std::iter::once(self.dir.clone()).chain(
            top.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
        for sub in dirs {
            for e in fs::read_dir(sub)?.flatten() {
                if !e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                    continue;
                }
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|d| d >= age);
                if old && fs::remove_file(e.path()).is_ok() {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// A new temporary file in `hex`'s directory (created 0700 if needed), mode 0600.
    fn temp(&self, hex: &str) -> io::Result<(PathBuf, File)> {
        self.temp_in(&self.dir.join(&hex[..2]), &hex[2..])
    }

    /// A new temporary file in `sub` (created 0700 if needed), mode 0600, its name
    /// unique to this process and put.
    fn temp_in(&self, sub: &Path, stem: &str) -> io::Result<(PathBuf, File)> {
        let name = format!(
            "{TMP_PREFIX}{stem}.{}.{}",
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        );
        let path = sub.join(name);
        let open = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
        };
        let f = match open() {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(sub)
                    .map_err(|e| with_path(e, "cannot create", sub))?;
                open().map_err(|e| with_path(e, "cannot create", &path))?
            }
            Err(e) => return Err(with_path(e, "cannot create", &path)),
        };
        Ok((path, f))
    }

    /// After writing `tmp` (`r`: how that went), rename it into place or remove it.
    /// Two puts of the same content racing both rename: the second replaces identical
    /// bytes, atomically, so a reader sees one complete object either way.
    fn commit(&self, r: io::Result<()>, tmp: &Path, hex: &str, kind: Kind) -> io::Result<()> {
        let r = r.and_then(|()| fs::rename(tmp, self.object_path(hex, kind)));
        if r.is_err() {
            let _ = fs::remove_file(tmp);
        }
        r.map_err(|e| with_path(e, "cannot write object", &self.object_path(hex, kind)))
    }

    fn count_written(&self, bytes_in: u64, bytes_out: u64, cloned: bool) {
        let c = &self.counters;
        c.written.fetch_add(1, Ordering::Relaxed);
        c.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        c.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        if cloned {
            c.cloned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One object of a store, as [`Store::objects`] lists it.
#[derive(Clone, Debug)]
pub struct Object {
    pub hash: String,
    pub path: PathBuf,
    pub kind: Kind,
    /// The object file's length.
    pub size: u64,
    /// Bytes it takes on disk (a clone shares its blocks with the file; counted anyway; an
    /// object of a sealed pack, what its loose copy will take once `gc` unpacked it).
    pub disk: u64,
    pub mtime: Option<std::time::SystemTime>,
    /// In a pack a daemon is appending to: not removable now (see [`SEAL_AFTER`]).
    pub in_use: bool,
}

/// Compress `file` (read with `pread` from offset 0 to its end) into `out` as one zstd
/// frame, hashing the bytes as they pass: `(hex of the bytes' SHA-256, bytes read, bytes
/// written)`. The caller makes `out` durable.
fn compress_into(file: &File, out: &File) -> io::Result<(String, u64, u64)> {
    let mut hasher = Sha256::new();
    let mut enc = zstd::stream::Encoder::new(BufWriter::with_capacity(BUF, out), LEVEL)?;
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
        enc.write_all(&buf[..n])?;
        off += n as u64;
    }
    enc.finish()?.flush()?;
    let written = out.metadata()?.len();
    Ok((hex::encode(hasher.finalize()), off, written))
}

thread_local! {
    /// One zstd context per thread, reused: making one per object (about 100 KB of tables
    /// allocated and cleared) cost a third of the compression time of `tar x`'s small files.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// `data` as one zstd frame at [`LEVEL`], with this thread's context.
fn compress_bytes(data: &[u8]) -> io::Result<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        let comp = match &mut *c {
            Some(comp) => comp,
            None => c.insert(zstd::bulk::Compressor::new(LEVEL)?),
        };
        comp.compress(data)
    })
}

/// `data`, read from `path` for the object `hash`, when it hashes to that name; a damaged
/// object is an error naming where it was read, never wrong content.
fn verified(data: Vec<u8>, hash: &str, path: &Path) -> io::Result<Vec<u8>> {
    if sha256_bytes(&data) != format!("sha256:{}", parse_hash(hash)?) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "object {hash} in {} is damaged: its content does not hash to its name",
                path.display()
            ),
        ));
    }
    Ok(data)
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}
