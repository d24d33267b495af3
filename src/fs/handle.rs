//! An open regular file: what is fixed at open, and one lock over what changes.
//!
//! A read-only handle only remembers whether what it read is on record; a handle that may
//! change the file carries the write state (the stamp it expects, the pre-image for line
//! ranges, the in-order hash, its ledger token...). Both live in [`HandleState`] behind one
//! lock, so the combinations that make sense are the only ones that can be expressed, and a
//! read-only handle carries none of the write state.
//!
//! Locking: the state lock is taken briefly, never across a ledger call, an authorization,
//! or a call that takes it again; `fstat` and the in-order hash's bookkeeping may run under
//! it. It orders after the inode's stale lock and before `Node::handles`.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};

use super::hash::SeqHash;
use super::inode::Node;
use super::Caller;
use crate::guard::stale::Stamp;
use crate::guard::Identity;

/// An open regular file.
pub struct FileHandle {
    pub file: File,
    pub node: Arc<Node>,
    pub identity: Arc<Identity>,
    /// The caller that opened it (for the ledger entry at close).
    pub caller: Caller,
    /// Opened with write access (bytes may be written through it).
    pub writable: bool,
    /// The file's names at open: what the identity sees through this handle is recorded
    /// under them too, even if another identity renames the file over or away before the
    /// first read (the agent reached the file through one of them).
    pub open_rels: Vec<PathBuf>,
    state: Mutex<HandleState>,
}

/// What an open file's handle remembers between requests.
pub enum HandleState {
    /// Opened for reading only.
    Read(ReadState),
    /// May change the file (write access, or `O_TRUNC`, or it created the file).
    Write(Box<WriteState>),
}

/// What was recorded of the reads through a handle.
#[derive(Default)]
pub struct ReadState {
    /// The first read was recorded as "seen" for the identity.
    pub recorded: bool,
    /// What the file held was recorded for the identity without a read request (at
    /// open, see `Fs::record_read_provisional`); a read request that comes still records
    /// exactly what it returned.
    pub provisional: bool,
}

/// The state of a handle that may change its file.
pub struct WriteState {
    /// Reads through a read-write handle are recorded like any other.
    pub read: ReadState,
    /// Names this handle's entries in the ledger: its `CREATE` or `WRITE_BEGIN` (written
    /// before the first byte lands) and the `WRITE` that completes it carry it as
    /// `detail.handle`, so content a crash leaves is attributed to the handle that wrote it.
    pub token: String,
    /// A rebase todo list or another git state file naming commits
    /// ([`super::gitrefs::is_commit_list`]): every write is checked (no commands to run, no
    /// commit bringing changes outside the scope).
    pub todo: bool,
    /// Changed (written, truncated, created) since the last ledger entry.
    pub dirty: bool,
    /// Written through `write`/`fallocate`/`copy_file_range` since the last entry.
    pub wrote: bool,
    /// This handle created the file (until its first `WRITE` entry).
    pub created: bool,
    /// The handle changed the content itself (write, truncate through it, fallocate,
    /// copy_file_range) since it was opened.
    pub own_writes: bool,
    /// The file's stamp after this handle's last own write (or its open): a different
    /// stamp at the next write means someone else wrote in between.
    pub expected: Option<Stamp>,
    /// The last write check found the file changed since this handle's previous write
    /// (by anyone, the identity included): the in-order hash no longer holds.
    pub disturbed: bool,
    /// The pre-image was taken (at an `O_TRUNC` open, or before the first write).
    pub pre_captured: bool,
    /// Content before this handle's writes (text files up to 1 MiB), for line ranges.
    pub pre_image: Option<Vec<u8>>,
    /// Hash of the content before this handle's writes, when known.
    pub prev_hash: Option<String>,
    /// `(intent, policy generation)` the handle's writes were authorized under: a switch of
    /// intent or a policy reload re-checks before the next write.
    pub epoch: (Option<String>, u64),
    /// The file's workspace path when last known (at open, then at each entry): the name
    /// a WRITE is recorded under if the file lost every name while open (renamed over or
    /// deleted before close).
    pub last_rel: PathBuf,
    /// `--record async`: the file's name and the agent when the close was answered; its
    /// entry, written a moment later, names them (the kernel may have forgotten the file's
    /// node, the closing process may have exited).
    pub at_close: Option<(Vec<PathBuf>, crate::ledger::Agent)>,
    /// The content hash taken while the handle writes the file front to back (large
    /// files: no full hashing at close).
    pub seq: SeqHash,
    /// Its `CREATE` or `WRITE_BEGIN` is on record.
    pub begun: bool,
    /// Kernel passthrough of its data (`--data passthrough`): its writes do not reach the
    /// daemon. Its pre-image and `WRITE_BEGIN` were taken at open; its content is hashed
    /// at flush (when the file changed) and at release.
    pub pt: bool,
    /// The processes (thread group ids) that opened the file through this handle: a
    /// write the watcher reports from one of them is the handle's own.
    pub writers: Vec<i32>,
    /// A process closed a descriptor of the handle that `writers` does not hold (the list
    /// was full, or the process is another identity's, handed the descriptor): a mapping
    /// of the file may live on in a process no search from `writers` finds, so the search
    /// at release looks at every process ([`crate::fs::Fs::pt_mappers`]).
    pub closers_untracked: bool,
    /// Writes to the file while this handle was open by processes that are not its
    /// identity's (outside the mount: the kernel's passthrough writes never carry the
    /// daemon's pid, so the watcher tells them apart by process), recorded at release.
    pub outside: Vec<serde_json::Value>,
    /// Writes by processes gone before the watcher could tell whose they were (a
    /// short-lived child writing to a descriptor inherited from the agent, or a short-lived
    /// writer outside the mount): named in the entry, not taken for an outsider's.
    pub unattributed: Vec<serde_json::Value>,
    /// A process of its tree mapped the file shared (writable, or able to become so) when
    /// an entry was taken: writes through a page already mapped writable move neither the
    /// size nor the times, so its release hashes the content afresh instead of trusting the
    /// stamp.
    pub mapped: bool,
    /// Opened read-write: only such a descriptor can map the file shared and writable, now
    /// or by a later `mprotect` (`mmap` refuses `MAP_SHARED` with `PROT_WRITE` on any
    /// other, and a read-only one never gets VM_MAYWRITE), so only such a handle's close
    /// and release look for mappings in `/proc`.
    pub rdwr: bool,
}

/// How a handle that may change its file starts.
pub struct WriteOpen {
    /// The name it was authorized under.
    pub rel: PathBuf,
    pub token: String,
    /// `(intent, policy generation)` at the authorization.
    pub epoch: (Option<String>, u64),
    /// It created the file (its `CREATE` is on record, the pre-image is empty).
    pub created: bool,
    /// It emptied the file at open (`O_TRUNC`): dirty from the start.
    pub truncated: bool,
    /// The content before, taken at an `O_TRUNC` open (None: taken at the first write).
    pub pre_image: Option<Vec<u8>>,
    pub prev_hash: Option<String>,
    /// Its `CREATE` or `WRITE_BEGIN` is already on record.
    pub begun: bool,
    /// Kernel passthrough of its data (see [`WriteState::pt`]).
    pub pt: bool,
    /// Opened read-write (see [`WriteState::rdwr`]).
    pub rdwr: bool,
}

impl FileHandle {
    /// The one place a handle is built: `write` is `Some` for a handle that may change
    /// the file.
    pub fn new(
        file: File,
        node: Arc<Node>,
        identity: Arc<Identity>,
        caller: Caller,
        writable: bool,
        open_rels: Vec<PathBuf>,
        write: Option<WriteOpen>,
    ) -> FileHandle {
        let state = match write {
            None => HandleState::Read(ReadState::default()),
            Some(w) => HandleState::Write(Box::new(WriteState {
                read: ReadState::default(),
                todo: super::gitrefs::is_commit_list(&w.rel),
                token: w.token,
                dirty: w.truncated,
                wrote: false,
                created: w.created,
                own_writes: false,
                expected: None,
                disturbed: false,
                pre_captured: w.created || w.pre_image.is_some(),
                pre_image: if w.created {
                    Some(Vec::new())
                } else {
                    w.pre_image
                },
                prev_hash: w.prev_hash,
                epoch: w.epoch,
                last_rel: w.rel,
                at_close: None,
                seq: SeqHash::default(),
                begun: w.begun,
                pt: w.pt,
                // (Only a passthrough handle's writes are told apart by process.)
                writers: if w.pt {
                    vec![crate::guard::identity::tgid_of(caller.pid) as i32]
                } else {
                    Vec::new()
                },
                closers_untracked: false,
                outside: Vec::new(),
                unattributed: Vec::new(),
                mapped: false,
                rdwr: w.rdwr,
            })),
        };
        FileHandle {
            file,
            node,
            identity,
            caller,
            writable,
            open_rels,
            state: Mutex::new(state),
        }
    }

    /// The write state, if this handle may change its file.
    pub fn write_state(&self) -> Option<MappedMutexGuard<'_, WriteState>> {
        MutexGuard::try_map(self.state.lock(), |s| match s {
            HandleState::Write(w) => Some(&mut **w),
            HandleState::Read(_) => None,
        })
        .ok()
    }

    /// What was recorded of the reads through this handle.
    pub fn read_state(&self) -> MappedMutexGuard<'_, ReadState> {
        MutexGuard::map(self.state.lock(), |s| match s {
            HandleState::Write(w) => &mut w.read,
            HandleState::Read(r) => r,
        })
    }

    /// A rebase todo list opened for writing.
    pub fn is_todo(&self) -> bool {
        self.write_state().is_some_and(|w| w.todo)
    }

    /// The write just made (or refused) counts as a change since the last entry.
    pub fn mark_changed(&self) {
        if let Some(mut w) = self.write_state() {
            w.dirty = true;
            w.wrote = true;
        }
    }
}
