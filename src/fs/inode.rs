//! The inode table: FUSE node ids <-> backing inodes, each reachable through an `O_PATH`
//! handle that is opened lazily and may be evicted.
//!
//! Why evictable handles: a workspace of 100,000 files must work under a 20,000 open-file
//! cap, and the kernel keeps node references (lookups) for as long as its dentry cache
//! likes. A node therefore remembers how to reach it again — its (parent, name) — and
//! re-opens itself one component at a time, checking that the inode found is the one it
//! knew (same device and inode number). Node ids are the backing inode numbers (git and
//! other tools rely on stable, real inode numbers), except the root (FUSE requires 1) and
//! the rare collision, which gets a synthetic id.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::sys;

/// FUSE's root node id.
pub const ROOT: u64 = 1;
/// Node ids at and above this are never backing inode numbers we hand out directly: the
/// control directory lives at the top, synthetic ids below it.
pub const SYNTHETIC_BASE: u64 = 0xF000_0000_0000_0000;
/// How many names of one inode (hard links) we remember.
const MAX_ALIASES: usize = 16;
/// How many names lost to renames a node remembers.
const MAX_DEPARTED: usize = 4;

/// `(parent, name, tick, when, identity key)`: see `Node::departed`.
type Departed = (u64, OsString, u64, std::time::Instant, String);
/// The stale locks of the files someone holds or waits for, by key.
type StaleLocks = Mutex<HashMap<(u64, u64), Arc<Mutex<()>>>>;

/// One file's stale lock, held ([`InodeTable::stale_locks`]); unlocked when dropped, and
/// forgotten once nobody holds or waits for it.
pub struct StaleGuard<'a> {
    locks: &'a StaleLocks,
    key: (u64, u64),
    guard: Option<parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>>,
}

impl Drop for StaleGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // (Its `Arc`s are cloned under the map's lock only: the map's own is the last.)
        let mut locks = self.locks.lock();
        if locks
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.key);
        }
    }
}

/// The entries a file owes (see [`InodeTable::owe`]): how many, and whose.
struct Owing {
    n: u32,
    /// The identity whose changes every one of them records (`None`: more than one).
    by: Option<String>,
    /// Of those, the entries whose names are decided when they are written (a release's,
    /// which may record under the file's names then): never passed by a rename.
    unnamed: u32,
}

/// One backing inode known to the kernel.
pub struct Node {
    /// The id the kernel knows this node by (also reported as `st_ino`).
    pub nodeid: u64,
    /// Backing device.
    pub dev: u64,
    /// Backing inode number.
    pub ino: u64,
    /// `st_mode & S_IFMT` at first sight (the type of an inode never changes).
    pub kind: u32,
    /// Kernel lookup count; the node is dropped when `forget` brings it to zero.
    nlookup: AtomicU64,
    /// The `O_PATH|O_NOFOLLOW` handle, when currently open.
    fd: Mutex<Option<Arc<OwnedFd>>>,
    /// Names this inode is known by, `(parent node id, name)`; the first is the primary one.
    names: Mutex<Vec<(u64, OsString)>>,
    /// Shared count of handles held by nodes, for the eviction cap.
    open_count: Arc<AtomicUsize>,
    /// The stamp at the last read-only open, to let the kernel keep its page cache when the
    /// file is unchanged; cleared by any open for write.
    pub last_open: Mutex<Option<crate::guard::stale::Stamp>>,
    /// Names this inode recently lost (renamed away or over, unlinked), `(parent, name,
    /// tick, when, by)`, newest first, a few: an open that the kernel resolved through such
    /// a name just before reaches the daemon without it (see `Fs::check_stale_node`). `by`
    /// is the identity whose request moved the name (its own views moved with it).
    departed: Mutex<Vec<Departed>>,
    /// The file handles open on this inode (see `Fs::note_open`).
    pub handles: Mutex<Vec<std::sync::Weak<super::FileHandle>>>,
    /// A directory whose changes the watcher has been told to report (see
    /// `Fs::watch_dir_fd`). Per node, not per inode number: a directory made after another
    /// was removed may get its number while the watcher has not yet read that the old one
    /// is gone, and must be marked all the same.
    pub(crate) watched: std::sync::atomic::AtomicBool,
    /// The workspace paths this inode had when the kernel last forgot it, if it had
    /// several (hard links): the kernel may forget a node (memory pressure) and look up
    /// only one of its names again, and a change of a file with names unknown to the
    /// mount is refused. They count as its names only while they still name it
    /// (`Fs::node_rels` checks each from the workspace root).
    pub(crate) remembered: Mutex<Vec<std::path::PathBuf>>,
}

impl Node {
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.kind == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }
    /// The names this inode is known by.
    pub fn aliases(&self) -> Vec<(u64, OsString)> {
        self.names.lock().clone()
    }
    /// Whether one of this inode's names passes `f` (without copying them).
    pub fn any_name(&self, f: impl Fn(&std::ffi::OsStr) -> bool) -> bool {
        self.names.lock().iter().any(|(_, n)| f(n))
    }
    /// Names this inode recently lost, with the tick of the loss, not counting those the
    /// identity `except` moved itself (its views followed the file).
    pub fn departed(&self, except: &str) -> Vec<(u64, OsString, u64, std::time::Instant)> {
        self.departed
            .lock()
            .iter()
            .filter(|d| d.4 != except)
            .map(|d| (d.0, d.1.clone(), d.2, d.3))
            .collect()
    }
}

impl Node {
    /// The file handles open on this inode now (taken out of the list, so no lock is
    /// held while the caller looks at their state).
    pub fn open_file_handles(&self) -> Vec<std::sync::Arc<super::FileHandle>> {
        self.handles
            .lock()
            .iter()
            .filter_map(|w| w.upgrade())
            .collect()
    }

    /// The node's backing handle, if it is open now (never opened for this).
    pub fn held_fd(&self) -> Option<Arc<OwnedFd>> {
        self.fd.lock().clone()
    }

    /// Take the backing handle out of the node, if it is open (the count of open handles
    /// follows). Whoever gets it decides when it closes.
    fn take_fd(&self) -> Option<Arc<OwnedFd>> {
        let fd = self.fd.lock().take();
        if fd.is_some() {
            self.open_count.fetch_sub(1, Ordering::Relaxed);
        }
        fd
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.take_fd();
    }
}

struct Inner {
    nodes: HashMap<u64, Arc<Node>>,
    by_backing: HashMap<(u64, u64), u64>,
    /// The names of forgotten inodes that had several (see `Node::remembered`), with the
    /// order they were forgotten in, at most [`MAX_REMEMBERED`].
    remembered: HashMap<(u64, u64), Vec<std::path::PathBuf>>,
    remembered_order: VecDeque<(u64, u64)>,
}

/// How many forgotten hard-linked inodes keep their names.
const MAX_REMEMBERED: usize = 16_384;

/// All nodes the kernel currently references.
pub struct InodeTable {
    inner: Mutex<Inner>,
    next_synthetic: AtomicU64,
    /// Handles currently held by nodes.
    open_count: Arc<AtomicUsize>,
    /// Most handles we keep open at once before evicting the oldest.
    fd_cap: usize,
    /// Order in which handles were opened (oldest first), for eviction.
    lru: Mutex<VecDeque<Weak<Node>>>,
    root: Arc<Node>,
    /// See [`InodeTable::stale_locks`]: one lock per file held or waited for.
    stale_locks: StaleLocks,
    /// Files whose close was answered before its entry was written (see
    /// [`super::recorder`]): a stale-checked change of one waits until its entry is on record.
    pending: Mutex<HashMap<(u64, u64), Owing>>,
    /// Entries owed in `pending`, summed: read without its lock, so a stale-checked change
    /// with none owed (always, with `--record sync`) takes no mount-wide lock.
    owed: AtomicUsize,
    recorded: parking_lot::Condvar,
    /// Wakes the recorder (`--record async`) for a thread about to wait for its entries:
    /// it may be lingering (see [`super::recorder::LINGER`]).
    recorder: std::sync::OnceLock<super::recorder::Waker>,
    /// Closes the handles of forgotten nodes (see [`super::closer`]).
    closer: super::closer::Closer,
}

fn same(st: &sys::Stat, node: &Node) -> bool {
    st.st_dev == node.dev && st.st_ino == node.ino
}

impl InodeTable {
    /// A table whose root is the workspace directory behind `root_fd`.
    pub fn new(root_fd: OwnedFd, fd_cap: usize) -> io::Result<InodeTable> {
        let st = sys::stat_fd(root_fd.as_fd())?;
        let open_count = Arc::new(AtomicUsize::new(1));
        let root = Arc::new(Node {
            nodeid: ROOT,
            dev: st.st_dev,
            ino: st.st_ino,
            kind: libc::S_IFDIR,
            nlookup: AtomicU64::new(1),
            fd: Mutex::new(Some(Arc::new(root_fd))),
            names: Mutex::new(Vec::new()),
            open_count: open_count.clone(),
            last_open: Mutex::new(None),
            departed: Mutex::new(Vec::new()),
            handles: Mutex::new(Vec::new()),
            watched: std::sync::atomic::AtomicBool::new(false),
            remembered: Mutex::new(Vec::new()),
        });
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, root.clone());
        let mut by_backing = HashMap::new();
        by_backing.insert((st.st_dev, st.st_ino), ROOT);
        Ok(InodeTable {
            inner: Mutex::new(Inner {
                nodes,
                by_backing,
                remembered: HashMap::new(),
                remembered_order: VecDeque::new(),
            }),
            next_synthetic: AtomicU64::new(SYNTHETIC_BASE),
            open_count,
            fd_cap: fd_cap.max(64),
            lru: Mutex::new(VecDeque::new()),
            root,
            stale_locks: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            owed: AtomicUsize::new(0),
            recorded: parking_lot::Condvar::new(),
            recorder: std::sync::OnceLock::new(),
            closer: super::closer::Closer::start(),
        })
    }

    pub fn root(&self) -> &Arc<Node> {
        &self.root
    }

    /// The node with this id, if the kernel still references it.
    pub fn get(&self, nodeid: u64) -> Option<Arc<Node>> {
        self.inner.lock().nodes.get(&nodeid).cloned()
    }

    /// The node for a backing inode, if known.
    pub fn by_backing(&self, dev: u64, ino: u64) -> Option<Arc<Node>> {
        let inner = self.inner.lock();
        inner
            .by_backing
            .get(&(dev, ino))
            .and_then(|id| inner.nodes.get(id))
            .cloned()
    }

    /// Every node referenced by the kernel.
    pub fn all(&self) -> Vec<Arc<Node>> {
        self.inner.lock().nodes.values().cloned().collect()
    }

    /// Number of nodes referenced by the kernel.
    pub fn len(&self) -> usize {
        self.inner.lock().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Handles currently open.
    pub fn open_handles(&self) -> usize {
        self.open_count.load(Ordering::Relaxed)
    }

    /// The node's `O_PATH` handle, re-opening it from its parent if it was evicted.
    pub fn fd(&self, node: &Arc<Node>) -> io::Result<Arc<OwnedFd>> {
        self.fd_depth(node, 0)
    }

    fn fd_depth(&self, node: &Arc<Node>, depth: usize) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = node.fd.lock().clone() {
            return Ok(fd);
        }
        if depth > 4096 {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        let mut last_err = io::Error::from_raw_os_error(libc::ESTALE);
        for (parent, name) in node.aliases() {
            let Some(pnode) = self.get(parent) else {
                continue;
            };
            let pfd = match self.fd_depth(&pnode, depth + 1) {
                Ok(f) => f,
                Err(e) => {
                    last_err = e;
                    continue;
                }
            };
            let fd = match sys::open_path(pfd.as_fd(), &name) {
                Ok(f) => f,
                Err(e) => {
                    last_err = e;
                    continue;
                }
            };
            let st = sys::stat_fd(fd.as_fd())?;
            if !same(&st, node) {
                continue;
            }
            return Ok(self.install_fd(node, fd));
        }
        Err(last_err)
    }

    fn install_fd(&self, node: &Arc<Node>, fd: OwnedFd) -> Arc<OwnedFd> {
        let fd = Arc::new(fd);
        {
            let mut slot = node.fd.lock();
            if let Some(existing) = slot.as_ref() {
                return existing.clone();
            }
            *slot = Some(fd.clone());
        }
        let open = self.open_count.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut lru = self.lru.lock();
            lru.push_back(Arc::downgrade(node));
            // Nodes the kernel forgot leave their entries behind, and a `Weak` keeps the
            // node's memory: under the cap nothing pops them, so a long-running daemon
            // grew by a node per file ever created (~250 bytes). Sweep once the dead may
            // outnumber the live.
            if lru.len() > 2 * open + 1024 {
                lru.retain(|w| w.strong_count() > 0);
            }
        }
        self.evict();
        fd
    }

    /// Entries in the eviction order (tests: it must not grow with forgotten nodes).
    #[cfg(test)]
    fn lru_len(&self) -> usize {
        self.lru.lock().len()
    }

    /// Close the oldest handles while over the cap. In-flight users keep their `Arc`.
    fn evict(&self) {
        while self.open_count.load(Ordering::Relaxed) > self.fd_cap {
            let Some(weak) = self.lru.lock().pop_front() else {
                return;
            };
            let Some(node) = weak.upgrade() else { continue };
            if node.nodeid == ROOT {
                continue;
            }
            node.take_fd();
        }
    }

    /// Close every regular file's handle (they re-open on demand). Used when the disk is
    /// full: a handle on a file deleted outside the mount keeps its space allocated.
    pub fn evict_regular(&self) {
        let nodes: Vec<Arc<Node>> = self.inner.lock().nodes.values().cloned().collect();
        for n in nodes {
            if n.is_reg() {
                n.take_fd();
            }
        }
        // And the handles of forgotten files not closed yet.
        self.closer.flush();
    }

    /// Record a kernel lookup of `parent/name`, whose fresh handle and stat are given.
    /// Returns the node (existing for a known inode, e.g. a hard link) with its count raised.
    pub fn lookup(
        &self,
        parent: u64,
        name: &OsStr,
        fd: Option<OwnedFd>,
        st: &sys::Stat,
    ) -> Arc<Node> {
        let (node, gained) = self.get_or_insert(parent, name, st);
        if let Some(fd) = fd {
            if node.fd.lock().is_none() {
                self.install_fd(&node, fd);
            }
        }
        if gained && node.is_reg() {
            self.note_names(&node);
        }
        node
    }

    /// A file just gained a name (a hard link made or looked up): where its names are now,
    /// kept with those it came back with (see `Node::remembered`). The kernel may forget
    /// its directory before it (it frees inodes in no set order under memory pressure), and
    /// the forget of the file can then no longer say where its names were.
    fn note_names(&self, node: &Node) {
        let paths = self.alias_paths(node);
        let mut remembered = node.remembered.lock();
        for p in paths {
            if !remembered.contains(&p) {
                remembered.insert(0, p);
            }
        }
        remembered.truncate(MAX_ALIASES);
    }

    /// The workspace paths of a node's known names whose directories are known.
    fn alias_paths(&self, node: &Node) -> Vec<std::path::PathBuf> {
        let mut paths = Vec::new();
        for (parent, name) in node.aliases() {
            let dir = if parent == ROOT {
                Some(std::path::PathBuf::new())
            } else {
                self.get(parent).and_then(|p| self.path_of(&p))
            };
            if let Some(p) = dir.map(|d| d.join(name)) {
                if !paths.contains(&p) {
                    paths.push(p);
                }
            }
        }
        paths
    }

    /// The node of `parent/name` (the known one for its backing inode, or a new one),
    /// with its lookup count raised under the table's lock: a concurrent FORGET that takes
    /// the count to zero removes the node under that lock too, so the count a lookup adds
    /// is never added to a node already dropped (the kernel would then hold a node id the
    /// daemon no longer knows, and every request on it would fail with ENOENT). And whether
    /// a known node gained a name.
    fn get_or_insert(&self, parent: u64, name: &OsStr, st: &sys::Stat) -> (Arc<Node>, bool) {
        let mut inner = self.inner.lock();
        if let Some(node) = inner
            .by_backing
            .get(&(st.st_dev, st.st_ino))
            .and_then(|id| inner.nodes.get(id))
        {
            let node = node.clone();
            node.nlookup.fetch_add(1, Ordering::AcqRel);
            let mut names = node.names.lock();
            let gained = !names.iter().any(|(p, n)| *p == parent && n == name);
            if gained {
                if names.len() >= MAX_ALIASES {
                    names.pop();
                }
                names.insert(0, (parent, name.to_os_string()));
            } else if names
                .first()
                .map(|(p, n)| *p != parent || n != name)
                .unwrap_or(false)
            {
                // Make the name just used the primary one: it is the freshest.
                names.retain(|(p, n)| !(*p == parent && n == name));
                names.insert(0, (parent, name.to_os_string()));
            }
            drop(names);
            return (node, gained);
        }
        let remembered = inner
            .remembered
            .remove(&(st.st_dev, st.st_ino))
            .unwrap_or_default();
        let wanted = st.st_ino;
        let nodeid = if st.st_dev == self.root.dev
            && wanted != ROOT
            && wanted < SYNTHETIC_BASE
            && !inner.nodes.contains_key(&wanted)
        {
            wanted
        } else {
            self.next_synthetic.fetch_add(1, Ordering::Relaxed)
        };
        let node = Arc::new(Node {
            nodeid,
            dev: st.st_dev,
            ino: st.st_ino,
            kind: st.st_mode & libc::S_IFMT,
            nlookup: AtomicU64::new(1),
            fd: Mutex::new(None),
            names: Mutex::new(vec![(parent, name.to_os_string())]),
            open_count: self.open_count.clone(),
            last_open: Mutex::new(None),
            departed: Mutex::new(Vec::new()),
            handles: Mutex::new(Vec::new()),
            watched: std::sync::atomic::AtomicBool::new(false),
            remembered: Mutex::new(remembered),
        });
        inner.nodes.insert(nodeid, node.clone());
        inner.by_backing.insert((st.st_dev, st.st_ino), nodeid);
        (node, false)
    }

    /// The kernel forgot `n` lookups of a node.
    pub fn forget(&self, nodeid: u64, n: u64) {
        if nodeid == ROOT {
            return;
        }
        let Some(node) = self.get(nodeid) else { return };
        let prev = node
            .nlookup
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(n))
            })
            .unwrap_or(0);
        if prev <= n {
            // A file with several names: where they are, while the directories above them
            // are still known (the kernel mostly forgets a file before its directory; when
            // not, the names noted as it gained them stand in, see `note_names`).
            let names = if node.is_reg()
                && (node.names.lock().len() > 1 || !node.remembered.lock().is_empty())
            {
                let mut paths = self.alias_paths(&node);
                // (Then those it had itself come back with: a name the kernel did not look
                // up again since is still one. As many as a node keeps names.)
                for p in node.remembered.lock().iter() {
                    if !paths.contains(p) {
                        paths.push(p.clone());
                    }
                }
                paths.truncate(MAX_ALIASES);
                paths
            } else {
                Vec::new()
            };
            self.remove(nodeid, names);
        }
    }

    /// Drop a node nobody references; `names`: its paths, kept for when it is looked up
    /// again (see `Node::remembered`).
    fn remove(&self, nodeid: u64, names: Vec<std::path::PathBuf>) {
        let node = {
            let mut inner = self.inner.lock();
            let Some(node) = inner.nodes.get(&nodeid) else {
                return;
            };
            if node.nlookup.load(Ordering::Acquire) > 0 {
                return;
            }
            let key = (node.dev, node.ino);
            let node = inner.nodes.remove(&nodeid);
            if inner.by_backing.get(&key) == Some(&nodeid) {
                inner.by_backing.remove(&key);
            }
            if names.len() > 1 {
                if inner.remembered.insert(key, names).is_none() {
                    inner.remembered_order.push_back(key);
                }
                while inner.remembered_order.len() > MAX_REMEMBERED {
                    if let Some(old) = inner.remembered_order.pop_front() {
                        inner.remembered.remove(&old);
                    }
                }
            }
            node
        };
        // Closed a moment later, not here (see `closer`).
        if let Some(fd) = node.and_then(|n| n.take_fd()) {
            self.closer.later(fd);
        }
    }

    /// A name went away (unlink, rmdir, or replaced by a rename).
    /// `by`: the key of the identity whose request removed the name.
    pub fn remove_alias(&self, node: &Node, parent: u64, name: &OsStr, by: &str) {
        node.names
            .lock()
            .retain(|(p, n)| !(*p == parent && n == name));
        Self::depart(node, parent, name, by);
    }

    fn depart(node: &Node, parent: u64, name: &OsStr, by: &str) {
        let mut d = node.departed.lock();
        d.retain(|(p, n, _, _, _)| !(*p == parent && n == name));
        d.insert(
            0,
            (
                parent,
                name.to_os_string(),
                crate::guard::tick(),
                std::time::Instant::now(),
                by.to_owned(),
            ),
        );
        d.truncate(MAX_DEPARTED);
    }

    /// A name moved (rename): the node is now known under the new name first.
    pub fn move_alias(
        &self,
        node: &Node,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        by: &str,
    ) {
        let mut names = node.names.lock();
        names.retain(|(p, n)| !((*p == parent && n == name) || (*p == newparent && n == newname)));
        names.insert(0, (newparent, newname.to_os_string()));
        drop(names);
        if (parent, name) != (newparent, newname) {
            Self::depart(node, parent, name, by);
        }
    }

    /// Serialize the stale check of a file with the mutation it allows: hold the locks of
    /// the given backing inodes `(dev, ino)` (one per file, so a file held long, a large
    /// close being hashed, holds up no other file; taken in a fixed order, so holding
    /// several never deadlocks).
    pub fn stale_locks(&self, keys: &[(u64, u64)]) -> Vec<StaleGuard<'_>> {
        self.stale_locks_owing(keys, &[], "").0
    }

    /// [`InodeTable::stale_locks`], where the files in `own` may still owe entries when all
    /// of them record identity `by`'s changes (an edit by rename of a file it has just
    /// closed, see `Fs::rename`): true when one of them does (the caller then owes its own
    /// entry after theirs, see [`InodeTable::owe_held`]).
    pub fn stale_locks_owing(
        &self,
        keys: &[(u64, u64)],
        own: &[(u64, u64)],
        by: &str,
    ) -> (Vec<StaleGuard<'_>>, bool) {
        // A file whose entry is still being written by the recorder is not changed before
        // it is on record (the recorder itself records in order, and passes).
        // (An entry owed for one of `keys` was counted under its lock, held here, except
        // a release's (`owe_now`): one counted meanwhile is for a release the kernel sent
        // on its own, which nothing the agent did after it depends on, and whose work
        // waits for this lock anyway.)
        let recorder = super::recorder::is_recorder();
        let waits = |pending: &HashMap<(u64, u64), Owing>| {
            keys.iter().any(|k| {
                pending.get(k).is_some_and(|o| {
                    !(own.contains(k)
                        && !by.is_empty()
                        && o.by.as_deref() == Some(by)
                        && o.unnamed == 0)
                })
            })
        };
        loop {
            // Waited for before the locks are taken, not while holding them: the recorder
            // takes the same locks to record what is owed.
            if !recorder && self.owed.load(Ordering::Acquire) != 0 {
                let mut pending = self.pending.lock();
                let rec = self.recorder.get();
                super::recorder::wait_while(rec, &self.recorded, &mut pending, waits, None);
            }
            let guards = self.lock_keys(keys);
            if recorder || self.owed.load(Ordering::Acquire) == 0 {
                return (guards, false);
            }
            let pending = self.pending.lock();
            if !waits(&pending) {
                let owing = own.iter().any(|k| pending.contains_key(k));
                return (guards, owing);
            }
            drop(pending);
            drop(guards);
        }
    }

    /// One name's lock and then its file's, with one look at the name (see
    /// `Fs::lock_names`): `name` is locked (waiting for it while holding nothing), `look`
    /// says what the name points to under that lock, and the file's lock is taken only if
    /// it is free at once. Nothing through the mount re-points a name without its lock (an
    /// unlink or a rename), so what `look` saw holds while both are held. `None` (nothing
    /// held) when the file's lock is taken or an entry is owed anywhere: the caller takes
    /// the locks the usual way, in their fixed order.
    pub fn lock_name_then_file<T>(
        &self,
        name: (u64, u64),
        look: impl FnOnce() -> T,
        file: impl FnOnce(&T) -> Option<(u64, u64)>,
    ) -> Option<(Vec<StaleGuard<'_>>, T)> {
        if self.owed.load(Ordering::Acquire) != 0 || super::recorder::is_recorder() {
            return None;
        }
        let mut guards = self.lock_keys(&[name]);
        let seen = look();
        if let Some(key) = file(&seen) {
            let lock = self.stale_locks.lock().entry(key).or_default().clone();
            let Some(held) = lock.try_lock_arc() else {
                // Not taken: given back under the map's lock, and forgotten if the holder
                // let go meanwhile (it saw this copy and left the lock in the map).
                let mut locks = self.stale_locks.lock();
                drop(lock);
                if locks.get(&key).is_some_and(|l| Arc::strong_count(l) == 1) {
                    locks.remove(&key);
                }
                return None;
            };
            drop(lock);
            guards.push(StaleGuard {
                locks: &self.stale_locks,
                key,
                guard: Some(held),
            });
        }
        // (An entry owed since, of one of these: the usual way waits for it.)
        if self.owed.load(Ordering::Acquire) != 0 {
            return None;
        }
        Some((guards, seen))
    }

    /// The stale locks of `keys`, locked in a fixed order.
    fn lock_keys(&self, keys: &[(u64, u64)]) -> Vec<StaleGuard<'_>> {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .map(|key| {
                let lock = self.stale_locks.lock().entry(key).or_default().clone();
                StaleGuard {
                    locks: &self.stale_locks,
                    key,
                    guard: Some(lock.lock_arc()),
                }
            })
            .collect()
    }

    /// Count one more entry owed for `key`, recording `by`'s changes (`named`: under names
    /// fixed now, see [`Owing::unnamed`]).
    fn add_owed(&self, key: (u64, u64), by: &str, named: bool) {
        let mut pending = self.pending.lock();
        let o = pending.entry(key).or_insert_with(|| Owing {
            n: 0,
            by: Some(by.to_owned()),
            unnamed: 0,
        });
        o.n += 1;
        if o.by.as_deref() != Some(by) {
            o.by = None;
        }
        o.unnamed += u32::from(!named);
        self.owed.fetch_add(1, Ordering::Release);
    }

    /// Mark `key`'s entry (of a change by identity `by`) as owed: stale-checked changes of
    /// it wait until [`InodeTable::settle`]. Taken under the file's stale lock, so a change
    /// already under way finishes first (an entry already owed is not waited for: this one
    /// is queued after it).
    pub fn owe(&self, key: (u64, u64), by: &str) {
        self.owe_with(key, by, || ());
    }

    /// [`InodeTable::owe`] without waiting for a change of the file under way: for a
    /// handle's release. Its work takes the file's stale lock when it runs, so it still
    /// comes after such a change, and nothing the agent did after the close is ordered
    /// before the release (the kernel sends it once `close(2)` has returned, on its own).
    /// Taking the lock here held up the serving thread, and every request queued behind
    /// the release on it, while the recorder hashed and recorded the close before (the
    /// edit loop: a `GETATTR` took 25 µs instead of 10).
    /// (`named`: the entry, if the release writes one, names what the close before it
    /// fixed; see [`Owing::unnamed`].)
    pub fn owe_now(&self, key: (u64, u64), by: &str, named: bool) {
        self.add_owed(key, by, named);
    }

    /// [`InodeTable::owe`] by a caller that holds the stale locks of `keys` already
    /// ([`InodeTable::stale_locks_owing`]).
    pub fn owe_held(&self, keys: &[(u64, u64)], by: &str) {
        for &k in keys {
            self.add_owed(k, by, true);
        }
    }

    /// [`InodeTable::owe`], running `f` under the file's stale lock first (what the entry
    /// will name, taken where no rename of the file can come between).
    pub fn owe_with<T>(&self, key: (u64, u64), by: &str, f: impl FnOnce() -> T) -> T {
        let _g = self.lock_keys(&[key]);
        let t = f();
        self.add_owed(key, by, true);
        t
    }

    /// The entry owed for `key` is on record (or given up).
    pub fn settle(&self, key: (u64, u64)) {
        self.settle_owed(key, true);
    }

    /// [`InodeTable::settle`] of an entry owed as `named` or not ([`InodeTable::owe_now`]).
    pub fn settle_owed(&self, key: (u64, u64), named: bool) {
        let mut pending = self.pending.lock();
        let Some(o) = pending.get_mut(&key) else {
            return;
        };
        o.n -= 1;
        if !named {
            o.unnamed = o.unnamed.saturating_sub(1);
        }
        self.owed.fetch_sub(1, Ordering::Release);
        // (Only a file that owes nothing more lets a waiter go.)
        if o.n == 0 {
            pending.remove(&key);
            drop(pending);
            self.recorded.notify_all();
        }
    }

    /// Wait until no entry is owed for `key`.
    pub fn wait_settled(&self, key: (u64, u64)) {
        if super::recorder::is_recorder() {
            return;
        }
        let mut pending = self.pending.lock();
        let owes = |p: &HashMap<(u64, u64), Owing>| p.contains_key(&key);
        super::recorder::wait_while(
            self.recorder.get(),
            &self.recorded,
            &mut pending,
            owes,
            None,
        );
    }

    /// The recorder to wake before waiting for entries owed.
    pub fn set_recorder(&self, w: super::recorder::Waker) {
        let _ = self.recorder.set(w);
    }

    /// Workspace-relative path of a node by its primary names, as the daemon knows it.
    /// `None` when a name on the way up is unknown (a node whose names all went away).
    pub fn path_of(&self, node: &Node) -> Option<PathBuf> {
        let mut parts: Vec<OsString> = Vec::new();
        let mut cur = node.nodeid;
        let mut guard = 0;
        while cur != ROOT {
            guard += 1;
            if guard > 4096 {
                return None;
            }
            let n = self.get(cur)?;
            let (parent, name) = n.names.lock().first().cloned()?;
            parts.push(name);
            cur = parent;
        }
        let mut out = Vec::new();
        for (i, p) in parts.iter().rev().enumerate() {
            if i > 0 {
                out.push(b'/');
            }
            out.extend_from_slice(p.as_bytes());
        }
        Some(PathBuf::from(OsStr::from_bytes(&out).to_os_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file owing entries of one identity's changes lets that identity's rename through
    /// (told it owes), and no one else: another identity, or entries of two identities,
    /// wait until they are settled.
    #[test]
    fn only_the_owing_identity_passes_entries_owed() {
        let dir = tempfile::tempdir().unwrap();
        let root = sys::open_root(dir.path()).unwrap();
        let t = Arc::new(InodeTable::new(root, 64).unwrap());
        let key = (7, 42);
        let other = (7, 43);
        // `by` taking `key`'s lock on a thread of its own: whether it was told it passes
        // entries owed, once it has the lock.
        let waiter = |by: &str| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (t2, who) = (t.clone(), by.to_owned());
            let h = std::thread::spawn(move || {
                let (_g, owing) = t2.stale_locks_owing(&[key], &[key], &who);
                tx.send(owing).unwrap();
            });
            (rx, h)
        };
        let still_waits = |rx: &std::sync::mpsc::Receiver<bool>| {
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err()
        };
        t.owe_now(key, "agent-a", true);
        let (g, owing) = t.stale_locks_owing(&[key, other], &[key], "agent-a");
        assert!(owing, "the owing identity is told it passes entries owed");
        drop(g);
        // Not allowed for this key: any other file's lock with nothing owed passes.
        let (g, owing) = t.stale_locks_owing(&[other], &[other], "agent-a");
        assert!(!owing);
        drop(g);
        // Another identity (and a plain stale lock) waits for the settle.
        for by in ["agent-b", ""] {
            let (rx, h) = waiter(by);
            assert!(
                still_waits(&rx),
                "{by:?} passed an entry another identity owes"
            );
            t.settle(key);
            assert!(!rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap());
            h.join().unwrap();
            t.owe_now(key, "agent-a", true);
        }
        // Owed by two identities: even one of them waits.
        t.owe_now(key, "agent-b", true);
        let (rx, h) = waiter("agent-a");
        assert!(still_waits(&rx));
        t.settle(key);
        assert!(still_waits(&rx));
        t.settle(key);
        assert!(!rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap());
        h.join().unwrap();
        // An entry whose names are decided when it is written (a release's) is never
        // passed, not even by its own identity.
        t.owe_now(key, "agent-a", false);
        let (rx, h) = waiter("agent-a");
        assert!(still_waits(&rx));
        t.settle_owed(key, false);
        assert!(!rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap());
        h.join().unwrap();
    }

    /// Files made and forgotten (`tar x` then `rm -rf`, all day): the table's memory
    /// stays bounded by what the kernel references.
    #[test]
    fn forgotten_nodes_leave_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let root = sys::open_root(dir.path()).unwrap();
        let table = InodeTable::new(root, 100_000).unwrap();
        let rfd = table.fd(table.root()).unwrap();
        for i in 0..20_000 {
            let name = OsString::from(format!("f{i}"));
            std::fs::write(dir.path().join(&name), b"x").unwrap();
            let fd = sys::open_path(rfd.as_fd(), &name).unwrap();
            let st = sys::stat_fd(fd.as_fd()).unwrap();
            let node = table.lookup(ROOT, &name, Some(fd), &st);
            let id = node.nodeid;
            drop(node);
            std::fs::remove_file(dir.path().join(&name)).unwrap();
            table.forget(id, 1);
        }
        assert_eq!(table.len(), 1, "only the root is referenced");
        assert_eq!(table.open_handles(), 1, "only the root's handle is open");
        assert!(
            table.lru_len() <= 2 * table.open_handles() + 1025,
            "{} eviction entries (each keeps a node's memory) for {} open handles",
            table.lru_len(),
            table.open_handles()
        );
    }

    /// The kernel frees inodes in no set order under memory pressure: it may forget a
    /// directory before a hard-linked file in it. The file's names are then known all the
    /// same when it is looked up again by one of them (found open: the forget of the file
    /// could no longer say where its names were, and a change through the one name looked
    /// up again was refused for a name unknown to the mount).
    #[test]
    fn a_file_forgotten_after_its_directory_comes_back_with_its_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/a.txt"), b"x").unwrap();
        std::fs::hard_link(dir.path().join("d/a.txt"), dir.path().join("d/b.txt")).unwrap();
        let root = sys::open_root(dir.path()).unwrap();
        let table = InodeTable::new(root, 64).unwrap();
        let look = |parent: &Arc<Node>, name: &str| {
            let pfd = table.fd(parent).unwrap();
            let fd = sys::open_path(pfd.as_fd(), OsStr::new(name)).unwrap();
            let st = sys::stat_fd(fd.as_fd()).unwrap();
            table.lookup(parent.nodeid, OsStr::new(name), Some(fd), &st)
        };
        let d = look(table.root(), "d");
        let a = look(&d, "a.txt");
        let b = look(&d, "b.txt");
        assert_eq!(a.nodeid, b.nodeid);
        let (did, fid) = (d.nodeid, a.nodeid);
        drop((a, b, d));
        table.forget(did, 1);
        table.forget(fid, 2);
        assert_eq!(table.len(), 1, "only the root is referenced");
        let d = look(table.root(), "d");
        let b = look(&d, "b.txt");
        let mut remembered = b.remembered.lock().clone();
        remembered.sort();
        assert_eq!(
            remembered,
            [PathBuf::from("d/a.txt"), PathBuf::from("d/b.txt")]
        );
    }

    /// An unlink's one look at its name: under the name's lock, with its file's lock
    /// taken only when free, and nothing held when it is not (the caller then takes both
    /// in their fixed order), nor when an entry is owed.
    #[test]
    fn a_name_then_its_file_are_locked_only_when_the_file_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let root = sys::open_root(dir.path()).unwrap();
        let t = InodeTable::new(root, 64).unwrap();
        let (name, file) = ((!7, 1), (7, 42));
        let looks = std::cell::Cell::new(0);
        let look = || {
            looks.set(looks.get() + 1);
            Some(file)
        };
        let (guards, seen) = t.lock_name_then_file(name, look, |f| *f).unwrap();
        assert_eq!((guards.len(), seen, looks.get()), (2, Some(file), 1));
        drop(guards);
        // The file's lock held elsewhere: nothing held here, the name's lock included.
        let held = t.stale_locks(&[file]);
        assert!(t.lock_name_then_file(name, look, |f| *f).is_none());
        let name_free = t.lock_name_then_file(name, || None, |_: &Option<()>| None);
        assert_eq!(name_free.map(|(g, _)| g.len()), Some(1));
        drop(held);
        // An entry owed (any): the usual way, which waits for it.
        t.owe(file, "a");
        assert!(t.lock_name_then_file(name, look, |f| *f).is_none());
        t.settle(file);
        assert!(t.lock_name_then_file(name, look, |f| *f).is_some());
        assert!(
            t.stale_locks.lock().is_empty(),
            "every lock is forgotten once free"
        );
    }
}
