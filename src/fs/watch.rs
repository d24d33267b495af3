//! Cache invalidation for changes made to the workspace outside the mount.
//!
//! The kernel caches entries and attributes for [`LONG_TTL`] (and file pages across opens),
//! which is only safe if it hears about changes it did not make. Every directory the
//! kernel learns children of is marked with fanotify (directory marks report their
//! children's creation, deletion, renames, writes and attribute changes, with the child's
//! name); a thread reads the events and tells the kernel which entries and inodes to drop
//! (FUSE notify `inval_entry`/`inval_inode`). Events caused by the daemon itself (its pid)
//! are skipped: the kernel already knows what it asked for.
//!
//! When fanotify is not available (no `CAP_SYS_ADMIN`, a filesystem without file handles,
//! a mark limit), the watcher degrades and every later reply carries the short TTL.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::{sys, Fs};

/// TTL when changes outside the mount are watched.
pub const LONG_TTL: Duration = Duration::from_secs(30);
/// TTL when they are not (no watcher, or a directory could not be marked).
pub const SHORT_TTL: Duration = Duration::from_secs(1);

/// What the watcher asks of the kernel (implemented over fuser's `Notifier`).
pub trait Invalidate: Send + Sync {
    fn inval_entry(&self, parent: u64, name: &OsStr);
    fn inval_inode(&self, nodeid: u64);
}

const MASK: u64 = libc::FAN_MODIFY
    | libc::FAN_ATTRIB
    | libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_DELETE_SELF
    | libc::FAN_MOVE_SELF
    | libc::FAN_EVENT_ON_CHILD
    | libc::FAN_ONDIR;

/// A file handle as fanotify reports it: `handle_type` then the opaque bytes.
type Fid = Vec<u8>;

/// Names in a directory, by the directory's backing (dev, ino).
type DirNames = HashMap<(u64, u64), Vec<Vec<u8>>>;

/// The fanotify group and the directories marked in it.
pub struct Watcher {
    fan: OwnedFd,
    /// Directory file handle -> backing (dev, ino).
    by_fid: Mutex<HashMap<Fid, (u64, u64)>>,
    /// A mark failed: replies use the short TTL from now on.
    degraded: AtomicBool,
    /// Set once the session exists.
    inval: OnceLock<Box<dyn Invalidate>>,
    /// Files the daemon itself changes outside any request (ledger, its head, the intent
    /// map, the policy, `CLAUDE.md`), by backing directory and name: their events are not
    /// skipped as the daemon's own (the kernel did not ask for those changes).
    own: Mutex<DirNames>,
}

fn fid_of(dir: BorrowedFd<'_>) -> Option<Fid> {
    let (ty, bytes) = sys::name_to_handle(dir, c"", libc::AT_EMPTY_PATH).ok()?;
    let mut v = ty.to_ne_bytes().to_vec();
    v.extend_from_slice(&bytes);
    Some(v)
}

impl Watcher {
    /// A fanotify group, or None when the kernel refuses one.
    pub fn new() -> Option<Watcher> {
        // As without CAP_SYS_ADMIN (tests of the fallback; docs/speed.md).
        if std::env::var_os("INTENTFS_NO_FANOTIFY").is_some_and(|v| v == "1") {
            tracing::info!("INTENTFS_NO_FANOTIFY=1: short cache TTLs, listings not cached");
            return None;
        }
        let fan = sys::fanotify_init(
            libc::FAN_CLASS_NOTIF
                | libc::FAN_CLOEXEC
                | libc::FAN_REPORT_DFID_NAME
                | libc::FAN_UNLIMITED_QUEUE
                | libc::FAN_UNLIMITED_MARKS,
        )
        .map_err(|e| tracing::info!("fanotify unavailable ({e}): short cache TTLs"))
        .ok()?;
        Some(Watcher {
            fan,
            by_fid: Mutex::new(HashMap::new()),
            degraded: AtomicBool::new(false),
            inval: OnceLock::new(),
            own: Mutex::new(HashMap::new()),
        })
    }

    /// The TTL replies may carry now.
    pub fn ttl(&self) -> Duration {
        if self.live() {
            LONG_TTL
        } else {
            SHORT_TTL
        }
    }

    /// Invalidations are delivered and every directory could be marked: the kernel may
    /// cache listings and missing names as long as entries (see [`Fs::caches_listings`]).
    pub fn live(&self) -> bool {
        !self.degraded.load(Ordering::Relaxed) && self.inval.get().is_some()
    }

    /// Watch the directory behind `dir_fd`, whose backing inode is `(dev, ino)` (marking
    /// it again is harmless). Whether it is marked.
    pub fn watch_dir(&self, dev: u64, ino: u64, dir_fd: BorrowedFd<'_>) -> bool {
        let ok = (|| {
            let fid = fid_of(dir_fd)?;
            // The directory is marked as "." below its (O_PATH) handle: fanotify takes no
            // O_PATH descriptor without a path, and "/proc/self/fd/N" cost a walk through
            // procfs for every directory a walk entered.
            let flags = libc::FAN_MARK_ADD | libc::FAN_MARK_ONLYDIR | libc::FAN_MARK_DONT_FOLLOW;
            sys::fanotify_mark(self.fan.as_raw_fd(), flags, MASK, dir_fd.as_raw_fd(), c".")
                .map_err(|e| tracing::warn!("fanotify mark failed ({e}): short cache TTLs"))
                .ok()?;
            self.by_fid.lock().insert(fid, (dev, ino));
            Some(())
        })();
        if ok.is_none() {
            self.degraded.store(true, Ordering::Relaxed);
        }
        ok.is_some()
    }

    /// Install a watcher on `fs` and watch its root (before the kernel asks anything).
    pub fn install(fs: &Fs) {
        let Some(w) = Watcher::new() else { return };
        if fs.watch.set(w).is_err() {
            return;
        }
        if let Ok(fd) = fs.fd(fs.table.root()) {
            fs.watch_dir_fd(fs.table.root(), std::os::fd::AsFd::as_fd(&*fd));
        }
    }

    /// Start delivering invalidations for `fs` (the session's notifier is ready).
    pub fn start(fs: &Arc<Fs>, inval: Box<dyn Invalidate>) {
        let Some(w) = fs.watch.get() else { return };
        if w.inval.set(inval).is_err() {
            return;
        }
        let Ok(fan) = w.fan.try_clone() else {
            w.degraded.store(true, Ordering::Relaxed);
            return;
        };
        let weak = Arc::downgrade(fs);
        let r = std::thread::Builder::new()
            .name("intentfs-watch".into())
            .spawn(move || run(weak, fan));
        if r.is_err() {
            w.degraded.store(true, Ordering::Relaxed);
        }
    }
}

fn run(fs: Weak<Fs>, fan: OwnedFd) {
    let me = std::process::id() as i32;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match sys::read_fd(fan.as_raw_fd(), &mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                tracing::warn!("fanotify read: {e}");
                if let Some(fs) = fs.upgrade() {
                    if let Some(w) = fs.watch.get() {
                        w.degraded.store(true, Ordering::Relaxed);
                    }
                }
                return;
            }
        };
        let Some(fs) = fs.upgrade() else { return };
        let mut off = 0;
        while off + 24 <= n {
            let ev = &buf[off..n];
            let len = ne_u32(&ev[0..4]) as usize;
            if len < 24 || len > ev.len() {
                break;
            }
            let meta_len = ne_u16(&ev[6..8]) as usize;
            let mask = ne_u64(&ev[8..16]);
            let pid = ne_u32(&ev[20..24]) as i32;
            if mask & libc::FAN_Q_OVERFLOW != 0 {
                fs.invalidate_all();
            } else {
                handle(&fs, mask, pid, pid == me, &ev[meta_len.min(len)..len]);
            }
            off += len;
        }
        drop(fs);
        // Let a burst's events gather (and merge) before the next read: while this thread
        // sleeps instead of waiting on the queue, queuing an event wakes nobody. Without
        // it, every file the daemon itself creates or writes woke this thread (about a
        // fifth of the daemon's CPU during `tar x`). Costs a change made outside the mount
        // at most this much more before the kernel hears of it.
        std::thread::sleep(BATCH);
    }
}

/// Native-endian integers out of an event record whose length was checked.
fn ne_bytes<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0; N];
    a.copy_from_slice(&b[..N]);
    a
}

fn ne_u16(b: &[u8]) -> u16 {
    u16::from_ne_bytes(ne_bytes(b))
}

fn ne_u32(b: &[u8]) -> u32 {
    u32::from_ne_bytes(ne_bytes(b))
}

fn ne_u64(b: &[u8]) -> u64 {
    u64::from_ne_bytes(ne_bytes(b))
}

/// How long the watcher lets events gather between reads.
const BATCH: Duration = Duration::from_millis(1);

/// Events that change neither a directory's listing nor which inode a name is.
const CONTENT_ONLY: u64 =
    libc::FAN_MODIFY | libc::FAN_ATTRIB | libc::FAN_EVENT_ON_CHILD | libc::FAN_ONDIR;

/// One event's info records: find the directory fid and the name. `own`: the daemon made
/// the change (skipped unless it is one of its own files, see [`Watcher::own`]).
fn handle(fs: &Fs, mask: u64, pid: i32, own: bool, mut info: &[u8]) {
    while info.len() >= 4 {
        let ty = info[0];
        let len = ne_u16(&info[2..4]) as usize;
        if len < 4 || len > info.len() {
            return;
        }
        let rec = &info[..len];
        info = &info[len..];
        if ty != libc::FAN_EVENT_INFO_TYPE_DFID_NAME && ty != libc::FAN_EVENT_INFO_TYPE_DFID {
            continue;
        }
        // header(4) fsid(8) handle_bytes(4) handle_type(4) f_handle[handle_bytes] name\0
        if rec.len() < 20 {
            continue;
        }
        let hb = ne_u32(&rec[12..16]) as usize;
        if 20 + hb > rec.len() {
            continue;
        }
        let mut fid = rec[16..20].to_vec();
        fid.extend_from_slice(&rec[20..20 + hb]);
        let name = if ty == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
            let raw = &rec[20 + hb..];
            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
            &raw[..end]
        } else {
            &b"."[..]
        };
        let Some(w) = fs.watch.get() else { return };
        let Some(inval) = w.inval.get() else { return };
        let Some(key) = w.by_fid.lock().get(&fid).copied() else {
            continue;
        };
        if mask & libc::FAN_DELETE_SELF != 0 && (name.is_empty() || name == b".") {
            // A watched directory is gone (removed through the mount or behind it; its
            // mark goes with its inode). Its inode number may come back as a new
            // directory, which must then be marked when the kernel next lists it: a new
            // directory has a new node (marked on first use), but a node that now names
            // the number is marked again, and what the kernel holds for it dropped.
            w.by_fid.lock().remove(&fid);
            if let Some(n) = fs.table.by_backing(key.0, key.1) {
                n.watched.store(false, Ordering::Release);
                inval.inval_inode(n.nodeid);
            }
            continue;
        }
        if own
            && !w
                .own
                .lock()
                .get(&key)
                .is_some_and(|names| names.iter().any(|n| n.as_slice() == name))
        {
            continue;
        }
        let Some(dir) = fs.table.by_backing(key.0, key.1) else {
            continue;
        };
        if name.is_empty() || name == b"." {
            inval.inval_inode(dir.nodeid);
            continue;
        }
        let name = OsStr::from_bytes(name);
        // The child's attributes or content, if the kernel knows it.
        if let Ok(dfd) = fs.table.fd(&dir) {
            if let Ok(st) = sys::stat_at(std::os::fd::AsFd::as_fd(&*dfd), name) {
                if let Some(child) = fs.table.by_backing(st.st_dev, st.st_ino) {
                    // With kernel passthrough of data, an agent's writes through the mount
                    // reach the backing file from the agent's own process: the kernel
                    // made them and knows. A writer outside the mount is noted on the
                    // open write handles (recorded at their release).
                    let pt_own = mask & libc::FAN_MODIFY != 0
                        && fs.data_passthrough()
                        && fs.pt_write_seen(&child, pid)
                        && mask & !(libc::FAN_MODIFY | libc::FAN_EVENT_ON_CHILD) == 0;
                    if pt_own {
                        continue;
                    }
                    inval.inval_inode(child.nodeid);
                }
            }
        }
        if mask & !CONTENT_ONLY == 0 {
            continue; // the listing and the name's inode are unchanged
        }
        inval.inval_entry(dir.nodeid, name);
        inval.inval_inode(dir.nodeid);
    }
}

impl Fs {
    /// Replies' TTL for entries and attributes.
    pub fn ttl(&self) -> Duration {
        match self.watch.get() {
            Some(w) => w.ttl(),
            None => SHORT_TTL,
        }
    }

    /// Make sure changes below the directory `node` (reached through `fd`) are watched
    /// before the kernel caches anything below it.
    pub(crate) fn watch_dir_fd(&self, node: &super::inode::Node, fd: BorrowedFd<'_>) {
        if node.watched.load(Ordering::Acquire) {
            return;
        }
        if let Some(w) = self.watch.get() {
            if w.watch_dir(node.dev, node.ino, fd) {
                node.watched.store(true, Ordering::Release);
            }
        }
    }

    /// The kernel may cache directory listings and names that do not exist, as long as
    /// entries: every change outside the mount is reported (see `FuseFs::opendir`).
    pub fn caches_listings(&self) -> bool {
        self.watch.get().is_some_and(Watcher::live)
    }

    /// Files the daemon writes on its own (not for a request): changes to them are
    /// reported to the kernel like changes made outside the mount.
    pub fn daemon_writes(&self, path: &Path) {
        let (Some(w), Some(dir), Some(name)) = (self.watch.get(), path.parent(), path.file_name())
        else {
            return;
        };
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(st) = std::fs::metadata(dir) {
            use std::os::unix::fs::MetadataExt;
            w.own
                .lock()
                .entry((st.dev(), st.ino()))
                .or_default()
                .push(name.as_bytes().to_vec());
        }
    }

    /// A change the daemon made itself, outside any request (a restore): the kernel drops
    /// what it cached of `name` in the directory with backing `dir` (dev, ino), of the
    /// directory, and of the inode the name held before (`child`).
    pub(crate) fn forget_cached(&self, dir: (u64, u64), name: &OsStr, child: Option<(u64, u64)>) {
        let Some(w) = self.watch.get() else { return };
        let Some(inval) = w.inval.get() else { return };
        if let Some(c) = child.and_then(|(d, i)| self.table.by_backing(d, i)) {
            inval.inval_inode(c.nodeid);
        }
        if let Some(d) = self.table.by_backing(dir.0, dir.1) {
            inval.inval_entry(d.nodeid, name);
            inval.inval_inode(d.nodeid);
        }
    }

    /// Overflow: drop everything the kernel may have cached.
    fn invalidate_all(&self) {
        let Some(w) = self.watch.get() else { return };
        let Some(inval) = w.inval.get() else { return };
        for node in self.table.all() {
            inval.inval_inode(node.nodeid);
            for (parent, name) in node.aliases() {
                inval.inval_entry(parent, &name);
            }
        }
    }
}
