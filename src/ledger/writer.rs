//! The ledger writer: one thread, fed by a bounded channel, appending hash-chained
//! lines with group commit (one `write` and one `fdatasync` per batch).
//!
//! What it guarantees:
//! - An entry is never dropped: a full queue blocks the caller (back-pressure).
//! - [`Ledger::record`] returns Ok only once the entry's line is on stable storage.
//! - If the file cannot be written (ENOSPC, EIO) the bytes stay in memory, the file
//!   is truncated back to its last good length (no partial line), [`Ledger::health`]
//!   reports the failure so the filesystem fails mutations closed, and the writer
//!   retries every 100 ms until it succeeds.
//! - At open, a torn tail (no final `\n`, or trailing lines that do not parse) is cut
//!   off and a `LEDGER_REPAIR` entry records what was removed. A break in the middle
//!   of the chain is evidence and is left alone; [`OpenReport`] tells it.
//!
//! It knows nothing about FUSE or the policy: it turns [`Draft`]s into lines.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use nix::fcntl::{Flock, FlockArg};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::entry::{b64_encode, encode_path, Draft, Entry, LineRange, MutationClass, MutationType};
use super::reader::{parse_line, ChainChecker, Finding, Lines};
use super::vcs::GitHead;

/// Most entries written per batch.
const MAX_BATCH: usize = 512;
/// Delay between retries while the file cannot be written.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// How long shutdown keeps retrying a failing disk before giving up (and logging).
const SHUTDOWN_RETRY_FOR: Duration = Duration::from_secs(10);
/// A torn tail longer than this is not a torn write: refuse to cut it.
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

/// How to open a ledger.
#[derive(Clone, Debug)]
pub struct LedgerOptions {
    /// The workspace root, for the `vcs` field (None: no `vcs`).
    pub workspace: Option<PathBuf>,
    /// Capacity of the queue in front of the writer; a full queue blocks callers.
    pub queue_capacity: usize,
    /// Longest time the writer spends gathering one batch.
    pub max_batch_delay: Duration,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            workspace: None,
            queue_capacity: 4096,
            max_batch_delay: Duration::from_millis(2),
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

/// The key of the (intent, path) set behind `mutation_class`.
type ClassKey = (Option<String>, Vec<u8>);

/// Sender side of one `record` call's wait.
type Ack = Sender<Result<(), String>>;

enum Msg {
    Record(Box<Draft>, Option<Ack>),
    Shutdown,
}

struct Inner {
    path: PathBuf,
    tx: Sender<Msg>,
    /// Some(reason) while the writer cannot write.
    health: Arc<Mutex<Option<String>>>,
    /// (intent, path) pairs that already had a classified mutation.
    classes: Arc<Mutex<HashSet<ClassKey>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Inner {
    fn shutdown(&self) {
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            // The thread drains everything queued before this message.
            let _ = self.tx.send(Msg::Shutdown);
            if h.join().is_err() {
                tracing::error!(ledger = %self.path.display(), "ledger writer thread panicked");
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
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(io_err)?;
        // One writer per ledger: a second daemon appending would fork the chain.
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(f) => f,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(LedgerError::InUse {
                    path: path.to_path_buf(),
                })
            }
            Err((_, e)) => return Err(io_err(io::Error::from(e))),
        };
        let scan = scan(&mut file).map_err(io_err)?;
        let mut classes = scan.classes;
        let mut report = OpenReport {
            entries: scan.kept_lines,
            repaired_torn_tail: None,
            chain_findings: scan.findings,
        };
        let mut state = WriterState {
            file,
            good_len: scan.good_len,
            last_hash: scan.last_hash,
            vcs: opts.workspace.as_deref().map(GitHead::new),
            pending: Vec::new(),
            waiters: Vec::new(),
            entries: scan.kept_lines,
            dirty_tail: false,
            path: path.to_path_buf(),
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
                .file
                .seek(SeekFrom::Start(scan.good_len))
                .map_err(io_err)?;
            state.file.read_to_end(&mut tail).map_err(io_err)?;
            state.file.set_len(scan.good_len).map_err(io_err)?;
            state.file.sync_all().map_err(io_err)?;
            let desc = format!(
                "removed {removed} bytes after line {} (an incomplete or unparsable last write)",
                scan.kept_lines
            );
            let draft = Draft {
                mutation_type: Some(MutationType::LedgerRepair),
                outcome: "repaired".to_owned(),
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
                .and_then(|()| state.file.sync_data())
                .map_err(io_err)?;
            report.entries = state.entries;
            report.repaired_torn_tail = Some(desc);
        }
        let classes = Arc::new(Mutex::new(classes));
        let health = Arc::new(Mutex::new(None));
        let (tx, rx) = crossbeam_channel::bounded(opts.queue_capacity.max(1));
        let thread = {
            let classes = classes.clone();
            let health = health.clone();
            let delay = opts.max_batch_delay;
            let path = path.to_path_buf();
            std::thread::Builder::new()
                .name("intentfs-ledger".into())
                .spawn(move || writer_loop(state, rx, classes, health, delay, path))
                .map_err(io_err)?
        };
        let inner = Inner {
            path: path.to_path_buf(),
            tx,
            health,
            classes,
            thread: Mutex::new(Some(thread)),
        };
        Ok((
            Ledger {
                inner: Arc::new(inner),
            },
            report,
        ))
    }

    /// Enqueues an entry and waits until it is on stable storage. Many waiting
    /// callers share one fsync. Blocks while the queue is full.
    pub fn record(&self, draft: Draft) -> Result<(), LedgerError> {
        if draft.mutation_type.is_none() {
            return Err(LedgerError::Invalid("no mutation_type"));
        }
        let (ack, wait) = crossbeam_channel::bounded(1);
        self.inner
            .tx
            .send(Msg::Record(Box::new(draft), Some(ack)))
            .map_err(|_| LedgerError::Closed)?;
        match wait.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(LedgerError::Unavailable(reason)),
            Err(_) => Err(LedgerError::Closed),
        }
    }

    /// Enqueues an entry without waiting for durability (it is written with the next
    /// batch, a few ms later). Blocks while the queue is full; never drops.
    pub fn record_nowait(&self, draft: Draft) -> Result<(), LedgerError> {
        if draft.mutation_type.is_none() {
            return Err(LedgerError::Invalid("no mutation_type"));
        }
        self.inner
            .tx
            .send(Msg::Record(Box::new(draft), None))
            .map_err(|_| LedgerError::Closed)
    }

    /// Err while the writer cannot write (callers fail mutations closed); Ok again
    /// once a retry succeeds.
    pub fn health(&self) -> Result<(), LedgerError> {
        match &*self.inner.health.lock() {
            Some(reason) => Err(LedgerError::Unavailable(reason.clone())),
            None => Ok(()),
        }
    }

    /// The class the next classified mutation by `intent` of `path` would get
    /// (`INTENT_EVOLUTION` for the first, `AST_REFACTOR` after). Entries still
    /// queued are not counted.
    pub fn next_class(&self, intent: Option<&str>, path: &Path) -> MutationClass {
        let key = (
            intent.map(str::to_owned),
            path.as_os_str().as_bytes().to_vec(),
        );
        if self.inner.classes.lock().contains(&key) {
            MutationClass::AstRefactor
        } else {
            MutationClass::IntentEvolution
        }
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Flushes, fsyncs, stops and joins the writer thread. Later `record`s fail
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
    classes: HashSet<ClassKey>,
    findings: Vec<Finding>,
}

fn scan(file: &mut File) -> io::Result<Scan> {
    let file_len = file.metadata()?.len();
    file.seek(SeekFrom::Start(0))?;
    let mut checker = ChainChecker::new();
    let mut classes = HashSet::new();
    let mut good = (0u64, 0u64, checker.last_hash().to_owned());
    for line in Lines::new(io::BufReader::with_capacity(256 * 1024, &mut *file)) {
        let line = line?;
        match parse_line(line.content()) {
            Ok(e) if line.terminated => {
                checker.push(&line, Some(&e.prev), None);
                if let Some(k) = class_key_of_entry(&e) {
                    classes.insert(k);
                }
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

fn class_key_of_entry(e: &Entry) -> Option<ClassKey> {
    if !e.mutation_type.is_classified() {
        return None;
    }
    let p = e.path_buf()?;
    Some((e.intent_id.clone(), p.as_os_str().as_bytes().to_vec()))
}

/// The writer thread's state.
struct WriterState {
    /// The ledger, open O_APPEND and exclusively locked (released when dropped).
    file: Flock<File>,
    /// Length of the file up to its last durable, complete line.
    good_len: u64,
    /// Hex hash of the last line appended to `pending` (or on disk).
    last_hash: String,
    vcs: Option<GitHead>,
    /// Serialized lines not yet durable.
    pending: Vec<u8>,
    /// Callers waiting for `pending` to be durable.
    waiters: Vec<Ack>,
    /// Lines in the file plus in `pending`.
    entries: u64,
    /// The file may extend past `good_len` (a failed write whose truncation failed).
    dirty_tail: bool,
    /// The ledger's path (for the head checkpoint beside it).
    path: PathBuf,
}

impl WriterState {
    /// Turns a draft into a chained line at the end of `pending`.
    fn append(&mut self, d: &Draft, classes: &mut HashSet<ClassKey>) {
        let Some(mt) = d.mutation_type else { return };
        let mutation_class = if mt.is_classified() {
            d.path.as_ref().map(|p| {
                let key = (d.intent_id.clone(), p.as_os_str().as_bytes().to_vec());
                if classes.insert(key) {
                    MutationClass::IntentEvolution
                } else {
                    MutationClass::AstRefactor
                }
            })
        } else {
            None
        };
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
                r.iter()
                    .map(|&(start_line, end_line)| LineRange {
                        start_line,
                        end_line,
                    })
                    .collect()
            }),
            vcs: self.vcs.as_mut().and_then(GitHead::vcs),
            outcome: d.outcome.clone(),
            code: d.code.clone(),
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
            self.file.set_len(self.good_len)?;
            self.dirty_tail = false;
        }
        match self.file.write_all(&self.pending) {
            Ok(()) => {
                self.good_len += self.pending.len() as u64;
                self.pending.clear();
                Ok(())
            }
            Err(e) => {
                // A partial line must never stay: truncate now, and again before the
                // next attempt if this truncation fails too.
                self.dirty_tail = self.file.set_len(self.good_len).is_err();
                Err(e)
            }
        }
    }

    /// Writes the batch and answers every waiter, then makes it durable (one `fdatasync`
    /// per batch); updates health.
    ///
    /// Why waiters are answered after the `write` and before the `fdatasync`: once the
    /// bytes are in the file, a killed daemon cannot lose them (the kernel has them); only a
    /// power cut can, and that is the torn tail repaired at the next mount. Waiting for the
    /// disk on every mutation would cost a sequential workload (`tar x`) one disk flush per
    /// file; the fsync still follows within the batch delay.
    fn commit(&mut self, health: &Mutex<Option<String>>, path: &Path) {
        let res = self.write_batch().and_then(|()| {
            for w in self.waiters.drain(..) {
                let _ = w.send(Ok(()));
            }
            self.file.sync_data()
        });
        match res {
            Ok(()) => {
                let recovered = health.lock().take();
                if let Some(reason) = recovered {
                    tracing::info!(ledger = %path.display(), "ledger writable again after: {reason}");
                }
                // The checkpoint may lag (a crash between fsync and rename): it is a lower
                // bound of what is durable, which is all verify needs.
                if let Err(e) = write_head(
                    &self.path,
                    self.entries - self.pending_lines(),
                    &self.last_hash_durable(),
                ) {
                    tracing::warn!("ledger head checkpoint: {e}");
                }
            }
            Err(e) => {
                let reason = format!(
                    "cannot write {}: {e} (entries kept in memory, retrying)",
                    path.display()
                );
                let mut h = health.lock();
                if h.is_none() {
                    tracing::error!("{reason}");
                }
                *h = Some(reason.clone());
                drop(h);
                for w in self.waiters.drain(..) {
                    let _ = w.send(Err(reason.clone()));
                }
            }
        }
    }

    /// Lines still in `pending` (0 after a successful write).
    fn pending_lines(&self) -> u64 {
        self.pending.iter().filter(|b| **b == b'\n').count() as u64
    }

    /// Hash of the last line in the file (pending is empty after a successful commit).
    fn last_hash_durable(&self) -> String {
        self.last_hash.clone()
    }
}

fn writer_loop(
    mut st: WriterState,
    rx: Receiver<Msg>,
    classes: Arc<Mutex<HashSet<ClassKey>>>,
    health: Arc<Mutex<Option<String>>>,
    max_delay: Duration,
    path: PathBuf,
) {
    let mut shutting_down = false;
    while !shutting_down {
        // Wait for work; while bytes are pending (failing disk), wake to retry.
        let first = if st.pending.is_empty() {
            match rx.recv() {
                Ok(m) => m,
                Err(_) => break,
            }
        } else {
            match rx.recv_timeout(RETRY_EVERY) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    st.commit(&health, &path);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        // Gather a batch: whatever is queued, up to MAX_BATCH or max_delay. Never wait
        // on an empty queue: a lone caller must not pay the batch delay.
        let started = Instant::now();
        let mut msg = Some(first);
        let mut n = 0;
        {
            let mut cls = classes.lock();
            while let Some(m) = msg.take() {
                match m {
                    Msg::Record(d, ack) => {
                        st.append(&d, &mut cls);
                        st.waiters.extend(ack);
                        n += 1;
                    }
                    Msg::Shutdown => {
                        shutting_down = true;
                        break;
                    }
                }
                if n >= MAX_BATCH || started.elapsed() >= max_delay {
                    break;
                }
                match rx.try_recv() {
                    Ok(m) => msg = Some(m),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
                }
            }
        }
        st.commit(&health, &path);
    }
    // Shutdown: drain what is still queued (a racing record_nowait), then make it durable.
    {
        let mut cls = classes.lock();
        while let Ok(m) = rx.try_recv() {
            if let Msg::Record(d, ack) = m {
                st.append(&d, &mut cls);
                st.waiters.extend(ack);
            }
        }
    }
    let deadline = Instant::now() + SHUTDOWN_RETRY_FOR;
    loop {
        st.commit(&health, &path);
        if st.pending.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            tracing::error!(
                ledger = %path.display(),
                "ledger shut down with {} bytes of entries not written",
                st.pending.len()
            );
            break;
        }
        std::thread::sleep(RETRY_EVERY);
    }
    *health.lock() = Some("ledger is shut down".to_owned());
}

/// The head checkpoint beside a ledger: how many entries are durable and the hash of the
/// last one, so `verify` detects deleted or rewritten last lines.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub entries: u64,
    pub last: String,
}

/// `<ledger>.head`.
pub fn head_path(ledger: &Path) -> PathBuf {
    let mut p = ledger.as_os_str().to_os_string();
    p.push(".head");
    PathBuf::from(p)
}

/// Read the head checkpoint, if there is one.
pub fn read_head(ledger: &Path) -> Option<Head> {
    serde_json::from_slice(&std::fs::read(head_path(ledger)).ok()?).ok()
}

fn write_head(ledger: &Path, entries: u64, last: &str) -> io::Result<()> {
    let head = head_path(ledger);
    let mut tmp = head.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let body = serde_json::to_vec(&Head {
        entries,
        last: last.to_owned(),
    })
    .map_err(io::Error::other)?;
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, &head)
}
