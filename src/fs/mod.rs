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
mod gitrefs;
pub mod hash;
pub mod inode;
mod lesson;
pub mod operator;
pub mod ops;
pub mod output;
mod stale;
pub mod sys;
pub mod temps;
pub mod watch;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

pub use error::{FsError, Result};
use inode::{InodeTable, Node};

use crate::control::CtlFile;
use crate::guard::identity::GrantKind;
use crate::guard::{Denial, Guard, Identities, Identity};
use crate::ledger::{Draft, Ledger, MutationType};

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

/// An open regular file.
pub struct FileHandle {
    pub file: std::fs::File,
    pub node: Arc<Node>,
    pub identity: Arc<Identity>,
    /// The caller that opened it (for the ledger entry at close).
    pub caller: Caller,
    /// Opened with write access.
    pub writable: bool,
    /// Changed (written, truncated, created) since the last ledger entry.
    pub dirty: AtomicBool,
    /// Written through `write`/`fallocate`/`copy_file_range` since the last entry.
    pub wrote: AtomicBool,
    /// This handle created the file.
    pub created: AtomicBool,
    /// The file's stamp after this handle's last own write (or its open): a different
    /// stamp at the next write means someone else wrote in between.
    pub expected: Mutex<Option<crate::guard::stale::Stamp>>,
    /// The first read was recorded as "seen" for the identity.
    pub read_recorded: AtomicBool,
    /// What the file held was recorded for the identity without a read request (at
    /// open, see `Fs::record_read_provisional`); a read request that comes still records
    /// exactly what it returned.
    pub provisional: AtomicBool,
    /// The pre-image was taken (at an `O_TRUNC` open, or before the first write).
    pub pre_captured: AtomicBool,
    /// Content before this handle's writes (text files up to 1 MiB), for line ranges.
    pub pre_image: Mutex<Option<Vec<u8>>>,
    /// `(intent, policy generation)` the handle's writes were authorized under: a switch of
    /// intent or a policy reload re-checks before the next write.
    pub epoch: Mutex<(Option<String>, u64)>,
    /// Hash of the content before this handle's writes, when known.
    pub prev_hash: Mutex<Option<String>>,
    /// The file's workspace path when last known (at open, then at each entry): the name
    /// a WRITE is recorded under if the file lost every name while open (renamed over or
    /// deleted before close).
    pub last_rel: Mutex<PathBuf>,
    /// The handle changed the content itself (write, truncate through it, fallocate,
    /// copy_file_range) since it was opened.
    pub own_writes: AtomicBool,
    /// The file's names at open: what the identity sees through this handle is recorded
    /// under them too, even if another identity renames the file over or away before the
    /// first read (the agent reached the file through one of them).
    pub open_rels: Vec<PathBuf>,
    /// The content hash taken while the handle writes the file front to back (large
    /// files: no full hashing at close).
    pub seq: Mutex<hash::SeqHash>,
    /// The last write check found the file changed since this handle's previous write
    /// (by anyone, the identity included): the in-order hash no longer holds.
    pub disturbed: AtomicBool,
    /// Names this handle's entries in the ledger: its `CREATE` or `WRITE_BEGIN` (written
    /// before the first byte lands) and the `WRITE` that completes it carry it as
    /// `detail.handle`, so content a crash leaves is attributed to the handle that wrote it.
    pub token: String,
    /// Its `CREATE` or `WRITE_BEGIN` is on record.
    pub begun: AtomicBool,
    /// A rebase todo list: every write is checked not to add commands to run.
    pub todo: bool,
}

/// An open control file: its rendered content, and what was written to it.
pub struct CtlHandle {
    pub file: CtlFile,
    pub content: Vec<u8>,
    pub written: Vec<u8>,
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
    pub mutations: AtomicU64,
    pub denials: AtomicU64,
    /// Refused probes of tools (see [`Fs::deny`]).
    pub probes: AtomicU64,
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

/// The filesystem core.
pub struct Fs {
    pub(crate) table: InodeTable,
    pub(crate) proc_fd: OwnedFd,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    pub guard: Arc<Guard>,
    pub ids: Arc<Identities>,
    pub ledger: Option<Ledger>,
    pub counters: Counters,
    pub cfg: FsConfig,
    /// Content hashes by stamp, shared by stale checks, read records and the ledger.
    pub hashes: hash::HashCache,
    /// Who decides when a human is asked.
    pub approver: approve::Approver,
    /// Circuit breaker settings.
    pub breaker: crate::guard::identity::Breaker,
    /// Who wrote each open-for-write inode last, and its stamp after that write.
    pub(crate) last_writer: Mutex<HashMap<(u64, u64), (String, crate::guard::stale::Stamp)>>,
    /// The workspace's real path as last seen, to turn `/proc/self/fd` links into
    /// workspace-relative paths.
    root_path: Mutex<PathBuf>,
    pub started: i64,
    /// Watches the workspace for changes made outside the mount (cache invalidation).
    pub watch: std::sync::OnceLock<watch::Watcher>,
    /// Kernel passthrough was negotiated (and has not failed).
    pub passthrough: AtomicBool,
    /// `--low-latency`: told of every request (`node` is where nearly all of them start).
    pub low_latency: std::sync::OnceLock<Arc<crate::latency::LowLatency>>,
    /// Tools' temporaries next to in-scope files (see [`temps`]).
    pub temps: temps::Temps,
    /// Build output summaries under way (see [`output`]).
    pub bursts: output::Bursts,
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
            guard,
            ids,
            ledger,
            counters: Counters::default(),
            cfg,
            hashes: hash::HashCache::default(),
            approver: approve::Approver::Deny,
            breaker: Default::default(),
            last_writer: Mutex::new(HashMap::new()),
            root_path: Mutex::new(root_path),
            started: chrono::Utc::now().timestamp(),
            watch: std::sync::OnceLock::new(),
            passthrough: AtomicBool::new(false),
            low_latency: std::sync::OnceLock::new(),
            temps: temps::Temps::default(),
            bursts: output::Bursts::default(),
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
        let fd = self.fd(dir)?;
        let real = sys::fd_path_in(self.proc_fd.as_fd(), fd.as_fd())?;
        let root = self.root_path.lock().clone();
        if let Ok(rel) = real.strip_prefix(&root) {
            return Ok(rel.to_path_buf());
        }
        // The workspace itself may have moved: refresh and retry once.
        let root_fd = self.fd(self.table.root())?;
        let root = sys::fd_path_in(self.proc_fd.as_fd(), root_fd.as_fd())?;
        *self.root_path.lock() = root.clone();
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
        if out.is_empty() {
            return error::err(libc::ESTALE);
        }
        Ok(out)
    }

    /// Every name the daemon knows for a node, as workspace-relative paths (no syscalls).
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
        if out.is_empty() {
            out.push(self.display_rel(node));
        }
        out
    }

    /// The path of a node for display and read-side checks (no syscalls).
    pub(crate) fn display_rel(&self, node: &Node) -> PathBuf {
        self.table.path_of(node).unwrap_or_default()
    }

    // ----- governance --------------------------------------------------------------

    /// Refuse: remember it for the identity, count it, ledger it, and answer `EACCES`.
    pub(crate) fn deny(&self, ident: &Identity, caller: &Caller, d: Denial) -> FsError {
        // A tool's harmless probe: git refreshing its index (`.git/index.lock`) or writing
        // an object when no intent is selected yet (`git status` before the handshake). It
        // is refused, and shown in last_error, but it is not a refusal an agent loops on:
        // not counted for the breaker, not a DENIAL entry each (counted in `status`).
        if d.code == crate::guard::Code::NoIntent && crate::policy::git::in_git_dir(&d.path) {
            ident.probes.fetch_add(1, Ordering::Relaxed);
            self.counters.probes.fetch_add(1, Ordering::Relaxed);
            *ident.last_error.lock() = Some(d.clone());
            return FsError::Denied(Box::new(d));
        }
        ident.deny(&d);
        if d.code != crate::guard::Code::CircuitOpen && ident.count_refusal(self.breaker) {
            self.trip(ident, caller);
        }
        self.counters.denials.fetch_add(1, Ordering::Relaxed);
        tracing::info!(code = %d.code, path = %d.path.display(), agent = %ident.name, "denied: {}", d.message);
        if let Some(l) = &self.ledger {
            let draft = Draft {
                intent_id: d.intent.clone(),
                agent: Some(self.agent(ident, caller)),
                mutation_type: Some(MutationType::Denial),
                path: Some(d.path.clone()),
                outcome: "denied".into(),
                code: Some(d.code.as_str().into()),
                rule: d.rule.clone(),
                detail: Some(serde_json::json!({ "op": d.op, "message": d.message })),
                ..Default::default()
            };
            if let Err(e) = l.record_nowait(draft) {
                tracing::error!("ledger: cannot record a denial: {e}");
            }
        }
        FsError::Denied(Box::new(d))
    }

    /// May the caller change `rel` (op named `op`)? Returns the caller's identity.
    pub(crate) fn authorize(
        &self,
        caller: &Caller,
        op: &str,
        rel: &Path,
        is_dir: bool,
    ) -> Result<Arc<Identity>> {
        let ident = self.ids.resolve(caller.pid);
        self.authorize_as(&ident, caller, op, rel, is_dir)?;
        Ok(ident)
    }

    pub(crate) fn authorize_as(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: &str,
        rel: &Path,
        is_dir: bool,
    ) -> Result<()> {
        temps::NEW_TEMP.with(|t| t.set(false));
        let intent = ident.intent();
        if ident.tripped.load(Ordering::Acquire) {
            let d = Denial::new(
                crate::guard::Code::CircuitOpen,
                op,
                rel,
                intent.as_deref(),
                format!("{} was refused too often and is stopped until a human resets it", ident.name),
                format!(
                    "Stop and report to the human: this agent looped on refused operations. A human resets it with \
                     `intentfs reset {}`.",
                    ident.key()
                ),
            );
            return Err(self.deny(ident, caller, d));
        }
        match self.guard.check_write(intent.as_deref(), op, rel, is_dir) {
            Ok(_) => {}
            Err(d) if d.code == crate::guard::Code::ScopeViolation => {
                if self.temp_allowed(ident, op, rel) {
                    return self.ledger_healthy(ident, caller, op, rel);
                }
                if ident.grants.lock().take(GrantKind::Write, rel) {
                    return self.ledger_healthy(ident, caller, op, rel);
                }
                if self.guard.rules().policy.approval().out_of_scope
                    == crate::policy::OutOfScope::Ask
                {
                    return Err(FsError::Ask(Box::new(approve::AskSpec {
                        kind: GrantKind::Write,
                        ident: ident.clone(),
                        caller: *caller,
                        op: op.into(),
                        rel: rel.to_path_buf(),
                        denial: d,
                    })));
                }
                return Err(self.deny(ident, caller, d));
            }
            Err(d) => return Err(self.deny(ident, caller, d)),
        }
        self.ledger_healthy(ident, caller, op, rel)
    }

    /// Outside the scope, but a tool's temporary (see [`temps`]): an existing temporary of
    /// this identity (anything may be done to it but moving it elsewhere, which the rename
    /// checks), a new entry in a companion directory of its intent, or a directory its
    /// scope's globs imply. A new temporary is registered by the operation once it exists.
    fn temp_allowed(&self, ident: &Identity, op: &str, rel: &Path) -> bool {
        if self.temps.covers(&ident.key, rel) {
            return true;
        }
        let made = matches!(op, "create" | "mkdir" | "mknod" | "symlink");
        let attrs = matches!(op, "utimes" | "chmod" | "chown");
        if !made && !attrs {
            return false;
        }
        let rules = self.guard.rules();
        let Some(it) = ident
            .intent()
            .and_then(|i| rules.policy.intent(&i).cloned())
        else {
            return false;
        };
        // A directory the scope implies may be made, and its times and mode set (`tar x
        // -C src/auth` sets them on `src/auth`).
        if (op == "mkdir" || attrs) && it.implies_dir(rel) {
            return true;
        }
        if attrs {
            return false;
        }
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if it.temp_name(parent, name, op == "mkdir") || self.temps.covers(&ident.key, parent) {
            temps::NEW_TEMP.with(|t| t.set(true));
            return true;
        }
        false
    }

    /// Whether `to` may take a rename as a temporary: outside the scope only, in a companion
    /// directory of the identity's intent (or a temporary directory of it), and free or
    /// already this identity's temporary.
    pub(crate) fn temp_target(
        &self,
        ident: &Identity,
        to: &Path,
        is_dir: bool,
        dst_exists: bool,
    ) -> bool {
        let intent = ident.intent();
        match self
            .guard
            .check_write(intent.as_deref(), "rename", to, is_dir)
        {
            Err(d) if d.code == crate::guard::Code::ScopeViolation => {}
            _ => return false,
        }
        if dst_exists && !self.temps.covers(&ident.key, to) {
            return false;
        }
        let rules = self.guard.rules();
        let Some(it) = intent.and_then(|i| rules.policy.intent(&i).cloned()) else {
            return false;
        };
        let parent = to.parent().unwrap_or(Path::new(""));
        let name = to.file_name().and_then(|n| n.to_str()).unwrap_or("");
        it.temp_name(parent, name, is_dir) || self.temps.covers(&ident.key, parent)
    }

    /// The breaker tripped: say so loudly (log, ledger, and the human channel).
    fn trip(&self, ident: &Identity, caller: &Caller) {
        if let approve::Approver::Human(b) = &self.approver {
            b.announce_trip(&ident.key(), &ident.name, self.breaker.limit as u32);
        }
        tracing::warn!(agent = %ident.name, identity = %ident.key(), "circuit breaker tripped: mutations refused until reset");
        if let Some(l) = &self.ledger {
            let _ = l.record_nowait(Draft {
                intent_id: ident.intent(),
                agent: Some(self.agent(ident, caller)),
                mutation_type: Some(MutationType::Denial),
                outcome: "tripped".into(),
                code: Some("CIRCUIT_OPEN".into()),
                detail: Some(serde_json::json!({ "limit": self.breaker.limit, "window_s": self.breaker.window.as_secs() })),
                ..Default::default()
            });
        }
    }

    /// The ledger must be writable for a mutation to proceed: fail closed otherwise.
    fn ledger_healthy(
        &self,
        ident: &Arc<Identity>,
        _caller: &Caller,
        op: &str,
        rel: &Path,
    ) -> Result<()> {
        let Some(l) = &self.ledger else { return Ok(()) };
        if let Err(e) = l.health() {
            // Handles on files deleted outside the mount would keep their space allocated
            // on the full disk: let them go.
            self.table.evict_regular();
            return Err(self.ledger_denial(ident, op, rel, &e.to_string()));
        }
        Ok(())
    }

    /// The refusal when the ledger cannot take an entry: EACCES, explained in last_error.
    fn ledger_denial(&self, ident: &Identity, op: &str, rel: &Path, why: &str) -> FsError {
        let d = Denial::new(
            crate::guard::Code::ProtectedPath,
            op,
            rel,
            ident.intent().as_deref(),
            format!(
                "the audit ledger cannot be written ({why}); mutations are refused until it can"
            ),
            "Wait and retry later; tell the human that the ledger's disk is full or failing."
                .into(),
        );
        ident.deny(&d);
        FsError::Denied(Box::new(d))
    }

    /// May the caller change this existing node? Every known name of a hard-linked file
    /// must be allowed, and all its names must be known.
    pub(crate) fn authorize_node(
        &self,
        caller: &Caller,
        op: &str,
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
        op: &str,
        node: &Arc<Node>,
    ) -> Result<(Arc<Identity>, Vec<PathBuf>)> {
        let ident = self.ids.resolve(caller.pid);
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
                return Err(self.deny(&ident, caller, d));
            }
        }
        Ok((ident, rels))
    }

    /// The ledger's view of the caller.
    pub(crate) fn agent(&self, ident: &Identity, caller: &Caller) -> crate::ledger::Agent {
        crate::ledger::Agent {
            name: ident.name.clone(),
            identity: ident.key(),
            pid: caller.pid,
            uid: caller.uid,
            process: crate::guard::identity::proc_name(caller.pid),
        }
    }

    /// A git ref moved through the mount (`HEAD`, `refs/…`, see `policy::git::ref_name`):
    /// ledgered with its old and new value, so a branch, commit, reset or stash by an agent
    /// is on record although git's internals are not, file by file.
    pub(crate) fn record_ref(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        old: Option<String>,
        new: Option<String>,
    ) -> Result<()> {
        let Some(name) = crate::policy::git::ref_name(rel) else {
            return Ok(());
        };
        self.record_ref_named(ident, caller, rel, &name, old, new)
    }

    /// [`Fs::record_ref`] of ref `name`, changed through the file `rel`.
    pub(crate) fn record_ref_named(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        name: &str,
        old: Option<String>,
        new: Option<String>,
    ) -> Result<()> {
        let Some(l) = &self.ledger else { return Ok(()) };
        if old == new {
            return Ok(());
        }
        let draft = Draft {
            intent_id: ident.intent(),
            agent: Some(self.agent(ident, caller)),
            mutation_type: Some(MutationType::Ref),
            path: Some(rel.to_path_buf()),
            outcome: "ok".into(),
            detail: Some(serde_json::json!({ "ref": name, "old": old, "new": new })),
            ..Default::default()
        };
        if let Err(e) = l.record(draft) {
            return Err(self.ledger_denial(ident, "ref", rel, &e.to_string()));
        }
        Ok(())
    }

    /// Ledger a completed mutation (durably: the syscall is acknowledged after).
    pub(crate) fn record(
        &self,
        ident: &Identity,
        caller: &Caller,
        mt: MutationType,
        rel: &Path,
        mut draft: Draft,
    ) -> Result<()> {
        ident.mutations.fetch_add(1, Ordering::Relaxed);
        self.counters.mutations.fetch_add(1, Ordering::Relaxed);
        // Git's internals are not ledgered file by file (ref moves are, see `record_ref`).
        if stale::untracked(rel) {
            return Ok(());
        }
        let Some(l) = &self.ledger else { return Ok(()) };
        let rules = self.guard.rules();
        // Build output is summarized; a rename into it from elsewhere stays an entry of its
        // own (what it moves leaves its old name on record).
        let from_output = draft
            .from
            .as_deref()
            .is_none_or(|f| rules.policy.output_match(f).is_some());
        if let Some(rule) = rules.policy.output_match(rel).filter(|_| from_output) {
            // Build output: counted into its burst's summary (a handle's begin is not).
            if mt != MutationType::WriteBegin {
                let root = output_root(&rules.policy, rel);
                self.bursts.add(
                    &ident.key,
                    ident.intent(),
                    self.agent(ident, caller),
                    mt,
                    rel,
                    root,
                    rule,
                    draft.size,
                );
            }
            return Ok(());
        }
        draft.intent_id = ident.intent();
        draft.agent = Some(self.agent(ident, caller));
        draft.mutation_type = Some(mt);
        draft.path = Some(rel.to_path_buf());
        if draft.outcome.is_empty() {
            draft.outcome = "ok".into();
        }
        if let Err(e) = l.record(draft) {
            // The entry stays queued in memory and is retried; the syscall reports the
            // failure so nothing is acknowledged before its entry is durable.
            tracing::error!("ledger: cannot record {mt:?} of {}: {e}", rel.display());
            self.table.evict_regular();
            return Err(self.ledger_denial(ident, mt.as_str(), rel, &e.to_string()));
        }
        Ok(())
    }
}

/// The directory a build output summary is named by: the shortest ancestor of `rel` (or
/// `rel`) under the same `output:` rule (`target` for `target/debug/x` under `target/`).
fn output_root(policy: &crate::policy::Policy, rel: &Path) -> PathBuf {
    let mut up: Vec<&Path> = rel
        .ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .collect();
    up.reverse();
    up.into_iter()
        .find(|a| policy.output_match(a).is_some())
        .unwrap_or(rel)
        .to_path_buf()
}
