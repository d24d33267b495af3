//! The governed passthrough core: every FUSE operation as a plain method over node ids,
//! with no fuser types, so it can be driven and tested without FUSE in the loop.
//!
//! Every inode is reached through an `O_PATH|O_NOFOLLOW` handle ([`inode`]); every path
//! operation is `*at(parent_handle, one_name)`; the daemon never resolves a path string
//! against the workspace and never follows a symlink. Every mutating operation asks the
//! [`Guard`] first, with the path the *kernel* currently knows for the directory handle
//! (read back from `/proc/self/fd`), so a directory renamed outside the mount cannot smuggle
//! writes out of scope.

pub mod approve;
mod closer;
pub mod error;
pub mod gate;
mod gitrefs;
pub mod handle;
pub mod hash;
pub mod inode;
mod lesson;
pub mod operator;
pub mod ops;
pub mod output;
pub mod recorder;
mod stale;
pub mod sys;
pub mod temps;
mod versions;
pub mod watch;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

pub use error::{FsError, Result};
use inode::{InodeTable, Node};

use crate::control::CtlFile;
use crate::guard::{Denial, Guard, Identities, Identity, Operation};
use crate::ledger::entry::encoded_len;
use crate::ledger::{Draft, Ledger, MutationType};
pub use gate::Gate;
pub use handle::FileHandle;

/// `--record async`: the entries written after the reply, besides a close's (queued by
/// `Fs::flush` with the hashing that makes it). A change of a file's mode, owner or
/// extended attributes: `tar x` makes one per file and directory, and written before the
/// reply its entry was a fifth of the time `tar` waited for its `fchmod`. Every other entry
/// is written before its reply, as with `--record sync`: `intentfs ledger verify` finds a
/// change whose entry a killed daemon lost by comparing the files the ledger names with the
/// disk (a created file no entry names would be invisible to it, a deletion or truncation
/// is not worth deferring: `rm -rf` measured no faster), while it does not compare modes,
/// owners or attributes: those entries, queued when the daemon is killed, are lost unseen
/// (docs/limits.md).
fn deferrable(mt: MutationType) -> bool {
    matches!(
        mt,
        MutationType::Chmod | MutationType::Chown | MutationType::Xattr
    )
}

/// The part of the absolute path `real` below `root` (both as the kernel writes paths:
/// no `//`, no trailing `/` but the root's), or None when `real` is not at or below it.
fn rel_under<'a>(real: &'a [u8], root: &[u8]) -> Option<&'a OsStr> {
    let rest = real.strip_prefix(root)?;
    let rel = if root == b"/" || rest.is_empty() {
        rest
    } else {
        rest.strip_prefix(b"/")?
    };
    Some(OsStr::from_bytes(rel))
}

/// What an entry takes besides its paths and its agent's name, at most (ids, times,
/// hashes, the intent, the process, the versions; about 400 bytes in all with a short
/// path), and besides the detail of a mode change.
const ENTRY_BYTES: u64 = 1024;

/// A release that `--record async` runs after its reply ([`Fs::release_owed`]).
#[derive(Clone, Copy, Debug)]
pub struct Owed {
    /// The file that owes its entry until then.
    pub key: (u64, u64),
    /// What that entry may take ([`Fs::entry_bytes`]).
    pub bytes: u64,
    /// Whatever the release records is under the names its close fixed (see
    /// [`Fs::release_owed`]).
    pub named: bool,
}

/// An edit by rename whose entry is written after its reply: the content it replaced and
/// the content it put there, read before the rename, and their hashes `(new, old)`; kept
/// in the store and compared for the lines that changed by the job that writes the entry.
pub(crate) struct Kept {
    pub old: Vec<u8>,
    pub new: Vec<u8>,
    pub versions: (Option<String>, Option<String>),
}

/// Room on the recorder for the entry of a change about to be made ([`Fs::defer_slot`]),
/// given back if the change records nothing.
pub(crate) struct Slot {
    bytes: u64,
    fs: Arc<Fs>,
    /// The file changed, which owes the entry once queued.
    key: (u64, u64),
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(r) = self.fs.recorder.get().filter(|_| self.bytes > 0) {
            r.give_back(self.bytes);
        }
    }
}

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A node handed to the kernel: id and attributes.
pub struct Entry {
    pub nodeid: u64,
    pub st: sys::Stat,
}

/// How the kernel should treat an open file.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOpts {
    /// Bypass the page cache (control files).
    pub direct_io: bool,
    /// Keep the page cache from an earlier open.
    pub keep_cache: bool,
    /// A read-only open the daemon needs no per-read decision for (what the identity
    /// saw is recorded at open): the kernel may read the backing file directly.
    pub passthrough: bool,
    /// Nothing to do at close (a read-only handle): the kernel need not send FLUSH, so
    /// `close(2)` does not wait for a round trip.
    pub noflush: bool,
}

/// An open control file: its rendered content, and what was written to it.
pub struct CtlHandle {
    pub file: CtlFile,
    pub content: Vec<u8>,
    pub written: Vec<u8>,
    /// `.intentfs/approval`: the request written to this file, for a human, asked when
    /// the file is read (see `ops::query`).
    pub request: Option<AskAhead>,
    /// The request went to a human; the read re-runs once decided.
    pub asked: bool,
}

/// A question for a human an agent asks ahead (`.intentfs/approval`).
pub struct AskAhead {
    pub kind: crate::guard::identity::GrantKind,
    pub op: Operation,
    pub rel: PathBuf,
    /// The agent's words, cleaned.
    pub reason: String,
}

impl CtlHandle {
    pub fn new(file: CtlFile, content: Vec<u8>) -> CtlHandle {
        CtlHandle {
            file,
            content,
            written: Vec::new(),
            request: None,
            asked: false,
        }
    }
}

/// An open handle of any kind.
pub enum Handle {
    File(Arc<FileHandle>),
    Dir(Arc<Mutex<sys::DirStream>>),
    Control(Arc<Mutex<CtlHandle>>),
}

/// The file at the workspace root lessons are appended to (see `lesson`).
pub const LESSON_FILE: &str = "CLAUDE.md";

/// Operation counters for `.intentfs/status`.
#[derive(Default)]
pub struct Counters {
    pub lookups: AtomicU64,
    /// Listing requests (READDIR/READDIRPLUS) of real directories.
    pub listings: AtomicU64,
    pub opens: AtomicU64,
    /// FUSE requests answered, by opcode.
    pub requests: Requests,
}

macro_rules! ops {
    ($($op:ident => $name:literal),* $(,)?) => {
        /// The FUSE requests the daemon answers, as counted in [`Requests`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op { $($op),* }
        impl Op {
            /// Every opcode, in the order of [`Op::name`].
            pub const ALL: &'static [Op] = &[$(Op::$op),*];
            /// The opcode as the kernel names it (`FUSE_` dropped, lower case).
            pub fn name(self) -> &'static str {
                match self { $(Op::$op => $name),* }
            }
        }
    };
}

ops! {
    Lookup => "lookup", Forget => "forget", Getattr => "getattr", Setattr => "setattr",
    Readlink => "readlink", Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink",
    Rmdir => "rmdir", Symlink => "symlink", Rename => "rename", Link => "link",
    Open => "open", Read => "read", Write => "write", Flush => "flush",
    Release => "release", Fsync => "fsync", Opendir => "opendir", Readdir => "readdir",
    Readdirplus => "readdirplus", Releasedir => "releasedir", Fsyncdir => "fsyncdir",
    Ioctl => "ioctl", Statfs => "statfs", Setxattr => "setxattr", Getxattr => "getxattr",
    Listxattr => "listxattr", Removexattr => "removexattr", Access => "access",
    Create => "create", Fallocate => "fallocate", Lseek => "lseek",
    CopyFileRange => "copy_file_range",
}

/// How many requests of each opcode the daemon answered: each is a round trip between
/// the kernel and the daemon, which is most of what a walk or a build pays for the mount
/// (`.intentfs/status` `counters.requests`; `bench/run.sh` reports them per workload).
/// A batched FORGET counts once per inode it names.
pub struct Requests([AtomicU64; Op::ALL.len()]);

impl Default for Requests {
    fn default() -> Requests {
        Requests(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Requests {
    pub fn count(&self, op: Op) {
        self.0[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, op: Op) -> u64 {
        self.0[op as usize].load(Ordering::Relaxed)
    }

    /// `{"total": n, "lookup": n, ...}` with the opcodes seen so far.
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        let mut total = 0;
        for &op in Op::ALL {
            let n = self.get(op);
            total += n;
            if n > 0 {
                m.insert(op.name().to_owned(), n.into());
            }
        }
        m.insert("total".to_owned(), total.into());
        serde_json::Value::Object(m)
    }
}

/// Settings of one mount.
pub struct FsConfig {
    pub workspace: PathBuf,
    pub mountpoint: PathBuf,
    pub policy_path: PathBuf,
    /// Most `O_PATH` handles kept open at once.
    pub fd_cap: usize,
}

/// The passthrough core: the inode table, open handles and the backing syscalls. Every
/// operation reads resolve → [`Gate::authorize`] → syscall → [`Gate::record`]; what is
/// allowed and what is on record is the [`gate`]'s.
pub struct Fs {
    pub(crate) table: InodeTable,
    pub(crate) proc_fd: OwnedFd,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// Governance: rules, identities, ledger, approvals, breaker.
    pub gate: Gate,
    pub counters: Counters,
    pub cfg: FsConfig,
    /// Content hashes by stamp, shared by stale checks, read records and the ledger.
    pub(crate) hashes: hash::HashCache,
    /// Who wrote each open-for-write inode last, and its stamp after that write.
    pub(crate) last_writer: Mutex<HashMap<(u64, u64), (String, crate::guard::stale::Stamp)>>,
    /// The workspace's real path as last seen, to turn `/proc/self/fd` links into
    /// workspace-relative paths.
    root_path: parking_lot::RwLock<PathBuf>,
    pub started: i64,
    /// Watches the workspace for changes made outside the mount (cache invalidation).
    pub watch: std::sync::OnceLock<watch::Watcher>,
    /// Kernel passthrough was negotiated (and has not failed).
    pub passthrough: AtomicBool,
    /// `--data passthrough` was negotiated: every regular file's reads and writes go to
    /// the backing file in the kernel, and governance of data moves to open, close,
    /// truncate, rename and unlink (see `docs/passthrough.md`).
    pub data_passthrough: AtomicBool,
    /// The mount's own device (`st_dev` of its files as the kernel shows them): a
    /// mapping of a passthrough file names it ([`Fs::set_mount_dev`]).
    pub(crate) mount_dev: std::sync::OnceLock<u64>,
    /// With kernel passthrough of data: write opens and creates hold it shared from their
    /// authorization until their handle is counted, an intent switch exclusively from its
    /// WRITES_OPEN check until the switch is on record, so a switch cannot land between a
    /// write open's decision under the old intent and its handle.
    pub(crate) intent_switch: parking_lot::RwLock<()>,
    /// Held by a request that may change what `git am --abort` reads (`ORIG_HEAD`, the
    /// markers of an am session), from its checks through its change, so an am session
    /// and a change of `ORIG_HEAD` are never both judged against the other's old state
    /// (see [`Fs::am_lock`]).
    pub(crate) am_state: parking_lot::Mutex<()>,
    /// How requests reach the daemon (`/dev/fuse`, `io-uring (...)`), once mounted.
    pub transport: std::sync::OnceLock<String>,
    /// `--low-latency`: told of every request (`node` is where nearly all of them start).
    pub low_latency: std::sync::OnceLock<Arc<crate::latency::LowLatency>>,
    /// The live OTLP export's counters (`.intentfs/status`), when it runs.
    pub otlp: std::sync::OnceLock<Arc<crate::telemetry::Stats>>,
    /// The content store and what was decided about recent versions.
    pub(crate) versions: versions::Versions,
    /// Writes a close's entry after its reply (see [`recorder`]), when on.
    pub(crate) recorder: std::sync::OnceLock<recorder::Recorder>,
    /// This filesystem, for the recorder's jobs (set by [`Fs::start_recorder`]).
    me: std::sync::OnceLock<std::sync::Weak<Fs>>,
    /// The paths named by renames answered before their entry (see `Fs::rename`), with
    /// how many: an entry about to be written now that names one of them waits for theirs.
    deferred_paths: Mutex<HashMap<PathBuf, u32>>,
    /// Signalled when a deferred rename's entry is on record.
    deferred_done: parking_lot::Condvar,
    /// Renames answered before their entry, not yet on record (`deferred_paths`' count).
    deferred_renames: std::sync::atomic::AtomicUsize,
    /// Renames answered before their entry since the mount (`.intentfs/status`).
    pub(crate) renames_deferred: AtomicU64,
}

impl Fs {
    pub fn new(
        cfg: FsConfig,
        guard: Arc<Guard>,
        ids: Arc<Identities>,
        ledger: Option<Ledger>,
    ) -> std::io::Result<Fs> {
        let root_fd = sys::open_root(&cfg.workspace)?;
        let root_path = sys::fd_path(root_fd.as_fd())?;
        let table = InodeTable::new(root_fd, cfg.fd_cap)?;
        Ok(Fs {
            table,
            proc_fd: sys::open_proc_self_fd()?,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            gate: Gate::new(guard, ids, ledger),
            counters: Counters::default(),
            cfg,
            hashes: hash::HashCache::default(),
            last_writer: Mutex::new(HashMap::new()),
            root_path: parking_lot::RwLock::new(root_path),
            started: chrono::Utc::now().timestamp(),
            watch: std::sync::OnceLock::new(),
            passthrough: AtomicBool::new(false),
            data_passthrough: AtomicBool::new(false),
            mount_dev: std::sync::OnceLock::new(),
            intent_switch: parking_lot::RwLock::new(()),
            am_state: parking_lot::Mutex::new(()),
            transport: std::sync::OnceLock::new(),
            low_latency: std::sync::OnceLock::new(),
            otlp: std::sync::OnceLock::new(),
            versions: versions::Versions::default(),
            recorder: std::sync::OnceLock::new(),
            me: std::sync::OnceLock::new(),
            deferred_paths: Mutex::new(HashMap::new()),
            deferred_done: parking_lot::Condvar::new(),
            deferred_renames: std::sync::atomic::AtomicUsize::new(0),
            renames_deferred: AtomicU64::new(0),
        })
    }

    /// The inode number `stat` reports for a node: its node id, which is the backing
    /// file's inode number whenever that is free (see `InodeTable::lookup`), so `git`'s
    /// index and other tools that remember inode numbers see the workspace's own; and for
    /// the root (node id 1 by FUSE's rule) the workspace root's. Entry replies carry the
    /// node id as the number (fuser sends one for both), so this must agree with it.
    pub fn st_ino(&self, nodeid: u64, st: &sys::Stat) -> u64 {
        if nodeid == inode::ROOT {
            st.st_ino
        } else {
            nodeid
        }
    }

    // ----- handles -----------------------------------------------------------------

    pub(crate) fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, h);
        fh
    }

    /// The mount's device, once mounted (see [`Fs::mount_dev`]).
    pub fn set_mount_dev(&self, dev: u64) {
        let _ = self.mount_dev.set(dev);
    }

    /// Kernel passthrough of file data is on (`--data passthrough`, negotiated).
    pub fn data_passthrough(&self) -> bool {
        self.data_passthrough.load(Ordering::Relaxed)
    }

    /// `--record async`: entries are written after their reply (see [`recorder`]).
    pub fn start_recorder(self: &Arc<Self>) -> std::io::Result<()> {
        if self.recorder.get().is_none() {
            let _ = self.recorder.set(recorder::Recorder::start()?);
        }
        if let Some(r) = self.recorder.get() {
            self.table.set_recorder(r.waker().clone());
        }
        let _ = self.me.set(Arc::downgrade(self));
        Ok(())
    }

    /// When a close's entry is written (`--record`).
    pub fn record_mode(&self) -> recorder::RecordMode {
        if self.recorder.get().is_some() {
            recorder::RecordMode::Async
        } else {
            recorder::RecordMode::Sync
        }
    }

    /// Return once every entry owed by the recorder is on record (at once with `--record
    /// sync`): before an intent switch, a status, the unmount.
    pub fn settle_records(&self) {
        if let Some(r) = self.recorder.get() {
            r.drain();
        }
    }

    /// `--record async` with closes still to record.
    pub(crate) fn records_owed(&self) -> bool {
        self.recorder
            .get()
            .is_some_and(|r| r.stats.queued.load(Ordering::Acquire) > 0)
    }

    /// Wait until the entries owed for `node`'s file are on record (before a change of its
    /// attributes, links or extended attributes is made and recorded).
    pub(crate) fn settled(&self, node: &inode::Node) {
        if self.recorder.get().is_some() {
            self.table.wait_settled((node.dev, node.ino));
        }
    }

    /// How regular files' data travels, as the log and `.intentfs/status` say it.
    pub fn data_mode(&self) -> &'static str {
        if self.data_passthrough() {
            "passthrough"
        } else {
            "daemon"
        }
    }

    /// Whether a write handle on `rel` bypasses the daemon: with kernel passthrough of
    /// data, every one but a git state file's that names commits or commands (each of its
    /// writes is checked as text, see [`gitrefs::is_commit_list`]).
    pub(crate) fn pt_writes(&self, rel: &Path) -> bool {
        self.data_passthrough() && !gitrefs::is_commit_list(rel)
    }

    /// The open write handles of the identity with `key` (with kernel passthrough of data,
    /// its writes through them no longer reach the daemon).
    pub(crate) fn write_handles_of(&self, key: &str) -> Vec<Arc<FileHandle>> {
        self.handles
            .lock()
            .values()
            .filter_map(|h| match h {
                Handle::File(f) if f.writable && f.identity.key == key => Some(f.clone()),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn file_handle(&self, fh: u64) -> Result<Arc<FileHandle>> {
        match self.handles.lock().get(&fh) {
            Some(Handle::File(f)) => Ok(f.clone()),
            _ => error::err(libc::EBADF),
        }
    }

    pub(crate) fn dir_handle(&self, fh: u64) -> Result<Arc<Mutex<sys::DirStream>>> {
        match self.handles.lock().get(&fh) {
            Some(Handle::Dir(d)) => Ok(d.clone()),
            _ => error::err(libc::EBADF),
        }
    }

    pub(crate) fn ctl_handle(&self, fh: u64) -> Option<Arc<Mutex<CtlHandle>>> {
        match self.handles.lock().get(&fh) {
            Some(Handle::Control(c)) => Some(c.clone()),
            _ => None,
        }
    }

    pub(crate) fn take_handle(&self, fh: u64) -> Option<Handle> {
        self.handles.lock().remove(&fh)
    }

    // ----- nodes and paths ---------------------------------------------------------

    pub(crate) fn node(&self, nodeid: u64) -> Result<Arc<Node>> {
        if let Some(l) = self.low_latency.get() {
            l.tick();
        }
        self.table.get(nodeid).ok_or(FsError::Os(libc::ENOENT))
    }

    pub(crate) fn fd(&self, node: &Arc<Node>) -> Result<Arc<OwnedFd>> {
        Ok(self.table.fd(node)?)
    }

    /// The workspace-relative path of a directory node, as the kernel knows it now.
    pub(crate) fn dir_rel(&self, dir: &Arc<Node>) -> Result<PathBuf> {
        if dir.nodeid == inode::ROOT {
            return Ok(PathBuf::new());
        }
        // (The path below the root, or the whole path when it is not below it.)
        let found = {
            let root = self.root_path.read();
            sys::dir_path(
                self.proc_fd.as_fd(),
                (dir.dev, dir.ino),
                || self.table.fd(dir),
                |real| match rel_under(real, root.as_os_str().as_bytes()) {
                    Some(rel) => Ok(PathBuf::from(rel)),
                    None => Err(PathBuf::from(OsStr::from_bytes(real))),
                },
            )?
        };
        let real = match found {
            Ok(rel) => return Ok(rel),
            Err(real) => real,
        };
        // The workspace itself may have moved: refresh and retry once.
        let root_fd = self.fd(self.table.root())?;
        let root = sys::fd_path_in(self.proc_fd.as_fd(), root_fd.as_fd())?;
        *self.root_path.write() = root.clone();
        match real.strip_prefix(&root) {
            Ok(rel) => Ok(rel.to_path_buf()),
            // The directory is no longer inside the workspace (moved out from outside the
            // mount): nothing under it may change through the mount.
            Err(_) => error::err(libc::EXDEV),
        }
    }

    /// Workspace-relative path of `parent/name`.
    pub(crate) fn child_rel(&self, parent: &Arc<Node>, name: &OsStr) -> Result<PathBuf> {
        Ok(self.dir_rel(parent)?.join(name))
    }

    /// Every verified workspace-relative path of a node (one per known hard link name that
    /// still names this very inode).
    pub(crate) fn node_rels(&self, node: &Arc<Node>) -> Result<Vec<PathBuf>> {
        if node.is_dir() {
            return Ok(vec![self.dir_rel(node)?]);
        }
        let mut out = Vec::new();
        for (parent, name) in node.aliases() {
            let Some(p) = self.table.get(parent) else {
                continue;
            };
            let Ok(pfd) = self.fd(&p) else { continue };
            match sys::stat_at(pfd.as_fd(), &name) {
                Ok(st) if st.st_dev == node.dev && st.st_ino == node.ino => {
                    if let Ok(rel) = self.child_rel(&p, &name) {
                        out.push(rel);
                    }
                }
                _ => {}
            }
        }
        if node.is_reg() {
            self.add_remembered(node, &mut out);
            // None known any more (the kernel forgot the directory above it while a
            // handle kept the file, as a mapping does): where an open handle of it is now,
            // for a file with one name.
            if out.is_empty() {
                let fd = node.held_fd();
                let handles = node.open_file_handles();
                let fds = fd
                    .as_deref()
                    .map(AsFd::as_fd)
                    .into_iter()
                    .chain(handles.iter().map(|h| h.file.as_fd()));
                if let Some(rel) = fds.into_iter().find_map(|fd| self.sole_name_of(node, fd)) {
                    out.push(rel);
                }
            }
        }
        if out.is_empty() {
            return error::err(libc::ESTALE);
        }
        Ok(out)
    }

    /// The workspace path of a file with one name, from a handle of it (`/proc/self/fd`),
    /// when that path names it from the workspace root now.
    pub(crate) fn sole_name_of(
        &self,
        node: &Node,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Option<PathBuf> {
        let st = sys::stat_fd(fd).ok()?;
        if st.st_dev != node.dev || st.st_ino != node.ino || st.st_nlink != 1 {
            return None;
        }
        let real = sys::fd_path_in(self.proc_fd.as_fd(), fd).ok()?;
        let root = self.root_path.read().clone();
        let rel = real.strip_prefix(&root).ok()?.to_path_buf();
        let root_fd = self.fd(self.table.root()).ok()?;
        sys::stat_beneath(root_fd.as_fd(), &rel)
            .ok()
            .filter(|now| now.st_dev == node.dev && now.st_ino == node.ino)
            .map(|_| rel)
    }

    /// Add to `out` the names a file had when the kernel last forgot it that still name it
    /// (see `Node::remembered`): checked from the workspace root, without following a
    /// symlink.
    fn add_remembered(&self, node: &Node, out: &mut Vec<PathBuf>) {
        let remembered = node.remembered.lock().clone();
        if remembered.is_empty() {
            return;
        }
        let Ok(root) = self.fd(self.table.root()) else {
            return;
        };
        for rel in remembered {
            if !out.contains(&rel)
                && sys::stat_beneath(root.as_fd(), &rel)
                    .is_ok_and(|st| st.st_dev == node.dev && st.st_ino == node.ino)
            {
                out.push(rel);
            }
        }
    }

    /// Every name the daemon knows for a node, as workspace-relative paths (no syscalls,
    /// but for a file forgotten and looked up again with names remembered).
    pub(crate) fn alias_rels(&self, node: &Node) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for (parent, name) in node.aliases() {
            let Some(p) = self.table.get(parent) else {
                continue;
            };
            let Some(pp) = self.table.path_of(&p) else {
                continue;
            };
            let rel = pp.join(&name);
            if !out.contains(&rel) {
                out.push(rel);
            }
        }
        if node.is_reg() {
            self.add_remembered(node, &mut out);
        }
        if out.is_empty() {
            out.push(self.display_rel(node));
        }
        out
    }

    /// The path of a node for display and read-side checks (no syscalls).
    pub(crate) fn display_rel(&self, node: &Node) -> PathBuf {
        self.table.path_of(node).unwrap_or_default()
    }

    // ----- governance (see [`gate`]) -------------------------------------------------

    /// May the caller change `rel` (op `op`)? Returns the caller's identity.
    pub(crate) fn authorize(
        &self,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        is_dir: bool,
    ) -> Result<Arc<Identity>> {
        let ident = self.gate.ids.resolve(caller.pid);
        self.authorize_as(&ident, caller, op, rel, is_dir)?;
        Ok(ident)
    }

    /// [`Gate::authorize`], letting go of deleted files' space when the ledger's disk is full.
    pub(crate) fn authorize_as(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        is_dir: bool,
    ) -> Result<()> {
        self.gate
            .authorize(ident, caller, op, rel, is_dir)
            .inspect_err(|e| self.on_ledger_failure(e))?;
        // What `git am --abort` reads (the request holds `am_state`, see `Fs::am_lock`).
        self.check_am_name(ident, caller, op, rel)
    }

    /// [`Gate::record`], letting go of deleted files' space when the ledger's disk is full.
    pub(crate) fn record(
        &self,
        ident: &Identity,
        caller: &Caller,
        mt: MutationType,
        rel: &Path,
        mut draft: Draft,
    ) -> Result<()> {
        // A rename answered before its entry, naming this path: its entry comes first.
        // (Waited for alone, not with the jobs queued before it, which may need a stale
        // lock the caller holds; bounded, so no pattern of locks can hang a request on it.
        // The requests that make a name, which nothing else orders after the rename, wait
        // earlier and without a bound: `Fs::wait_deferred`.)
        if self.deferred_renames.load(Ordering::Acquire) != 0 && !recorder::is_recorder() {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let mut paths = self.deferred_paths.lock();
            let named = |paths: &HashMap<PathBuf, u32>| {
                paths.contains_key(rel)
                    || draft.from.as_ref().is_some_and(|f| paths.contains_key(f))
            };
            let rec = self.recorder.get().map(recorder::Recorder::waker);
            if recorder::wait_while(rec, &self.deferred_done, &mut paths, named, Some(until)) {
                tracing::warn!(path = %rel.display(), "an entry naming a path renamed before it waited 2 s for the rename's entry: written now");
            }
        }
        // Every content hash the entry names resolves in the store, or the entry says why.
        self.note_versions(rel, &mut draft);
        self.gate
            .record(ident, caller, mt, rel, draft)
            .inspect_err(|e| self.on_ledger_failure(e))
    }

    /// `--record async`: room on the recorder for the entry of a change of `rel` about to
    /// be made by `ident`, when the entry is [`deferrable`] and the queue has room for it
    /// (see [`recorder`]: what the ledger's reserve can take). Taken before the change is
    /// made; `extra`: what the entry's detail takes beyond [`ENTRY_BYTES`].
    pub(crate) fn defer_slot(
        &self,
        mt: MutationType,
        node: &inode::Node,
        ident: &Identity,
        rel: &Path,
        extra: u64,
    ) -> Option<Slot> {
        let (rec, fs) = self.deferring(mt)?;
        let bytes = Fs::entry_bytes([rel], ident) + extra;
        // (`then`, not `then_some`: a Slot built and dropped gives its bytes back.)
        rec.take(bytes, self.deferrable_bytes()).then(|| Slot {
            bytes,
            fs,
            key: (node.dev, node.ino),
        })
    }

    /// What the entries queued on the recorder may take together now: see
    /// [`Ledger::deferrable_bytes`].
    pub(crate) fn deferrable_bytes(&self) -> u64 {
        self.gate
            .ledger
            .as_ref()
            .map_or(u64::MAX, Ledger::deferrable_bytes)
    }

    /// [`Fs::record`] of a change made to a file. `--record async`, with a `slot` taken
    /// before the change was made ([`Fs::defer_slot`]): the entry is written by the
    /// recorder, after the reply, in the order the changes were answered; the file owes it
    /// until then, so its next change waits for it (as after a close, see [`recorder`]).
    /// Who made the change and under which intent are taken now. Without a slot (the
    /// ledger could not be written when the change was authorized, or its reserve has no
    /// room for more queued entries), the entry is written now, as with `--record sync`.
    pub(crate) fn record_change(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        mt: MutationType,
        rel: &Path,
        mut draft: Draft,
        slot: Option<Slot>,
    ) -> Result<()> {
        let (Some(mut slot), Some(rec)) = (slot.filter(|_| deferrable(mt)), self.recorder.get())
        else {
            return self.record(ident, caller, mt, rel, draft);
        };
        if draft.agent.is_none() {
            draft.agent = Some(self.gate.agent(ident, caller));
        }
        let intent = ident.intent();
        let (ident, caller, rel) = (ident.clone(), *caller, rel.to_path_buf());
        let key = slot.key;
        self.table.owe(key, &ident.key);
        let bytes = std::mem::take(&mut slot.bytes);
        slot.fs.record_later(rec, Some(key), bytes, move |fs| {
            fs.record_queued(&ident, &caller, mt, &rel, draft, intent);
        });
        Ok(())
    }

    /// A queued entry written, on the recorder ([`Fs::record`] with the intent taken when
    /// the change was answered); a failure is said and counted ([`Fs::rec_failed`]).
    fn record_queued(
        &self,
        ident: &Identity,
        caller: &Caller,
        mt: MutationType,
        rel: &Path,
        mut draft: Draft,
        intent: Option<String>,
    ) {
        self.note_versions(rel, &mut draft);
        if let Err(e) = self.gate.record_as(ident, caller, mt, rel, draft, intent) {
            self.on_ledger_failure(&e);
            self.rec_failed(mt.as_str(), rel, &e);
        }
    }

    /// What the entry of a change of `paths` by `ident` takes in the ledger at most: its
    /// names, the agent's name and intent, and [`ENTRY_BYTES`] (a detail of at most that
    /// size included; a `WRITE`'s line ranges are not counted).
    pub(crate) fn entry_bytes<'a>(
        paths: impl IntoIterator<Item = &'a Path>,
        ident: &Identity,
    ) -> u64 {
        let names: usize = paths.into_iter().map(encoded_len).sum();
        let intent = ident.intent().map_or(0, |i| encoded_len(Path::new(&i)));
        ENTRY_BYTES + (names + encoded_len(Path::new(&ident.name)) + intent) as u64
    }

    /// An entry the recorder could not write (`what`: which, of `path`): said in the
    /// daemon log and counted in `.intentfs/status` (`counters.record.failures`).
    pub(crate) fn rec_failed(&self, what: &str, path: &Path, e: &FsError) {
        if let Some(r) = self.recorder.get() {
            r.stats.failures.fetch_add(1, Ordering::Relaxed);
        }
        tracing::error!(
            error = ?e,
            path = %path.display(),
            "--record async: the entry of {what} could not be written"
        );
    }

    /// `--record async`, an entry [`deferrable`], off the recorder's own thread, with a
    /// ledger that can be written: the recorder and this filesystem, to write it later.
    fn deferring(&self, mt: MutationType) -> Option<(&recorder::Recorder, Arc<Fs>)> {
        deferrable(mt).then(|| self.later()).flatten()
    }

    /// [`Fs::deferring`] of any entry.
    fn later(&self) -> Option<(&recorder::Recorder, Arc<Fs>)> {
        let rec = self.recorder.get()?;
        if recorder::is_recorder()
            || self
                .gate
                .ledger
                .as_ref()
                .is_some_and(|l| l.health().is_err())
        {
            return None;
        }
        Some((rec, self.me.get()?.upgrade()?))
    }

    /// Wait until no rename answered before its entry names `rel` (see `Fs::rename`): for a
    /// request about to make a name, before it holds any lock (the entry waited for needs
    /// none, and the jobs before it need none this request holds), so without a bound.
    pub(crate) fn wait_deferred(&self, rel: &Path) {
        if self.deferred_renames.load(Ordering::Acquire) == 0 || recorder::is_recorder() {
            return;
        }
        let mut paths = self.deferred_paths.lock();
        let named = |p: &HashMap<PathBuf, u32>| p.contains_key(rel);
        let rec = self.recorder.get().map(recorder::Recorder::waker);
        recorder::wait_while(rec, &self.deferred_done, &mut paths, named, None);
    }

    /// `--record async`, off the recorder's own thread, with a ledger that can be written:
    /// room on the recorder for the `RENAME` entry of `from` to `to` by `ident`, to be
    /// written after the rename's reply (see `Fs::rename`); `key`: the file renamed.
    pub(crate) fn rename_slot(
        &self,
        ident: &Identity,
        from: &Path,
        to: &Path,
        key: (u64, u64),
    ) -> Option<Slot> {
        let (rec, fs) = self.later()?;
        let bytes = Fs::entry_bytes([from, to], ident) + crate::ledger::ranges::RANGES_BYTES;
        rec.take(bytes, self.deferrable_bytes())
            .then(|| Slot { bytes, fs, key })
    }

    /// Queue the entry of a rename already made, answered before it is written: the
    /// renamed file and both names (`keys`, their stale locks held by the caller) owe it,
    /// and an entry naming either path waits for it (see [`Fs::record`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_rename_later(
        &self,
        mut slot: Slot,
        keys: Vec<(u64, u64)>,
        ident: &Arc<Identity>,
        caller: &Caller,
        (from, to): (PathBuf, PathBuf),
        mut draft: Draft,
        keep: Option<Kept>,
    ) {
        let Some(rec) = self.recorder.get() else {
            return;
        };
        self.table.owe_held(&keys, &ident.key);
        {
            let mut paths = self.deferred_paths.lock();
            *paths.entry(from.clone()).or_default() += 1;
            *paths.entry(to.clone()).or_default() += 1;
            self.deferred_renames.fetch_add(1, Ordering::AcqRel);
        }
        self.renames_deferred.fetch_add(1, Ordering::Relaxed);
        if draft.agent.is_none() {
            draft.agent = Some(self.gate.agent(ident, caller));
        }
        let intent = ident.intent();
        let (ident, caller) = (ident.clone(), *caller);
        let bytes = std::mem::take(&mut slot.bytes);
        let fs = slot.fs.clone();
        drop(slot);
        rec.queue_held(
            Box::new(move || {
                if let Some(k) = keep {
                    if let (Some(hn), Some(ho)) = &k.versions {
                        fs.keep_bytes(&to, &k.old, ho);
                        fs.keep_bytes(&to, &k.new, hn);
                    }
                    draft.ranges = crate::ledger::changed_ranges(&k.old, &k.new);
                }
                fs.record_queued(&ident, &caller, MutationType::Rename, &to, draft, intent);
                {
                    let mut paths = fs.deferred_paths.lock();
                    for p in [&from, &to] {
                        if let Some(n) = paths.get_mut(p) {
                            *n -= 1;
                            if *n == 0 {
                                paths.remove(p);
                            }
                        }
                    }
                    fs.deferred_renames.fetch_sub(1, Ordering::AcqRel);
                }
                fs.deferred_done.notify_all();
                for k in keys {
                    fs.table.settle(k);
                }
            }),
            bytes,
        );
    }

    /// Handles on files deleted outside the mount would keep their space allocated on the
    /// ledger's full disk: let them go.
    fn on_ledger_failure(&self, e: &FsError) {
        if gate::is_ledger_failure(e) {
            self.table.evict_regular();
        }
    }

    /// May the caller change this existing node? Every known name of a hard-linked file
    /// must be allowed, and all its names must be known.
    pub(crate) fn authorize_node(
        &self,
        caller: &Caller,
        op: Operation,
        node: &Arc<Node>,
    ) -> Result<(Arc<Identity>, PathBuf)> {
        let (ident, rels) = self.authorize_node_names(caller, op, node)?;
        Ok((ident, rels.into_iter().next().unwrap_or_default()))
    }

    /// [`Fs::authorize_node`], returning every current name of the node (verified
    /// against the backing directory; never empty).
    pub(crate) fn authorize_node_names(
        &self,
        caller: &Caller,
        op: Operation,
        node: &Arc<Node>,
    ) -> Result<(Arc<Identity>, Vec<PathBuf>)> {
        let ident = self.gate.ids.resolve(caller.pid);
        let rels = self.node_rels(node)?;
        for rel in &rels {
            self.authorize_as(&ident, caller, op, rel, node.is_dir())?;
        }
        // A name that decides what git runs, in a directory laid out as a git directory.
        for (parent, name) in node.aliases() {
            let Some(p) = self.table.get(parent) else {
                continue;
            };
            let special = gitrefs::special_name(&name)
                || p.aliases()
                    .iter()
                    .any(|(_, n)| n == "hooks" || n == "worktrees" || n == "info");
            if special {
                if let (Ok(pfd), Ok(prel)) = (self.fd(&p), self.dir_rel(&p)) {
                    self.check_git_layout(&ident, caller, op, pfd.as_fd(), &prel, &name)?;
                }
            }
        }
        if node.is_reg() {
            let fd = self.fd(node)?;
            let st = sys::stat_fd(fd.as_fd())?;
            if st.st_nlink as usize > rels.len() {
                let d = Denial::new(
                    crate::guard::Code::ScopeViolation,
                    op,
                    &rels[0],
                    ident.intent().as_deref(),
                    format!(
                        "{} has {} hard links and {} of its names are unknown to the mount, so changing it could \
                         change a file outside the scope",
                        rels[0].display(),
                        st.st_nlink,
                        st.st_nlink as usize - rels.len()
                    ),
                    "Do not modify hard-linked files; copy the file to a new name inside your scope and change the copy."
                        .into(),
                );
                return Err(self.gate.deny(&ident, caller, d));
            }
        }
        Ok((ident, rels))
    }
}

#[cfg(test)]
mod rel_tests {
    use super::rel_under;
    use std::ffi::OsStr;

    /// A directory's path below the workspace root, by bytes: at the root, below it, and
    /// never a sibling whose name only starts with the root's.
    #[test]
    fn a_path_is_under_the_root_only_at_a_separator() {
        fn r<'a>(real: &'a str, root: &str) -> Option<&'a OsStr> {
            rel_under(real.as_bytes(), root.as_bytes())
        }
        assert_eq!(r("/w/ws", "/w/ws"), Some(OsStr::new("")));
        assert_eq!(r("/w/ws/a/b", "/w/ws"), Some(OsStr::new("a/b")));
        assert_eq!(r("/w/wsx/a", "/w/ws"), None);
        assert_eq!(r("/w", "/w/ws"), None);
        assert_eq!(r("/other/a", "/w/ws"), None);
        assert_eq!(r("/a/b", "/"), Some(OsStr::new("a/b")));
        assert_eq!(r("/", "/"), Some(OsStr::new("")));
    }
}
