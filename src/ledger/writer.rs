//! The ledger writer: hash-chained lines appended by the calling thread itself (one
//! `write(2)` under a lock, no hand-off to another thread on the syscall's path), and a
//! background thread that makes them durable with group commit (one `fdatasync` for
//! everything written since the last one) and writes the head checkpoint.
//!
//! What it guarantees:
//! - An entry is never dropped.
//! - [`Ledger::record`] returns Ok only once the entry's line is in the file (written
//!   with `write(2)`): a killed daemon cannot lose it; `fdatasync` follows within a few
//!   milliseconds (a power cut is the torn tail repaired at the next open).
//! - If the file cannot be written (ENOSPC, EIO) the bytes stay in memory, the file
//!   is truncated back to its last good length (no partial line), [`Ledger::health`]
//!   reports the failure so the filesystem fails mutations closed, and the writer
//!   retries every 100 ms until it succeeds.
//! - At open, a torn tail (no final `\n`, or trailing lines that do not parse) is cut
//!   off and a `LEDGER_REPAIR` entry records what was removed. A break in the middle
//!   of the chain is evidence and is left alone; [`OpenReport`] tells it.
//!
//! It knows nothing about FUSE or the policy: it turns [`Draft`]s into lines.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use nix::fcntl::{Flock, FlockArg};
use parking_lot::{Condvar, Mutex};
use sha2::{Digest, Sha256};

use super::entry::{b64_encode, encode_path, Draft, Entry, LineRange, MutationClass, MutationType};
use super::head::write_head;
// The head record's home is `head`; these names stay reachable here for existing callers.
pub use super::head::{head_path, read_head, Head};
use super::reader::{parse_line, ChainChecker, Finding, Lines};
use super::vcs::GitHead;

/// Delay between retries while the file cannot be written.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// How long shutdown keeps retrying a failing disk before giving up (and logging).
const SHUTDOWN_RETRY_FOR: Duration = Duration::from_secs(10);
/// A torn tail longer than this is not a torn write: refuse to cut it.
/// How long opening a ledger waits for another process to release it (a daemon that was
/// just unmounted closes its ledger last).
const LOCK_WAIT: Duration = Duration::from_secs(5);
const MAX_TORN_TAIL: u64 = 4 * 1024 * 1024;

/// Errors of the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Opening, reading or repairing the ledger file failed.
    #[error("ledger {path}: {source}")]
    Io {
        /// The ledger file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The writer cannot write right now (disk full, I/O error); it keeps retrying.
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    /// The ledger was shut down.
    #[error("ledger is shut down")]
    Closed,
    /// The draft cannot be recorded (no mutation type).
    #[error("invalid ledger draft: {0}")]
    Invalid(&'static str),
    /// Another process holds the ledger open for writing.
    #[error(
        "ledger {path} is in use by another intentfs process (is the workspace mounted twice?)"
    )]
    InUse {
        /// The ledger file.
        path: PathBuf,
    },
    /// The file is damaged in a way open does not repair.
    #[error("ledger {path}: {msg}")]
    Corrupt {
        /// The ledger file.
        path: PathBuf,
        /// What is wrong, with a hint.
        msg: String,
    },
}

/// Called by the ledger's sync thread before each `fdatasync` of the ledger: what entries
/// refer to (the content store's objects) is made durable first, so an entry that
/// survives a power cut names objects that survived it too.
#[derive(Clone)]
pub struct BeforeSync(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for BeforeSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeSync(..)")
    }
}

/// How to open a ledger.
#[derive(Clone, Debug)]
pub struct LedgerOptions {
    /// The workspace root, for the `vcs` field (None: no `vcs`).
    pub workspace: Option<PathBuf>,
    /// Unused since entries are written by the calling thread (kept for API compatibility).
    pub queue_capacity: usize,
    /// Shortest time between two `fdatasync`s (at least 5 ms): group commit.
    pub max_batch_delay: Duration,
    /// Run before each `fdatasync` of the ledger (the content store's `sync`).
    pub before_sync: Option<BeforeSync>,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            workspace: None,
            queue_capacity: 4096,
            max_batch_delay: Duration::from_millis(2),
            before_sync: None,
        }
    }
}

/// What [`Ledger::open`] found.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    /// Lines in the ledger after open (including the repair entry, if any).
    pub entries: u64,
    /// Description of the torn tail that was cut off, if any.
    pub repaired_torn_tail: Option<String>,
    /// Chain breaks and unparsable lines in the kept part: evidence, not repaired.
    /// The daemon should log them as a warning.
    pub chain_findings: Vec<Finding>,
}

/// The (intent, path) pairs behind `mutation_class`: which intents already made a
/// classified change to each path (kept for the ledger's lifetime: an intent's first write
/// to a path is the first ever, even if the file was deleted in between).
///
/// It grows with every distinct path ever changed (a build's outputs, a tree unpacked
/// under new names), so a path is kept as 16 bytes of its SHA-256 and an intent as an
/// index into the intents seen: about 60 bytes a path instead of about 190 with the path
/// and the intent's name in each entry. (Two paths with the same 128-bit prefix would share
/// a first write; that is far below every other failure's odds.)
#[derive(Default)]
struct Classes {
    by_path: HashMap<[u8; 16], Vec<u16>>,
    intents: Vec<Option<String>>,
}

fn path_key(path: &[u8]) -> [u8; 16] {
    let d = Sha256::digest(path);
    let mut k = [0u8; 16];
    k.copy_from_slice(&d[..16]);
    k
}

impl Classes {
    fn intent_index(&self, intent: &Option<String>) -> Option<u16> {
        self.intents
            .iter()
            .position(|i| i == intent)
            .map(|i| i as u16)
    }

    fn contains(&self, intent: &Option<String>, path: &[u8]) -> bool {
        let Some(i) = self.intent_index(intent) else {
            return false;
        };
        self.by_path
            .get(&path_key(path))
            .is_some_and(|v| v.contains(&i))
    }

    /// What one entry does to the set, and the class it gets (the same at append and
    /// when the set is rebuilt from the ledger at open).
    fn apply(
        &mut self,
        mt: MutationType,
        intent: &Option<String>,
        path: Option<&[u8]>,
    ) -> Option<MutationClass> {
        match path {
            Some(p) if mt.is_classified() => {
                let i = match self.intent_index(intent) {
                    Some(i) => i,
                    // More than 65,536 intents in one ledger: the rest share the last slot.
                    None if self.intents.len() > u16::MAX as usize => u16::MAX,
                    None => {
                        self.intents.push(intent.clone());
                        (self.intents.len() - 1) as u16
                    }
                };
                let v = self.by_path.entry(path_key(p)).or_default();
                Some(if v.contains(&i) {
                    MutationClass::AstRefactor
                } else {
                    v.push(i);
                    MutationClass::IntentEvolution
                })
            }
            _ => None,
        }
    }
}

/// What the writer state and the sync thread share.
struct Shared {
    state: Mutex<WriterState>,
    /// Wakes the sync thread: something was written (or is pending after a failure).
    wake: Condvar,
    /// Some(reason) while the writer cannot write.
    health: Mutex<Option<String>>,
    /// Some(reason) while no [`RESERVE`] can be kept past the ledger's end (its disk is
    /// nearly full): mutations are refused, though entries still land.
    short: Mutex<Option<String>>,
    /// The size of that reserve: [`RESERVE`], or 1/64 of a smaller filesystem.
    reserve: u64,
    /// Bytes of entries appended since the ledger was opened, counted from its length
    /// then (written or still pending).
    appended: Arc<AtomicU64>,
    /// The ledger's length when the reserve was last kept past it (or when it was opened).
    topped: AtomicU64,
    /// The filesystem cannot preallocate: there is no reserve.
    unreserved: AtomicBool,
    /// (intent, path) pairs that already had a classified mutation.
    classes: Mutex<Classes>,
}

struct Inner {
    path: PathBuf,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Inner {
    fn shutdown(&self) {
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            {
                let mut st = self.shared.state.lock();
                st.shutdown = true;
            }
            self.shared.wake.notify_all();
            if h.join().is_err() {
                tracing::error!(ledger = %self.path.display(), "ledger sync thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Handle to an open ledger; cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Ledger {
    /// Opens (creating it and its directory if needed) the ledger at `path`, repairs
    /// a torn tail, rebuilds the mutation-class state and starts the writer thread.
    pub fn open(path: &Path, opts: LedgerOptions) -> Result<(Ledger, OpenReport), LedgerError> {
        let io_err = |source| LedgerError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(io_err)?;
        // One writer per ledger: a second daemon appending would fork the chain. A daemon
        // just unmounted (`umount /mnt && mount /mnt`) still closes its ledger for a moment:
        // wait a little for it before calling the ledger in use.
        let deadline = Instant::now() + LOCK_WAIT;
        let mut file = loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(f) => break f,
                Err((f, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    file = f;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(LedgerError::InUse {
                        path: path.to_path_buf(),
                    })
                }
                Err((_, e)) => return Err(io_err(io::Error::from(e))),
            }
        };
        let scan = scan(&mut file).map_err(io_err)?;
        let mut classes = scan.classes;
        let mut report = OpenReport {
            entries: scan.kept_lines,
            repaired_torn_tail: None,
            chain_findings: scan.findings,
        };
        let mut state = WriterState {
            file: Some(file),
            good_len: scan.good_len,
            last_hash: scan.last_hash,
            vcs: opts.workspace.as_deref().map(GitHead::new),
            pending: Vec::new(),
            entries: scan.kept_lines,
            dirty_tail: false,
            unsynced: false,
            shutdown: false,
            closed: false,
            appended: Arc::new(AtomicU64::new(scan.good_len)),
        };
        if scan.file_len > scan.good_len {
            let removed = scan.file_len - scan.good_len;
            if removed > MAX_TORN_TAIL {
                return Err(LedgerError::Corrupt {
                    path: path.to_path_buf(),
                    msg: format!(
                        "the last {removed} bytes after line {} do not parse; too much for a torn write, \
                         so it is not repaired automatically (inspect it, then cut it off by hand)",
                        scan.kept_lines
                    ),
                });
            }
            let mut tail = Vec::with_capacity(removed as usize);
            state
                .f()
                .map_err(io_err)?
                .seek(SeekFrom::Start(scan.good_len))
                .map_err(io_err)?;
            state
                .f()
                .map_err(io_err)?
                .read_to_end(&mut tail)
                .map_err(io_err)?;
            state
                .f()
                .map_err(io_err)?
                .set_len(scan.good_len)
                .map_err(io_err)?;
            state.f().map_err(io_err)?.sync_all().map_err(io_err)?;
            let desc = format!(
                "removed {removed} bytes after line {} (an incomplete or unparsable last write)",
                scan.kept_lines
            );
            let draft = Draft {
                mutation_type: Some(MutationType::LedgerRepair),
                outcome: super::Outcome::Repaired,
                detail: Some(serde_json::json!({
                    "removed_bytes": removed,
                    "removed_text_b64": b64_encode(&tail),
                    "after_line": scan.kept_lines,
                })),
                ..Draft::default()
            };
            state.append(&draft, &mut classes);
            state
                .write_batch()
                .and_then(|()| state.f()?.sync_data())
                .map_err(io_err)?;
            report.entries = state.entries;
            report.repaired_torn_tail = Some(desc);
        }
        let sync_file = state.f().and_then(|f| f.try_clone()).map_err(io_err)?;
        let reserve = match rustix::fs::fstatvfs(&sync_file) {
            Ok(v) => RESERVE
                .min(v.f_blocks.saturating_mul(v.f_frsize) / 64)
                .max(4096),
            Err(_) => RESERVE,
        };
        let appended = state.appended.clone();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: Condvar::new(),
            health: Mutex::new(None),
            short: Mutex::new(None),
            reserve,
            topped: AtomicU64::new(appended.load(Ordering::Relaxed)),
            appended,
            unreserved: AtomicBool::new(false),
            classes: Mutex::new(classes),
        });
        let thread = {
            let shared = shared.clone();
            let delay = opts.max_batch_delay;
            let path = path.to_path_buf();
            let before = opts.before_sync.clone();
            std::thread::Builder::new()
                .name("intentfs-ledger".into())
                .spawn(move || sync_loop(shared, sync_file, delay, path, before))
                .map_err(io_err)?
        };
        let inner = Inner {
            path: path.to_path_buf(),
            shared,
            thread: Mutex::new(Some(thread)),
        };
        Ok((
            Ledger {
                inner: Arc::new(inner),
            },
            report,
        ))
    }

    /// Appends an entry and returns once its line is in the file (`write(2)` done): a
    /// killed daemon cannot lose it. The `fdatasync` follows within [`SYNC_EVERY`] (50 ms),
    /// shared by everything written meanwhile (group commit).
    pub fn record(&self, draft: Draft) -> Result<(), LedgerError> {
        if draft.mutation_type.is_none() {
            return Err(LedgerError::Invalid("no mutation_type"));
        }
        self.append(&draft)
    }

    /// Appends an entry like [`Ledger::record`], but a write failure is not reported (the
    /// entry stays in memory and is retried until it lands). Never drops.
    pub fn record_nowait(&self, draft: Draft) -> Result<(), LedgerError> {
        if draft.mutation_type.is_none() {
            return Err(LedgerError::Invalid("no mutation_type"));
        }
        match self.append(&draft) {
            Err(LedgerError::Closed) => Err(LedgerError::Closed),
            _ => Ok(()),
        }
    }

    /// Chain and write one entry (with whatever an earlier failure left pending).
    fn append(&self, draft: &Draft) -> Result<(), LedgerError> {
        let sh = &*self.inner.shared;
        let mut st = sh.state.lock();
        if st.closed {
            return Err(LedgerError::Closed);
        }
        {
            let mut cls = sh.classes.lock();
            st.append(draft, &mut cls);
        }
        let res = st.write_batch();
        match res {
            Ok(()) => {
                st.unsynced = true;
                // A quarter of the reserve taken since it was last kept: kept again now,
                // not at the next sync, so the entries written before their reply never
                // take more than that of what the entries queued were counted on
                // (`deferrable_bytes`) before the ledger finds its disk full.
                if sh.beyond_reserve() >= sh.reserve / 4 {
                    let len = st.good_len;
                    if let Ok(f) = st.f() {
                        sh.top_up(f, len, &self.inner.path);
                    }
                }
                drop(st);
                sh.wake.notify_one();
                if sh.health.lock().is_some() {
                    // The disk takes lines again (the sync thread confirms with its flush).
                    let recovered = sh.health.lock().take();
                    if let Some(reason) = recovered {
                        tracing::info!(ledger = %self.inner.path.display(), "ledger writable again after: {reason}");
                    }
                }
                Ok(())
            }
            Err(e) => {
                let reason = format!(
                    "cannot write {}: {e} (entries kept in memory, retrying)",
                    self.inner.path.display()
                );
                drop(st);
                let mut h = sh.health.lock();
                if h.is_none() {
                    tracing::error!("{reason}");
                }
                *h = Some(reason.clone());
                drop(h);
                sh.wake.notify_one();
                Err(LedgerError::Unavailable(reason))
            }
        }
    }

    /// What entries queued to be written later (`--record async`) may take together now,
    /// in bytes: half the reserve, less what was appended since the reserve was last kept
    /// (so a disk filled behind the ledger's back still has room for all of them). The
    /// other half is for the entries written before their reply while the ledger finds
    /// the disk full. Where there is no reserve, half of [`RESERVE`].
    pub fn deferrable_bytes(&self) -> u64 {
        let sh = &*self.inner.shared;
        if sh.unreserved.load(Ordering::Relaxed) {
            return RESERVE / 2;
        }
        (sh.reserve / 2).saturating_sub(sh.beyond_reserve())
    }

    /// Err while the writer cannot write (callers fail mutations closed); Ok again
    /// once a retry succeeds.
    pub fn health(&self) -> Result<(), LedgerError> {
        let sh = &*self.inner.shared;
        let reason = sh.health.lock().clone().or_else(|| sh.short.lock().clone());
        reason.map_or(Ok(()), |r| Err(LedgerError::Unavailable(r)))
    }

    /// The class the next classified mutation by `intent` of `path` would get
    /// (`INTENT_EVOLUTION` for the first, `AST_REFACTOR` after). Entries still
    /// queued are not counted.
    pub fn next_class(&self, intent: Option<&str>, path: &Path) -> MutationClass {
        let intent = intent.map(str::to_owned);
        if self
            .inner
            .shared
            .classes
            .lock()
            .contains(&intent, path.as_os_str().as_bytes())
        {
            MutationClass::AstRefactor
        } else {
            MutationClass::IntentEvolution
        }
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Flushes, fsyncs, stops and joins the sync thread. Later `record`s fail
    /// with [`LedgerError::Closed`]. Also done when the last handle is dropped.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// What the open-time scan learned.
struct Scan {
    file_len: u64,
    /// End of the last line that parses (everything after it is a torn tail).
    good_len: u64,
    kept_lines: u64,
    last_hash: String,
    classes: Classes,
    findings: Vec<Finding>,
}

fn scan(file: &mut File) -> io::Result<Scan> {
    let file_len = file.metadata()?.len();
    file.seek(SeekFrom::Start(0))?;
    let mut checker = ChainChecker::new();
    let mut classes = Classes::default();
    let mut good = (0u64, 0u64, checker.last_hash().to_owned());
    for line in Lines::new(io::BufReader::with_capacity(256 * 1024, &mut *file)) {
        let line = line?;
        match parse_line(line.content()) {
            Ok(e) if line.terminated => {
                checker.push(&line, Some(&e.prev), None);
                let path = e.path_buf();
                classes.apply(
                    e.mutation_type,
                    &e.intent_id,
                    path.as_ref().map(|p| p.as_os_str().as_bytes()),
                );
                good = (
                    line.offset + line.bytes.len() as u64,
                    line.line_no,
                    checker.last_hash().to_owned(),
                );
            }
            Ok(_) => checker.push(&line, None, Some("no final newline".into())),
            Err(err) => checker.push(&line, None, Some(err.to_string())),
        }
    }
    let (good_len, kept_lines, last_hash) = good;
    // Findings past the last good line belong to the torn tail, which is cut off.
    let findings = checker
        .finish()
        .into_iter()
        .filter(|f| f.line <= kept_lines)
        .collect();
    Ok(Scan {
        file_len,
        good_len,
        kept_lines,
        last_hash,
        classes,
        findings,
    })
}

/// The writer thread's state.
struct WriterState {
    /// The ledger, open O_APPEND and exclusively locked (released when dropped, at
    /// shutdown).
    file: Option<Flock<File>>,
    /// Length of the file up to its last durable, complete line.
    good_len: u64,
    /// Hex hash of the last line appended to `pending` (or on disk).
    last_hash: String,
    vcs: Option<GitHead>,
    /// Serialized lines not yet written (only after a failed write).
    pending: Vec<u8>,
    /// Lines in the file plus in `pending`.
    entries: u64,
    /// The file may extend past `good_len` (a failed write whose truncation failed).
    dirty_tail: bool,
    /// Lines were written since the last `fdatasync` was started.
    unsynced: bool,
    /// Shutdown was asked: the sync thread drains, syncs and stops.
    shutdown: bool,
    /// Shut down: later appends fail.
    closed: bool,
    /// [`Shared::appended`].
    appended: Arc<AtomicU64>,
}

impl WriterState {
    fn f(&mut self) -> io::Result<&mut Flock<File>> {
        self.file
            .as_mut()
            .ok_or_else(|| io::Error::other("ledger is shut down"))
    }

    /// Turns a draft into a chained line at the end of `pending`.
    fn append(&mut self, d: &Draft, classes: &mut Classes) {
        let Some(mt) = d.mutation_type else { return };
        let mutation_class = classes.apply(
            mt,
            &d.intent_id,
            d.path.as_ref().map(|p| p.as_os_str().as_bytes()),
        );
        let (path, path_b64) = d.path.as_deref().map(encode_path).unzip();
        let (from, from_b64) = d.from.as_deref().map(encode_path).unzip();
        let entry = Entry {
            id: uuid::Uuid::new_v4().to_string(),
            timestamp: Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true),
            intent_id: d.intent_id.clone(),
            agent: d.agent.clone(),
            mutation_type: mt,
            mutation_class,
            path,
            path_b64: path_b64.flatten(),
            from,
            from_b64: from_b64.flatten(),
            content_hash: d.content_hash.clone(),
            prev_content_hash: d.prev_content_hash.clone(),
            size: d.size,
            created: d.created,
            ranges: d.ranges.as_ref().map(|r| {
                super::ranges::coarsen(r, super::ranges::MAX_RANGES)
                    .iter()
                    .map(|&(start_line, end_line)| LineRange {
                        start_line,
                        end_line,
                    })
                    .collect()
            }),
            // (Looked at again at most every RECHECK, and after a ref moved through the mount:
            // its own entry, which follows the move, is the first to name the new revision.)
            vcs: self
                .vcs
                .as_mut()
                .and_then(|g| g.vcs_within(super::vcs::RECHECK, mt == MutationType::Ref)),
            outcome: d.outcome.as_str().to_owned(),
            code: d.code.map(|c| c.as_str().to_owned()),
            rule: d.rule.clone(),
            detail: d.detail.clone(),
            prev: std::mem::take(&mut self.last_hash),
        };
        let start = self.pending.len();
        // Serializing plain data into a Vec cannot fail.
        if let Err(e) = serde_json::to_writer(&mut self.pending, &entry) {
            tracing::error!("ledger entry serialization failed: {e}");
            self.pending.truncate(start);
            self.last_hash = entry.prev;
            return;
        }
        self.pending.push(b'\n');
        self.appended
            .fetch_add((self.pending.len() - start) as u64, Ordering::Relaxed);
        self.last_hash = hex::encode(Sha256::digest(&self.pending[start..]));
        self.entries += 1;
    }

    /// Writes `pending` with one `write`; on failure truncates back to the last good
    /// length and keeps `pending` for the next try.
    fn write_batch(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if self.dirty_tail {
            // A previous attempt may have left part of a line: cut back to the last
            // good length first (O_APPEND writes at the end of whatever is there).
            let good = self.good_len;
            self.f()?.set_len(good)?;
            self.dirty_tail = false;
        }
        let pending = std::mem::take(&mut self.pending);
        let res = self.f().and_then(|f| f.write_all(&pending));
        self.pending = pending;
        match res {
            Ok(()) => {
                self.good_len += self.pending.len() as u64;
                self.pending.clear();
                Ok(())
            }
            Err(e) => {
                // A partial line must never stay: truncate now, and again before the
                // next attempt if this truncation fails too.
                let good = self.good_len;
                self.dirty_tail = self.f().and_then(|f| f.set_len(good)).is_err();
                Err(e)
            }
        }
    }

    /// Lines still in `pending` (0 after a successful write).
    fn pending_lines(&self) -> u64 {
        self.pending.iter().filter(|b| **b == b'\n').count() as u64
    }
}

/// Shortest time between two `fdatasync`s: a stream of mutations shares one flush (an
/// entry after a quiet spell is synced at once). Each flush commits the filesystem's
/// journal, and the store's `syncfs` before it writes back every file the agent has
/// dirtied. An edit loop that stores new versions (a file written in place, a temporary
/// renamed over another) took 12% less time and 9% less daemon CPU with 50 ms than with
/// 5 ms (31 interleaved rounds, docs/speed.md). A power cut loses at most this much of
/// the entries answered last; `kill -9` of the daemon loses none (they are written before
/// their reply).
const SYNC_EVERY: Duration = Duration::from_millis(50);

/// Space kept allocated past the ledger's end (`fallocate(FALLOC_FL_KEEP_SIZE)`: the
/// file's size does not change, its next lines go into blocks it already has), topped up
/// at every `fdatasync` (at most every [`SYNC_EVERY`] while entries come; a range already
/// allocated costs nothing) and by the append that finds a quarter of it taken, at most
/// 1/64 of the filesystem. When it cannot be (the disk
/// is nearly full), the ledger reports itself unavailable, so mutations are refused (fail
/// closed) while the entries of changes already answered still land in the reserve: the
/// closes and mode changes `--record async` queues (at most 256), and with `--record sync`
/// the entry of the change that was being made when the disk filled. Where the filesystem
/// cannot preallocate, the ledger goes without (and refuses mutations only once a write
/// fails).
const RESERVE: u64 = 512 << 10;

impl Shared {
    /// Keep the reserve past `len` (the ledger's length), or say why it cannot be kept.
    fn top_up(&self, file: &File, len: u64, path: &Path) {
        if self.unreserved.load(Ordering::Relaxed) {
            return;
        }
        use rustix::fs::{fallocate, FallocateFlags};
        match fallocate(file, FallocateFlags::KEEP_SIZE, len, self.reserve) {
            Ok(()) => {
                self.topped.fetch_max(len, Ordering::AcqRel);
                if let Some(reason) = self.short.lock().take() {
                    tracing::info!(ledger = %path.display(), "ledger space reserved again after: {reason}");
                }
            }
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => {
                self.unreserved.store(true, Ordering::Relaxed);
                tracing::info!(ledger = %path.display(), "the ledger's filesystem cannot preallocate: no space is reserved for entries");
            }
            Err(e) => {
                let reason = format!(
                    "cannot reserve {} KiB for the ledger at {}: {e} (mutations are refused until the disk has room; free space there)",
                    self.reserve >> 10,
                    path.display()
                );
                let mut short = self.short.lock();
                if short.is_none() {
                    tracing::error!("{reason}");
                }
                *short = Some(reason);
            }
        }
    }

    /// Bytes appended past the length the reserve was last kept past.
    fn beyond_reserve(&self) -> u64 {
        self.appended
            .load(Ordering::Acquire)
            .saturating_sub(self.topped.load(Ordering::Acquire))
    }
}

/// The background half: retries pending lines after a failure, makes written lines
/// durable (`fdatasync` outside the lock, so appends go on meanwhile) and keeps the head
/// checkpoint; at shutdown, drains and syncs, then closes.
fn sync_loop(
    sh: Arc<Shared>,
    sync_file: File,
    delay: Duration,
    path: PathBuf,
    before: Option<BeforeSync>,
) {
    let gap = SYNC_EVERY.max(delay);
    let mut head_file: Option<File> = None;
    let mut last_sync: Option<Instant> = None;
    let mut shutdown_deadline: Option<Instant> = None;
    let len = sh.state.lock().good_len;
    sh.top_up(&sync_file, len, &path);
    loop {
        let mut st = sh.state.lock();
        while !st.unsynced && st.pending.is_empty() && !st.shutdown {
            if sh.short.lock().is_none() {
                sh.wake.wait(&mut st);
            } else if sh.wake.wait_for(&mut st, RETRY_EVERY).timed_out() {
                // Short of space: look again for room now and then.
                let len = st.good_len;
                drop(st);
                sh.top_up(&sync_file, len, &path);
                st = sh.state.lock();
            }
        }
        if st.shutdown && shutdown_deadline.is_none() {
            shutdown_deadline = Some(Instant::now() + SHUTDOWN_RETRY_FOR);
        }
        // Retry what a failed write left pending.
        if !st.pending.is_empty() {
            match st.write_batch() {
                Ok(()) => {
                    st.unsynced = true;
                    let recovered = sh.health.lock().take();
                    if let Some(reason) = recovered {
                        tracing::info!(ledger = %path.display(), "ledger writable again after: {reason}");
                    }
                }
                Err(e) => {
                    let reason = format!(
                        "cannot write {}: {e} (entries kept in memory, retrying)",
                        path.display()
                    );
                    let mut h = sh.health.lock();
                    if h.is_none() {
                        tracing::error!("{reason}");
                    }
                    *h = Some(reason);
                    drop(h);
                    if let Some(d) = shutdown_deadline {
                        if Instant::now() >= d {
                            tracing::error!(
                                ledger = %path.display(),
                                "ledger shut down with {} bytes of entries not written",
                                st.pending.len()
                            );
                            st.closed = true;
                            st.file = None;
                            break;
                        }
                    }
                    sh.wake.wait_for(&mut st, RETRY_EVERY);
                    continue;
                }
            }
        }
        if st.unsynced {
            // Group commit: let a stream of appends share one flush.
            if !st.shutdown {
                if let Some(t) = last_sync {
                    let since = t.elapsed();
                    if since < gap {
                        drop(st);
                        std::thread::sleep(gap - since);
                        st = sh.state.lock();
                    }
                }
            }
            st.unsynced = false;
            let durable = (st.entries - st.pending_lines(), st.last_hash.clone());
            let pending_empty = st.pending.is_empty();
            let len = st.good_len;
            drop(st);
            sh.top_up(&sync_file, len, &path);
            last_sync = Some(Instant::now());
            if let Some(b) = &before {
                (b.0)();
            }
            match sync_file.sync_data() {
                Ok(()) => {
                    // The checkpoint may lag (a crash between fsync and rename): it is a
                    // lower bound of what is durable, which is all verify needs.
                    if pending_empty {
                        if let Err(e) = write_head(&path, &mut head_file, durable.0, &durable.1) {
                            tracing::warn!("ledger head checkpoint: {e}");
                        }
                    }
                    if sh.state.lock().pending.is_empty() {
                        let recovered = sh.health.lock().take();
                        if let Some(reason) = recovered {
                            tracing::info!(ledger = %path.display(), "ledger writable again after: {reason}");
                        }
                    }
                }
                Err(e) => {
                    let reason = format!("cannot sync {}: {e} (retrying)", path.display());
                    tracing::error!("{reason}");
                    *sh.health.lock() = Some(reason);
                    sh.state.lock().unsynced = true;
                    std::thread::sleep(RETRY_EVERY);
                }
            }
            continue;
        }
        if st.shutdown {
            st.closed = true;
            st.file = None;
            break;
        }
    }
    *sh.health.lock() = Some("ledger is shut down".to_owned());
}
