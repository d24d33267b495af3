//! `.orchestration/intent_map.md`: intent -> the files it changed, and the functions
//! or top-level items it touched where the language is recognisable (Rust, Python,
//! JavaScript/TypeScript, Go), for people and for the next agent.
//!
//! [`IntentMapWriter`] reads the ledger incrementally (only the bytes appended since
//! its last look) and debounces writes, so the daemon can call it after every batch,
//! or let [`IntentMapWriter::spawn`] poll in the background. Items are found by
//! simple line patterns at the recorded changed ranges, read from the file when the
//! entry is ingested (closest to the version the entry describes).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::entry::{Entry, MutationType};
use super::reader::{outcome_failed, parse_line, Lines};

/// Files larger than this are not scanned for items.
const MAX_SCAN_BYTES: u64 = 1024 * 1024;
/// At most this many items are listed per file.
const MAX_ITEMS: usize = 12;

/// Rows of files that are gone (deleted or renamed away) kept per intent; older ones are
/// dropped from the map (they stay in the ledger), so the map and the daemon's memory
/// follow the live tree plus recent history, not every temp file ever made.
const MAX_GONE_ROWS: usize = 1000;

#[derive(Default)]
struct FileStats {
    /// The path no longer exists (deleted, or renamed to another name).
    gone: bool,
    changes: u64,
    writes: u64,
    last_time: String,
    last_type: &'static str,
    last_agent: String,
    items: BTreeSet<String>,
}

#[derive(Default)]
struct MapState {
    /// Bytes of the ledger already ingested (always at a line boundary).
    offset: u64,
    entries: u64,
    /// intent ("(no intent)" when none) -> path -> stats.
    intents: BTreeMap<String, BTreeMap<String, FileStats>>,
    /// Per intent, gone paths in the order they went (may hold stale names).
    gone: BTreeMap<String, std::collections::VecDeque<String>>,
    /// Per intent, rows of gone files dropped from the map.
    pruned: BTreeMap<String, u64>,
    /// Whether something was ingested since the last write.
    dirty: bool,
    last_write: Option<Instant>,
    /// What the last write took (rendering and writing the whole map): the next one waits
    /// [`COST_FACTOR`] times as long at least.
    last_cost: Duration,
}

/// A map write waits at least this many times what the last one took, so that keeping the
/// map takes at most about 1/20 of a CPU however large it grows (a `tar x` of 12,000 files
/// made a 3.6 MB map, rewritten every second: 12% of the daemon's CPU). The map is
/// complete again at the unmount and at `write_now`.
const COST_FACTOR: u32 = 20;

/// Keeps `intent_map.md` up to date with a ledger.
pub struct IntentMapWriter {
    ledger_path: PathBuf,
    workspace: Option<PathBuf>,
    out: PathBuf,
    min_interval: Duration,
    state: Mutex<MapState>,
}

impl IntentMapWriter {
    /// A writer of `out` from `ledger_path`; `workspace` (for item names) may be None.
    /// Writes at most once per second unless [`IntentMapWriter::write_now`].
    pub fn new(ledger_path: &Path, workspace: Option<&Path>, out: &Path) -> IntentMapWriter {
        IntentMapWriter {
            ledger_path: ledger_path.to_path_buf(),
            workspace: workspace.map(Path::to_path_buf),
            out: out.to_path_buf(),
            min_interval: Duration::from_secs(1),
            state: Mutex::new(MapState::default()),
        }
    }

    /// Ingests new ledger lines and rewrites the map if anything changed and the
    /// last write is at least a second old. Returns whether it wrote. Cheap to call
    /// often.
    pub fn update(&self) -> io::Result<bool> {
        let mut st = self.state.lock();
        self.ingest(&mut st)?;
        let wait = self.min_interval.max(st.last_cost * COST_FACTOR);
        let due = st.last_write.is_none_or(|t| t.elapsed() >= wait);
        if st.dirty && due {
            self.write(&mut st)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Ingests and writes now, whatever the debounce says.
    pub fn write_now(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        self.ingest(&mut st)?;
        self.write(&mut st)
    }

    /// Runs [`IntentMapWriter::update`] every `every` on a thread; the returned guard
    /// stops it (with a final write) when dropped.
    pub fn spawn(self, every: Duration) -> io::Result<IntentMapThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("intentfs-intent-map".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    if let Err(e) = self.update() {
                        tracing::warn!(out = %self.out.display(), "intent map: {e}");
                    }
                    // Sleeps `every`, or wakes at once when the guard is dropped.
                    let _ = rx.recv_timeout(every);
                }
                if let Err(e) = self.write_now() {
                    tracing::warn!(out = %self.out.display(), "intent map: {e}");
                }
            })?;
        Ok(IntentMapThread {
            stop,
            wake: Some(tx),
            handle: Some(handle),
        })
    }

    fn ingest(&self, st: &mut MapState) -> io::Result<()> {
        let mut f = match File::open(&self.ledger_path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let len = f.metadata()?.len();
        if len < st.offset {
            // Truncated (torn-tail repair): start over.
            *st = MapState {
                last_write: st.last_write,
                dirty: true,
                ..MapState::default()
            };
        }
        if len == st.offset {
            return Ok(());
        }
        f.seek(SeekFrom::Start(st.offset))?;
        let base = st.offset;
        for line in Lines::new(BufReader::new(f)) {
            let line = line?;
            if !line.terminated {
                break; // being written; read it next time
            }
            st.offset = base + line.offset + line.bytes.len() as u64;
            st.entries += 1;
            st.dirty = true;
            if let Ok(e) = parse_line(line.content()) {
                self.add(st, &e);
            }
        }
        Ok(())
    }

    fn add(&self, st: &mut MapState, e: &Entry) {
        if e.mutation_type.is_governance() || outcome_failed(&e.outcome) {
            return;
        }
        let Some(path) = e.path.clone() else { return };
        if path.starts_with(".git/") {
            return;
        }
        let intent = e
            .intent_id
            .clone()
            .unwrap_or_else(|| "(no intent)".to_owned());
        let stats = st
            .intents
            .entry(intent)
            .or_default()
            .entry(path.clone())
            .or_default();
        stats.changes += 1;
        if e.mutation_type == MutationType::Write {
            stats.writes += 1;
        }
        stats.gone = false;
        stats.last_time = e.timestamp.clone();
        stats.last_type = e.mutation_type.as_str();
        stats.last_agent = e.agent.as_ref().map(|a| a.name.clone()).unwrap_or_default();
        if let (Some(ws), Some(ranges), Some(p)) = (&self.workspace, &e.ranges, e.path_buf()) {
            if stats.items.len() < MAX_ITEMS {
                let spans: Vec<(u32, u32)> =
                    ranges.iter().map(|r| (r.start_line, r.end_line)).collect();
                // Enough to fill the dozen even if every item already there comes again.
                let limit = MAX_ITEMS + stats.items.len();
                for item in items_touched(&ws.join(p), &spans, limit) {
                    if stats.items.len() >= MAX_ITEMS {
                        break;
                    }
                    stats.items.insert(item);
                }
            }
        }
        // A path that went away: its rows (under every intent) become history.
        let exchange = e
            .detail
            .as_ref()
            .and_then(|d| d.get("exchange"))
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let went = match e.mutation_type {
            MutationType::Delete | MutationType::Rmdir => Some(path),
            MutationType::Rename if !exchange => e.from.clone().filter(|f| *f != path),
            _ => None,
        };
        if let Some(went) = went {
            Self::mark_gone(st, &went);
        }
    }

    fn mark_gone(st: &mut MapState, path: &str) {
        for (intent, files) in st.intents.iter_mut() {
            let Some(f) = files.get_mut(path) else {
                continue;
            };
            f.gone = true;
            let q = st.gone.entry(intent.clone()).or_default();
            q.push_back(path.to_owned());
            while q.len() > MAX_GONE_ROWS {
                let Some(old) = q.pop_front() else { break };
                if files.get(&old).is_some_and(|f| f.gone) {
                    files.remove(&old);
                    *st.pruned.entry(intent.clone()).or_default() += 1;
                }
            }
        }
    }

    fn write(&self, st: &mut MapState) -> io::Result<()> {
        let start = Instant::now();
        let text = render(st, &self.ledger_path);
        write_atomic(&self.out, text.as_bytes())?;
        st.dirty = false;
        let now = Instant::now();
        st.last_write = Some(now);
        st.last_cost = now - start;
        Ok(())
    }
}

/// Stops the background intent-map thread on drop.
pub struct IntentMapThread {
    stop: Arc<AtomicBool>,
    wake: Option<crossbeam_channel::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for IntentMapThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the sender wakes the sleeping thread.
        drop(self.wake.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Regenerates the intent map once from the whole ledger.
pub fn write_intent_map(
    ledger_path: &Path,
    workspace: Option<&Path>,
    out: &Path,
) -> io::Result<()> {
    IntentMapWriter::new(ledger_path, workspace, out).write_now()
}

/// Appends `s` as a table cell: `|` escaped, newlines as spaces, control characters shown
/// escaped (a crafted name must not reach a terminal that shows the map, nor break its
/// table), and inside a code span (`code`) backticks as `'`.
fn push_cell(out: &mut String, s: &str, code: bool) {
    let plain = |c: char| !(c == '|' || c.is_control() || (code && c == '`'));
    if s.chars().all(plain) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '\n' => out.push(' '),
            '`' if code => out.push('\''),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
}

fn render(st: &MapState, ledger_path: &Path) -> String {
    use std::fmt::Write as _;
    let rows: usize = st.intents.values().map(BTreeMap::len).sum();
    let mut s = String::with_capacity(256 + rows * 160);
    s.push_str("# Intent map\n\nRegenerated by intentfs from `");
    push_cell(&mut s, &ledger_path.display().to_string(), false);
    let _ = writeln!(
        s,
        "` ({} entries). Do not edit: it is rewritten as the ledger grows.",
        st.entries
    );
    if st.intents.is_empty() {
        s.push_str("\nNo changes recorded yet.\n");
    }
    for (intent, files) in &st.intents {
        s.push_str("\n## ");
        push_cell(&mut s, intent, false);
        s.push_str("\n\n| file | changes | writes | last change | last agent | items touched |\n");
        s.push_str("|---|---:|---:|---|---|---|\n");
        for (path, f) in files {
            s.push_str("| `");
            push_cell(&mut s, path, true);
            let _ = write!(
                s,
                "` | {} | {} | {} {} | ",
                f.changes, f.writes, f.last_time, f.last_type
            );
            push_cell(&mut s, &f.last_agent, false);
            s.push_str(" | ");
            for (i, item) in f.items.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                s.push('`');
                push_cell(&mut s, item, true);
                s.push('`');
            }
            s.push_str(" |\n");
        }
        if let Some(n) = st.pruned.get(intent).filter(|n| **n > 0) {
            let _ = writeln!(
                s,
                "\n{n} older rows of files that are gone (deleted or renamed away) are not listed; the ledger has them."
            );
        }
    }
    s
}

/// Writes via a temporary file in the same directory and a rename, so readers never
/// see a half-written map.
fn write_atomic(out: &Path, data: &[u8]) -> io::Result<()> {
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let res = (|| {
        let mut f = File::create(&tmp)?;
        // No fdatasync: the map is derived from the ledger and rebuilt from it whenever
        // the daemon starts, and this ran once a second for a file of megabytes.
        f.write_all(data)?;
        std::fs::rename(&tmp, out)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lang {
    Rust,
    Python,
    Js,
    Go,
}

fn lang_of(path: &Path) -> Option<Lang> {
    match path.extension()?.to_str()? {
        "rs" => Some(Lang::Rust),
        "py" | "pyi" => Some(Lang::Python),
        "js" | "jsx" | "mjs" | "cjs" | "ts" | "tsx" | "mts" | "cts" => Some(Lang::Js),
        "go" => Some(Lang::Go),
        _ => None,
    }
}

fn ident(s: &str) -> Option<&str> {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
        .unwrap_or(s.len());
    (end > 0).then(|| &s[..end])
}

/// Strips any of `prefixes` (each followed by whitespace) from the start, repeatedly.
fn strip_words<'a>(mut s: &'a str, prefixes: &[&str]) -> &'a str {
    'outer: loop {
        for p in prefixes {
            if let Some(rest) = s.strip_prefix(p) {
                if rest.starts_with(char::is_whitespace) || p.ends_with(')') {
                    s = rest.trim_start();
                    continue 'outer;
                }
            }
        }
        return s;
    }
}

/// The words a declaration can begin with, by language: qualifiers [`item_of`] skips, then
/// the keywords that name an item.
const RUST_QUALIFIERS: &[&str] = &[
    "pub(crate)",
    "pub(super)",
    "pub(self)",
    "pub",
    "async",
    "unsafe",
    "const",
    "extern \"C\"",
    "extern",
    "default",
];
const RUST_KEYWORDS: &[&str] = &["fn", "struct", "enum", "trait", "mod", "union"];
const RUST_MACRO: &str = "macro_rules!";
const RUST_IMPL: &str = "impl";
const PYTHON_QUALIFIERS: &[&str] = &["async"];
const PYTHON_KEYWORDS: &[&str] = &["def", "class"];
const JS_QUALIFIERS: &[&str] = &["export", "default", "async", "declare", "abstract"];
const JS_KEYWORDS: &[&str] = &["function*", "function", "class", "interface", "enum"];
/// `const name = (...) =>`: a binding that is a function.
const JS_BINDINGS: &[&str] = &["const", "let", "var"];
const GO_FUNC: &str = "func";
const GO_TYPE: &str = "type";

/// Whether a line can declare an item at all: its first non-blank byte is one of `firsts`,
/// its language's [`first_bytes`]. Most lines of a file (bodies, comments, closing braces)
/// are passed over without being decoded and matched word by word.
fn may_declare(line: &[u8], firsts: &[u8]) -> bool {
    let Some(&b) = line.iter().find(|b| !b.is_ascii_whitespace()) else {
        return false;
    };
    // (Past other Unicode blanks, `item_of`'s trim decides.)
    !b.is_ascii() || firsts.contains(&b)
}

/// The first byte of each word a declaration of `lang` can begin with (the lists above),
/// for [`may_declare`].
fn first_bytes(lang: Lang) -> Vec<u8> {
    let lists: &[&[&str]] = match lang {
        Lang::Rust => &[RUST_QUALIFIERS, RUST_KEYWORDS, &[RUST_MACRO, RUST_IMPL]],
        Lang::Python => &[PYTHON_QUALIFIERS, PYTHON_KEYWORDS],
        Lang::Js => &[JS_QUALIFIERS, JS_KEYWORDS, JS_BINDINGS],
        Lang::Go => &[&[GO_FUNC, GO_TYPE]],
    };
    let mut firsts: Vec<u8> = lists
        .iter()
        .flat_map(|l| l.iter().map(|w| w.as_bytes()[0]))
        .collect();
    firsts.sort_unstable();
    firsts.dedup();
    firsts
}

/// The item a line declares (`fn parse`, `class Foo`, ...), if any.
fn item_of(line: &str, lang: Lang) -> Option<String> {
    let t = line.trim_start();
    match lang {
        Lang::Rust => {
            let t = strip_words(t, RUST_QUALIFIERS);
            for kw in RUST_KEYWORDS {
                if let Some(rest) = t
                    .strip_prefix(kw)
                    .filter(|r| r.starts_with(char::is_whitespace))
                {
                    return ident(rest.trim_start()).map(|n| format!("{kw} {n}"));
                }
            }
            if let Some(rest) = t.strip_prefix(RUST_MACRO) {
                return ident(rest.trim_start()).map(|n| format!("{RUST_MACRO} {n}"));
            }
            if t.strip_prefix(RUST_IMPL)
                .is_some_and(|r| r.starts_with(|c: char| c.is_whitespace() || c == '<'))
            {
                let head = t.split('{').next().unwrap_or(t).trim();
                let head = head.strip_suffix("where").unwrap_or(head).trim();
                return Some(head.chars().take(60).collect());
            }
            None
        }
        Lang::Python => {
            let t = strip_words(t, PYTHON_QUALIFIERS);
            for kw in PYTHON_KEYWORDS {
                if let Some(rest) = t
                    .strip_prefix(kw)
                    .filter(|r| r.starts_with(char::is_whitespace))
                {
                    return ident(rest.trim_start()).map(|n| format!("{kw} {n}"));
                }
            }
            None
        }
        Lang::Js => {
            let t = strip_words(t, JS_QUALIFIERS);
            for kw in JS_KEYWORDS {
                if let Some(rest) = t
                    .strip_prefix(kw)
                    .filter(|r| r.starts_with(char::is_whitespace))
                {
                    let kw = kw.trim_end_matches('*');
                    return ident(rest.trim_start()).map(|n| format!("{kw} {n}"));
                }
            }
            // `const name = (...) =>` / `= function`: top-level arrow functions.
            let t2 = strip_words(t, JS_BINDINGS);
            if t2.len() < t.len() && (line.contains("=>") || line.contains("function")) {
                return ident(t2).map(|n| format!("function {n}"));
            }
            None
        }
        Lang::Go => {
            if let Some(rest) = t
                .strip_prefix(GO_FUNC)
                .filter(|r| r.starts_with([' ', '(']))
            {
                let rest = rest.trim_start();
                // Method: skip the receiver.
                let rest = if rest.starts_with('(') {
                    rest.find(')')
                        .map(|i| rest[i + 1..].trim_start())
                        .unwrap_or(rest)
                } else {
                    rest
                };
                return ident(rest).map(|n| format!("func {n}"));
            }
            if let Some(rest) = t.strip_prefix(GO_TYPE).filter(|r| r.starts_with(' ')) {
                return ident(rest.trim_start()).map(|n| format!("{GO_TYPE} {n}"));
            }
            None
        }
    }
}

/// Items touched by changes at `ranges` (1-based inclusive) of the file at `path`: the
/// item enclosing each range's start and every item declared inside a range, the first
/// `limit` of them. The file is read in one go (at most [`MAX_SCAN_BYTES`]) and its lines
/// are looked at only as far as needed, without copying them (a new file's range is all
/// of it, and the map keeps a dozen items a file, so a build unpacking thousands of files
/// is not scanned to their ends: this ran for every file `tar x` wrote, and reading it
/// line by line into owned strings was most of the intent map's CPU).
pub fn items_touched(path: &Path, ranges: &[(u32, u32)], limit: usize) -> Vec<String> {
    use std::io::Read;
    let Some(lang) = lang_of(path) else {
        return Vec::new();
    };
    let Ok(f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = match f.metadata() {
        Ok(m) if m.is_file() && m.len() <= MAX_SCAN_BYTES => m.len(),
        _ => return Vec::new(),
    };
    let mut text = Vec::with_capacity(len as usize + 1);
    if f.take(MAX_SCAN_BYTES).read_to_end(&mut text).is_err() {
        return Vec::new();
    }
    items_in(&text, lang, ranges, limit)
}

/// A file's lines, split on demand and remembered as byte ranges (ranges may come in any
/// order; a new file's range is all of it, and a dozen items are found near its top).
struct LineCursor<'a> {
    text: &'a [u8],
    /// Where the next line starts.
    pos: usize,
    lines: Vec<(usize, usize)>,
}

impl<'a> LineCursor<'a> {
    fn new(text: &'a [u8]) -> LineCursor<'a> {
        LineCursor {
            text,
            pos: 0,
            lines: Vec::new(),
        }
    }

    /// Whether line `i` (0-based) exists, splitting up to it. A trailing newline ends the
    /// last line; it starts none.
    fn have(&mut self, i: usize) -> bool {
        while self.lines.len() <= i && self.pos < self.text.len() {
            let rest = &self.text[self.pos..];
            let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
            self.lines.push((self.pos, self.pos + end));
            self.pos += end + 1;
        }
        i < self.lines.len()
    }

    /// Line `i`, without its `\r\n` or `\n` (after [`LineCursor::have`] said it exists).
    fn get(&self, i: usize) -> &'a [u8] {
        let (s, e) = self.lines[i];
        let l = &self.text[s..e];
        l.strip_suffix(b"\r").unwrap_or(l)
    }
}

/// [`items_touched`] over a file's bytes.
fn items_in(text: &[u8], lang: Lang, ranges: &[(u32, u32)], limit: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let push = |out: &mut Vec<String>, s: String| {
        if !out.contains(&s) {
            out.push(s);
        }
    };
    let mut lines = LineCursor::new(text);
    let firsts = first_bytes(lang);
    let item = |l: &[u8]| {
        may_declare(l, &firsts)
            .then(|| item_of(&String::from_utf8_lossy(l), lang))
            .flatten()
    };
    for &(s, e) in ranges {
        if out.len() >= limit {
            break;
        }
        // The enclosing item: the last one declared on lines 1..=s (1-based).
        let s = s.max(1) as usize;
        let mut enclosing = None;
        for i in 0..s {
            if !lines.have(i) {
                break;
            }
            if let Some(it) = item(lines.get(i)) {
                enclosing = Some(it);
            }
        }
        if let Some(it) = enclosing {
            push(&mut out, it);
        }
        // Items declared on lines s+1..=e.
        for i in s..(e as usize) {
            if out.len() >= limit {
                break;
            }
            if !lines.have(i) {
                break;
            }
            if let Some(it) = item(lines.get(i)) {
                push(&mut out, it);
            }
        }
    }
    out.truncate(limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_letter_filter_never_hides_an_item() {
        // Every line of this crate's sources, and lines in each language: wherever
        // `item_of` finds an item, `may_declare` lets the line through.
        let mut lines: Vec<String> = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    lines.extend(
                        std::fs::read_to_string(p)
                            .unwrap()
                            .lines()
                            .map(str::to_owned),
                    );
                }
            }
        }
        let others = [
            "async def f(x):",
            "  class C(B):",
            "def g():",
            "export default async function* gen() {",
            "declare abstract class K {}",
            "interface I { x: number }",
            "enum E { A }",
            "let h = (x) => x;",
            "var k = function () {};",
            "const m = async () => 1;",
            "func (r *R) Do() error {",
            "type T struct {",
            "\u{a0}fn odd() {}",
            "pub(crate) unsafe extern \"C\" fn ffi() {}",
            "macro_rules! m {",
            "impl<T> Trait for X<T> {",
            "union U { a: u8 }",
        ];
        lines.extend(others.iter().map(|s| s.to_string()));
        let langs = [Lang::Rust, Lang::Python, Lang::Js, Lang::Go];
        let mut found = 0;
        for l in &lines {
            for lang in langs {
                if item_of(l, lang).is_some() {
                    found += 1;
                    let firsts = first_bytes(lang);
                    assert!(
                        may_declare(l.as_bytes(), &firsts),
                        "{lang:?} would miss {l:?}"
                    );
                }
            }
        }
        assert!(found > 500, "only {found} items seen");
        // And it does pass over lines that declare nothing.
        for l in [
            "    return x;",
            "}",
            "// fn commented()",
            "    x += 1;",
            "#[derive(Debug)]",
        ] {
            assert!(
                !may_declare(l.as_bytes(), &first_bytes(Lang::Rust)),
                "{l:?}"
            );
        }
    }

    #[test]
    fn items_by_language() {
        let rs = |l| item_of(l, Lang::Rust);
        assert_eq!(
            rs("pub(crate) async fn parse_line(x: u8) {"),
            Some("fn parse_line".into())
        );
        assert_eq!(rs("    pub unsafe fn raw() {"), Some("fn raw".into()));
        assert_eq!(
            rs("impl<T: Clone> Writer for Ledger<T> {"),
            Some("impl<T: Clone> Writer for Ledger<T>".into())
        );
        assert_eq!(rs("pub struct Entry {"), Some("struct Entry".into()));
        assert_eq!(rs("let fn_x = 3;"), None);
        assert_eq!(rs("// fn commented"), None);
        assert_eq!(
            item_of("async def fetch(url):", Lang::Python),
            Some("def fetch".into())
        );
        assert_eq!(
            item_of("class Foo(Base):", Lang::Python),
            Some("class Foo".into())
        );
        assert_eq!(
            item_of("export default async function main() {", Lang::Js),
            Some("function main".into())
        );
        assert_eq!(
            item_of("export const add = (a, b) => a + b;", Lang::Js),
            Some("function add".into())
        );
        assert_eq!(item_of("const x = 3;", Lang::Js), None);
        assert_eq!(
            item_of(
                "func (s *Server) Run(ctx context.Context) error {",
                Lang::Go
            ),
            Some("func Run".into())
        );
        assert_eq!(
            item_of("type Config struct {", Lang::Go),
            Some("type Config".into())
        );
    }

    #[test]
    fn items_touched_finds_enclosing_and_declared() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.py");
        std::fs::write(
            &p,
            "import os\n\ndef a():\n    return 1\n\ndef b():\n    return 2\n\nclass C:\n    pass\n",
        )
        .unwrap();
        assert_eq!(
            items_touched(&p, &[(4, 4)], usize::MAX),
            vec!["def a".to_string()]
        );
        assert_eq!(
            items_touched(&p, &[(7, 10)], usize::MAX),
            vec!["def b".to_string(), "class C".to_string()]
        );
        assert!(items_touched(&p, &[(1, 1)], usize::MAX).is_empty());
        assert!(items_touched(&dir.path().join("x.txt"), &[(1, 1)], usize::MAX).is_empty());
    }

    #[test]
    fn items_up_to_a_limit_are_the_first_ones_in_the_same_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.rs");
        let text: String = (0..200).map(|i| format!("fn f{i}() {{}}\r\n")).collect();
        std::fs::write(&p, text).unwrap();
        let all = items_touched(&p, &[(1, 200)], usize::MAX);
        assert_eq!(all.len(), 200);
        assert_eq!(all[199], "fn f199");
        assert_eq!(items_touched(&p, &[(1, 200)], 12), all[..12].to_vec());
        assert_eq!(items_touched(&p, &[(150, 160), (1, 3)], 5), {
            let mut v = items_touched(&p, &[(150, 160), (1, 3)], usize::MAX);
            v.truncate(5);
            v
        });
    }
}
