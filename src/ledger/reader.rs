//! Reading a ledger back: line iteration, chain verification, drift against the
//! workspace, and filtered queries. Pure functions over the ledger file (and, for
//! drift, the workspace files); they never write.
//!
//! Chain verification works on the raw bytes of each line: line `i`'s `prev` must be
//! the SHA-256 of line `i-1` including its `\n` (64 zeros for line 1). A hash chain
//! shows *where* it breaks, not always *why*; the messages say what the break is
//! consistent with, and use the other lines' hashes to tell insertions and
//! reorderings (the `prev` matches some other line) from edits and deletions (it
//! matches no line).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::entry::{Entry, MutationType, GENESIS_PREV};
use super::head::{head_path, read_head};
use super::ranges::sha256_file;

/// One raw line of a ledger file.
#[derive(Debug)]
pub struct RawLine {
    /// 1-based line number.
    pub line_no: u64,
    /// Byte offset of the line's start.
    pub offset: u64,
    /// The bytes, including the `\n` when `terminated`.
    pub bytes: Vec<u8>,
    /// Whether the line ends with `\n` (only the last line of a torn file does not).
    pub terminated: bool,
}

impl RawLine {
    /// The line without its `\n`.
    pub fn content(&self) -> &[u8] {
        if self.terminated {
            &self.bytes[..self.bytes.len() - 1]
        } else {
            &self.bytes
        }
    }

    /// Lowercase hex SHA-256 of the line's bytes including the `\n`: the next line's `prev`.
    pub fn hash_hex(&self) -> String {
        hex::encode(Sha256::digest(&self.bytes))
    }
}

/// Iterates over the raw lines of a reader.
pub struct Lines<R> {
    reader: R,
    offset: u64,
    line_no: u64,
}

impl<R: BufRead> Lines<R> {
    /// Lines of `reader`, numbered from 1.
    pub fn new(reader: R) -> Lines<R> {
        Lines {
            reader,
            offset: 0,
            line_no: 0,
        }
    }
}

impl<R: BufRead> Iterator for Lines<R> {
    type Item = io::Result<RawLine>;

    fn next(&mut self) -> Option<io::Result<RawLine>> {
        let mut bytes = Vec::new();
        match self.reader.read_until(b'\n', &mut bytes) {
            Ok(0) => None,
            Ok(n) => {
                self.line_no += 1;
                let line = RawLine {
                    line_no: self.line_no,
                    offset: self.offset,
                    terminated: bytes.last() == Some(&b'\n'),
                    bytes,
                };
                self.offset += n as u64;
                Some(Ok(line))
            }
            Err(e) => Some(Err(e)),
        }
    }
}

/// Opens a ledger file for line iteration.
pub fn lines(path: &Path) -> io::Result<Lines<BufReader<File>>> {
    Ok(Lines::new(BufReader::with_capacity(
        256 * 1024,
        File::open(path)?,
    )))
}

/// Parses one line's content as an entry.
pub fn parse_line(content: &[u8]) -> Result<Entry, serde_json::Error> {
    serde_json::from_slice(content)
}

/// Every entry that parses, in ledger order, with its 1-based line number.
pub fn read_entries(path: &Path) -> io::Result<Vec<(u64, Entry)>> {
    let mut out = Vec::new();
    for line in lines(path)? {
        let line = line?;
        if let Ok(e) = parse_line(line.content()) {
            out.push((line.line_no, e));
        }
    }
    Ok(out)
}

/// What kind of problem a verification finding is.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// The line is not a ledger entry (edited into invalid JSON, or garbage).
    Unparsable,
    /// The line's `prev` is not the hash of the line before it.
    ChainBroken,
    /// The file does not end with `\n` (a torn write; repaired at the next mount).
    TornTail,
    /// The file is shorter than, or its line at the checkpoint differs from, the head
    /// checkpoint (`<ledger>.head`): the last lines were deleted or rewritten.
    Truncated,
}

/// One problem found by [`verify_chain`].
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// 1-based line number where the problem shows.
    pub line: u64,
    /// What kind of problem.
    pub kind: FindingKind,
    /// For a broken chain: the line whose hash this line's `prev` matches, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prev_matches_line: Option<u64>,
    /// Human-readable, starting with `line N:`.
    pub message: String,
}

/// The result of [`verify_chain`].
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct VerifyReport {
    /// Number of lines (entries) in the file.
    pub entries: u64,
    /// Empty when the chain is intact.
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    /// Whether no finding was made.
    pub fn intact(&self) -> bool {
        self.findings.is_empty()
    }
}

/// First 8 bytes of a hash, for the "which line does this `prev` match" lookup
/// (explanations only; a collision could at worst mislabel a message).
fn short(hex_hash: &str) -> Option<u64> {
    // A tampered `prev` can be any string: 64 bytes is not 64 hex digits (slicing a
    // multi-byte character at byte 16 panicked; see tests/fuzz_regressions.rs).
    if hex_hash.len() != 64 || !hex_hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex_hash.get(..16)?, 16).ok()
}

/// Incremental chain checker, fed line by line (by [`verify_chain`] and by the
/// writer when it opens a ledger).
#[derive(Default)]
pub struct ChainChecker {
    /// Hex hash of the last line fed (None before the first line).
    last_hash: Option<String>,
    /// Short hash of every line, for explaining breaks.
    shorts: Vec<u64>,
    /// (line, short prev) of every break, explained in [`ChainChecker::finish`];
    /// the genesis value's short form is 0.
    breaks: Vec<(u64, Option<u64>)>,
    /// Findings that need no explanation.
    findings: Vec<Finding>,
}

impl ChainChecker {
    /// A checker expecting line 1.
    pub fn new() -> ChainChecker {
        ChainChecker::default()
    }

    /// Feeds the next line: `prev` is its parsed `prev` field, None when it does
    /// not parse (`parse_error` then says why).
    pub fn push(&mut self, line: &RawLine, prev: Option<&str>, parse_error: Option<String>) {
        let hash = line.hash_hex();
        let expected = self.last_hash.as_deref().unwrap_or(GENESIS_PREV);
        if let Some(err) = parse_error {
            self.findings.push(Finding {
                line: line.line_no,
                kind: FindingKind::Unparsable,
                prev_matches_line: None,
                message: format!("line {}: not a ledger entry ({err})", line.line_no),
            });
        } else if let Some(prev) = prev {
            if prev != expected {
                self.breaks.push((line.line_no, short(prev)));
            }
        }
        if !line.terminated {
            self.findings.push(Finding {
                line: line.line_no,
                kind: FindingKind::TornTail,
                prev_matches_line: None,
                message: format!(
                    "line {}: the file does not end with a newline (torn write); the next mount repairs it",
                    line.line_no
                ),
            });
        }
        self.shorts.push(short(&hash).unwrap_or(0));
        self.last_hash = Some(hash);
    }

    /// Hex hash of the last line fed: the `prev` of the next entry.
    pub fn last_hash(&self) -> &str {
        self.last_hash.as_deref().unwrap_or(GENESIS_PREV)
    }

    /// The findings, in line order, with breaks explained.
    pub fn finish(self) -> Vec<Finding> {
        let wanted: HashSet<u64> = self.breaks.iter().filter_map(|b| b.1).collect();
        let mut first_line: HashMap<u64, u64> = HashMap::new();
        for (i, s) in self.shorts.iter().enumerate() {
            if wanted.contains(s) {
                first_line.entry(*s).or_insert(i as u64 + 1);
            }
        }
        // For each broken line: Some(j) when its prev is line j's hash, Some(0) when
        // it is the genesis value, None when it matches nothing.
        let matches: HashMap<u64, Option<u64>> = self
            .breaks
            .iter()
            .map(|&(i, s)| {
                let j = match s {
                    Some(0) => Some(0),
                    Some(s) => first_line.get(&s).copied(),
                    None => None,
                };
                (i, j)
            })
            .collect();
        let m = |line: u64| matches.get(&line).copied().flatten();
        let mut findings = self.findings;
        for &(i, _) in &self.breaks {
            let j = m(i);
            // Lines i and i+1 exchanged: i's prev is i+1, i+1's prev is i-1 (or genesis).
            let swapped = j == Some(i + 1) && m(i + 1) == Some(i - 1);
            let why = match j {
                _ if swapped => format!("its prev matches line {}: lines {i} and {} are swapped", i + 1, i + 1),
                Some(0) => format!("its prev is the genesis value: lines 1..{} were inserted before the start of the ledger, or lines were reordered", i - 1),
                Some(j) if j + 2 == i => format!("its prev matches line {j}: line {} was inserted or moved here", j + 1),
                Some(j) if j + 2 < i => {
                    format!("its prev matches line {j}: lines {}..{} were inserted or moved here", j + 1, i - 1)
                }
                Some(j) => format!("its prev matches line {j}, which comes later: lines were reordered"),
                None if i == 1 => "its prev matches no line: lines were deleted from the start of the ledger, or line 1 was edited or inserted".to_owned(),
                None => format!(
                    "its prev matches no line: line {} was edited, or lines were deleted between lines {} and {i}",
                    i - 1,
                    i - 1
                ),
            };
            let head = if i == 1 {
                "line 1: chain broken: prev is not the genesis value (line edited, deleted, inserted or reordered here)".to_owned()
            } else {
                format!(
                    "line {i}: chain broken: prev does not match line {} (line edited, deleted, inserted or reordered here)",
                    i - 1
                )
            };
            findings.push(Finding {
                line: i,
                kind: FindingKind::ChainBroken,
                prev_matches_line: j.filter(|&j| j > 0),
                message: format!("{head}; {why}"),
            });
        }
        findings.sort_by_key(|f| (f.line, f.kind as u8));
        findings
    }
}

#[derive(Deserialize)]
struct PrevOnly {
    prev: String,
}

/// Checks the hash chain of a ledger file.
pub fn verify_chain(path: &Path) -> io::Result<VerifyReport> {
    let mut checker = ChainChecker::new();
    let mut entries = 0;
    // A backward chain cannot tell that its last lines are gone: the writer keeps a head
    // checkpoint (entries and the hash of the last durable line) beside the ledger.
    let head = read_head(path);
    let mut head_line_hash: Option<String> = None;
    for line in lines(path)? {
        let line = line?;
        entries += 1;
        if let Some(h) = &head {
            if entries == h.entries {
                let mut bytes = line.content().to_vec();
                bytes.push(b'\n');
                head_line_hash = Some(hex::encode(sha2::Sha256::digest(&bytes)));
            }
        }
        match parse_line(line.content()) {
            Ok(e) => checker.push(&line, Some(&e.prev), None),
            Err(err) => {
                // Still use a readable prev, so the chain around the line stays checked.
                let prev = serde_json::from_slice::<PrevOnly>(line.content()).ok();
                checker.push(
                    &line,
                    prev.as_ref().map(|p| p.prev.as_str()),
                    Some(err.to_string()),
                );
            }
        }
    }
    let mut findings = checker.finish();
    // Only needed when the chain is otherwise intact: any break already shows where lines
    // went missing; an intact chain that is shorter than the checkpoint lost its tail.
    if let Some(h) = head.filter(|_| findings.is_empty()) {
        if entries < h.entries {
            findings.push(Finding {
                line: entries + 1,
                kind: FindingKind::Truncated,
                prev_matches_line: None,
                message: format!(
                    "line {}: the ledger ends after {entries} entries, but its head checkpoint ({}) recorded {} \
                     durable entries: the last {} line(s) were deleted",
                    entries + 1,
                    head_path(path).display(),
                    h.entries,
                    h.entries - entries
                ),
            });
        } else if h.entries > 0 && head_line_hash.as_deref() != Some(h.last.as_str()) {
            findings.push(Finding {
                line: h.entries,
                kind: FindingKind::Truncated,
                prev_matches_line: None,
                message: format!(
                    "line {}: differs from the head checkpoint's last durable line (edited, or lines deleted \
                     and others written in their place)",
                    h.entries
                ),
            });
        }
    }
    findings.sort_by_key(|f| f.line);
    Ok(VerifyReport { entries, findings })
}

/// How a file differs from what the ledger last recorded.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DriftKind {
    /// The content on disk has another hash.
    Modified {
        /// Last recorded hash.
        recorded: String,
        /// Hash on disk now.
        actual: String,
    },
    /// The file is gone.
    Missing {
        /// Last recorded hash.
        recorded: String,
    },
}

/// A file changed outside the mount since its last ledger entry.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Drift {
    /// Workspace-relative path (lossy for display; see `path_buf` for the exact one).
    pub path: String,
    /// The exact path.
    #[serde(skip)]
    pub path_buf: PathBuf,
    /// Line of the entry that recorded the hash.
    pub line: u64,
    /// The entry's id.
    pub entry_id: String,
    /// What differs.
    #[serde(flatten)]
    pub kind: DriftKind,
    /// When a handle began writing the file through the mount and its WRITE never came
    /// (the daemon stopped, or the handle is still open): who that was. The content is
    /// then most likely that handle's, not a change made outside the mount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfinished_write: Option<UnfinishedWrite>,
}

/// A `CREATE` or `WRITE_BEGIN` whose `WRITE` is not in the ledger.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct UnfinishedWrite {
    /// Its line.
    pub line: u64,
    /// Its entry id.
    pub entry_id: String,
    /// The agent name.
    pub agent: String,
    /// The identity key.
    pub identity: String,
    /// The intent it worked under.
    pub intent: Option<String>,
    /// The content hash before the handle's first change (`None`: unknown; a created
    /// file's is the empty file's).
    #[serde(skip)]
    pub before: Option<String>,
}

/// The last `CREATE`/`WRITE_BEGIN` of each path whose handle has no `WRITE` after it
/// (matched by `detail.handle`).
fn unfinished_writes(entries: &[(u64, Entry)]) -> HashMap<PathBuf, UnfinishedWrite> {
    let handle = |e: &Entry| {
        e.detail
            .as_ref()
            .and_then(|d| d.get("handle"))
            .and_then(|h| h.as_str())
            .map(str::to_owned)
    };
    let mut open: HashMap<String, (PathBuf, UnfinishedWrite)> = HashMap::new();
    for (line, e) in entries {
        // A clean unmount closed every handle: one that wrote has its WRITE before it.
        if e.mutation_type == MutationType::Unmount {
            open.clear();
            continue;
        }
        // A file deleted after its handle began writing: nothing of it is left to explain;
        // renamed, its begin goes with it.
        if !outcome_failed(&e.outcome) {
            if let Some(p) = e.path_buf() {
                match e.mutation_type {
                    MutationType::Delete | MutationType::Rmdir => {
                        open.retain(|_, (q, _)| !q.starts_with(&p));
                    }
                    MutationType::Rename => {
                        if let Some(from) = e.from_buf() {
                            for (q, _) in open.values_mut() {
                                if let Ok(rest) = q.strip_prefix(&from) {
                                    *q = if rest.as_os_str().is_empty() {
                                        p.clone()
                                    } else {
                                        p.join(rest)
                                    };
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let Some(t) = handle(e) else { continue };
        match e.mutation_type {
            MutationType::Create | MutationType::WriteBegin => {
                let Some(path) = e.path_buf() else { continue };
                let agent = e.agent.clone();
                open.insert(
                    t,
                    (
                        path,
                        UnfinishedWrite {
                            line: *line,
                            entry_id: e.id.clone(),
                            agent: agent.as_ref().map(|a| a.name.clone()).unwrap_or_default(),
                            identity: agent.map(|a| a.identity).unwrap_or_default(),
                            intent: e.intent_id.clone(),
                            before: if e.mutation_type == MutationType::Create {
                                e.content_hash.clone()
                            } else {
                                e.prev_content_hash.clone()
                            },
                        },
                    ),
                );
            }
            MutationType::Write => {
                open.remove(&t);
            }
            _ => {}
        }
    }
    let mut by_path: HashMap<PathBuf, UnfinishedWrite> = HashMap::new();
    for (path, u) in open.into_values() {
        if by_path.get(&path).is_none_or(|o| o.line < u.line) {
            by_path.insert(path, u);
        }
    }
    by_path
}

/// Outcomes that mean the mutation did not happen.
pub fn outcome_failed(outcome: &str) -> bool {
    super::Outcome::parse(outcome).is_some_and(super::Outcome::failed)
}

/// Moves every key equal to `from` or under `from/` to the same place under `to`.
pub(crate) fn rekey<V>(map: &mut HashMap<PathBuf, V>, from: &Path, to: &Path) {
    let moved: Vec<PathBuf> = map
        .keys()
        .filter(|k| k.starts_with(from))
        .cloned()
        .collect();
    for k in moved {
        if let Some(v) = map.remove(&k) {
            let rest = k.strip_prefix(from).unwrap_or(Path::new(""));
            let nk = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            map.insert(nk, v);
        }
    }
}

/// Removes every key equal to `p` or under `p/`.
pub(crate) fn remove_tree<V>(map: &mut HashMap<PathBuf, V>, p: &Path) {
    map.retain(|k, _| !k.starts_with(p));
}

/// The last recorded content hash of every path still present according to the
/// ledger: (hash, line, entry id). Renames (of files and directories) carry the hash
/// to the new name; deletions drop it; a content mutation without a hash makes the
/// path unknown. `.git/` internals are not tracked.
pub fn last_hashes(entries: &[(u64, Entry)]) -> HashMap<PathBuf, (String, u64, String)> {
    let mut state: HashMap<PathBuf, (String, u64, String)> = HashMap::new();
    for (line, e) in entries {
        // Build output is summarized: what was recorded file by file below it is no longer
        // followed.
        if e.mutation_type == MutationType::Output && !outcome_failed(&e.outcome) {
            if let Some(p) = e.path_buf() {
                remove_tree(&mut state, &p);
            }
            continue;
        }
        // A lesson is the daemon's own append to the lessons file, an acknowledgement the
        // operator's record of a file as it is: their hash is that file's.
        let takes_hash = matches!(e.mutation_type, MutationType::Lesson | MutationType::Ack);
        if (e.mutation_type.is_governance() && !takes_hash) || outcome_failed(&e.outcome) {
            continue;
        }
        if e.mutation_type == MutationType::Ack && e.content_hash.is_none() {
            // An acknowledged deletion.
            if let Some(p) = e.path_buf() {
                remove_tree(&mut state, &p);
            }
            continue;
        }
        // A write to a file that lost its name before the handle closed (renamed over or
        // deleted while open): on record, but the content is not at that path.
        // Likewise a write whose file someone else changed before it closed ("superseded").
        let flagged = |k: &str| {
            e.detail
                .as_ref()
                .and_then(|d| d.get(k))
                .and_then(|v| v.as_bool())
                .unwrap_or(false)
        };
        if flagged("detached") || flagged("superseded") {
            continue;
        }
        let Some(path) = e.path_buf() else { continue };
        match e.mutation_type {
            MutationType::Delete | MutationType::Rmdir => remove_tree(&mut state, &path),
            MutationType::Rename => {
                if let Some(from) = e.from_buf() {
                    remove_tree(&mut state, &path);
                    rekey(&mut state, &from, &path);
                }
            }
            _ => {}
        }
        match (&e.content_hash, e.mutation_type) {
            (
                _,
                MutationType::Symlink
                | MutationType::Mkdir
                | MutationType::Rmdir
                | MutationType::Delete,
            ) => {}
            (Some(h), _) => {
                // The file's other names (hard links) hold the same content.
                for alias in aliases_of(e) {
                    state.insert(alias, (h.clone(), *line, e.id.clone()));
                }
                state.insert(path, (h.clone(), *line, e.id.clone()));
            }
            (
                None,
                MutationType::Write
                | MutationType::Truncate
                | MutationType::Mknod
                | MutationType::Create,
            ) => {
                state.remove(&path);
            }
            (None, _) => {}
        }
    }
    state.retain(|p, _| !crate::policy::git::in_git_dir(p));
    state
}

/// The other names of the file an entry records (`detail.aliases`: hard links).
pub fn aliases_of(e: &Entry) -> Vec<PathBuf> {
    e.detail
        .as_ref()
        .and_then(|d| d.get("aliases"))
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Every file whose last recorded hash no longer matches the disk, sorted by path.
pub fn verify_drift(ledger_path: &Path, workspace: &Path) -> io::Result<Vec<Drift>> {
    let entries = read_entries(ledger_path)?;
    let mut unfinished = unfinished_writes(&entries);
    let mut out = Vec::new();
    for (path, (recorded, line, entry_id)) in last_hashes(&entries) {
        // The daemon only records workspace-relative paths of plain components. A tampered
        // entry (`/dev/zero`, `../../etc/shadow`) must not make verify read outside the
        // workspace, or hash a device forever: report it instead of following it.
        if !contained(&path) {
            out.push(Drift {
                path: path.to_string_lossy().into_owned(),
                path_buf: path,
                line,
                entry_id,
                kind: DriftKind::Modified {
                    recorded,
                    actual: "not a workspace-relative path (ledger entry tampered with)".into(),
                },
                unfinished_write: None,
            });
            continue;
        }
        let full = workspace.join(&path);
        let kind = match std::fs::symlink_metadata(&full) {
            // ENOTDIR: a parent directory was replaced by a file outside the mount.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                Some(DriftKind::Missing { recorded })
            }
            Err(e) => return Err(e),
            Ok(m) if !m.is_file() => Some(DriftKind::Modified {
                recorded,
                actual: "not a regular file".into(),
            }),
            Ok(_) => {
                let (actual, _) = sha256_file(&full)?;
                (actual != recorded).then_some(DriftKind::Modified { recorded, actual })
            }
        };
        if let Some(kind) = kind {
            let unfinished_write = unfinished.get(&path).filter(|u| u.line >= line).cloned();
            if unfinished_write.is_some() {
                unfinished.remove(&path);
            }
            out.push(Drift {
                path: path.to_string_lossy().into_owned(),
                path_buf: path,
                line,
                entry_id,
                kind,
                unfinished_write,
            });
        }
    }
    // A write that began on a file with no hash on record (never written through the mount
    // before): a finding when the file no longer holds what it held before that write.
    for (path, u) in unfinished {
        if out.iter().any(|d| d.path_buf == path) || !contained(&path) {
            continue;
        }
        let full = workspace.join(&path);
        let actual = match std::fs::symlink_metadata(&full) {
            Ok(m) if m.is_file() => sha256_file(&full)?.0,
            Ok(_) => "not a regular file".into(),
            Err(_) => "missing".into(),
        };
        if u.before.as_deref() == Some(actual.as_str()) {
            continue;
        }
        if actual == "missing" {
            // Gone: removed outside the mount (a crashed handle leaves its file behind).
            out.push(Drift {
                path: path.to_string_lossy().into_owned(),
                path_buf: path,
                line: u.line,
                entry_id: u.entry_id.clone(),
                kind: DriftKind::Missing {
                    recorded: u.before.clone().unwrap_or_else(|| "(unknown)".into()),
                },
                unfinished_write: None,
            });
            continue;
        }
        out.push(Drift {
            path: path.to_string_lossy().into_owned(),
            path_buf: path,
            line: u.line,
            entry_id: u.entry_id.clone(),
            kind: DriftKind::Modified {
                recorded: u.before.clone().unwrap_or_else(|| "(unknown)".into()),
                actual,
            },
            unfinished_write: Some(u),
        });
    }
    out.sort_by(|a, b| a.path_buf.cmp(&b.path_buf));
    Ok(out)
}

/// A workspace-relative path of plain components (what the daemon records).
fn contained(path: &Path) -> bool {
    path.components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
        && !path.as_os_str().is_empty()
}

/// Which entries a query returns; every set field must match.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Exact intent id.
    pub intent: Option<String>,
    /// Agent name or identity, exact.
    pub agent: Option<String>,
    /// Glob over `path` (or `from`).
    pub path: Option<globset::GlobMatcher>,
    /// At or after.
    pub since: Option<DateTime<Utc>>,
    /// At or before.
    pub until: Option<DateTime<Utc>>,
    /// Mutation type.
    pub mutation_type: Option<MutationType>,
}

impl Filter {
    /// Whether an entry passes the filter.
    pub fn matches(&self, e: &Entry) -> bool {
        if let Some(i) = &self.intent {
            if e.intent_id.as_deref() != Some(i.as_str()) {
                return false;
            }
        }
        if let Some(a) = &self.agent {
            match &e.agent {
                Some(ag) if &ag.name == a || &ag.identity == a => {}
                _ => return false,
            }
        }
        if let Some(t) = self.mutation_type {
            if e.mutation_type != t {
                return false;
            }
        }
        if let Some(g) = &self.path {
            let hit = |p: Option<PathBuf>| p.is_some_and(|p| g.is_match(&p));
            if !hit(e.path_buf())
                && !hit(e.from_buf())
                && !aliases_of(e).into_iter().any(|a| g.is_match(&a))
            {
                return false;
            }
        }
        if self.since.is_some() || self.until.is_some() {
            let Ok(t) = DateTime::parse_from_rfc3339(&e.timestamp) else {
                return false;
            };
            let t = t.with_timezone(&Utc);
            if self.since.is_some_and(|s| t < s) || self.until.is_some_and(|u| t > u) {
                return false;
            }
        }
        true
    }
}

/// The entries of a ledger that pass `filter`, in ledger order.
pub fn query(ledger_path: &Path, filter: &Filter) -> io::Result<Vec<Entry>> {
    Ok(read_entries(ledger_path)?
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| filter.matches(e))
        .collect())
}
