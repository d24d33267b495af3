//! The ledger's entry schema: what one line of `agent_trace.jsonl` holds, in the order
//! it is written, plus the lossless encoding of non-UTF-8 paths.
//!
//! This module owns the on-disk format only. It knows nothing of threads, files or
//! the filesystem above; the writer fills the fields a [`Draft`] leaves open.

use std::ffi::OsStr;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The `prev` of the first line of a ledger: 64 zeros.
pub const GENESIS_PREV: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Who acted.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Agent {
    /// The agent name (`--agent NAME` or the name given to `intentfs run`).
    pub name: String,
    /// The identity (session) the agent acts as.
    pub identity: String,
    /// The pid of the process that made the request.
    pub pid: u32,
    /// The uid of that process.
    pub uid: u32,
    /// The process name (`comm`).
    pub process: String,
}

/// What kind of mutation (or governance event) an entry records.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MutationType {
    Write,
    /// A regular file created (empty) through the mount; its content follows as WRITE.
    Create,
    Delete,
    Rename,
    Mkdir,
    Rmdir,
    Symlink,
    Link,
    Mknod,
    Chmod,
    Chown,
    Truncate,
    Utimes,
    Xattr,
    Denial,
    Approval,
    LedgerRepair,
    Mount,
    Unmount,
    /// An identity selected or switched its intent (`detail`: `from`, `to`).
    Intent,
    /// A lesson from a failed verification was appended to the lessons file.
    Lesson,
    /// A handle's first write is about to land (`detail.handle`; its WRITE completes it):
    /// content a crash leaves behind is attributed to it.
    WriteBegin,
    /// A git ref moved through the mount (`detail`: `ref`, `old`, `new` object ids).
    Ref,
    /// An identity was granted by the operator (`detail`: intents, tracking, uid).
    Identity,
    /// A burst of build output under an `output:` glob, summarized (`detail`: counts per
    /// mutation type, bytes, first and last time, examples).
    Output,
    /// The operator acknowledged a file as it is on disk now (a change made outside the
    /// mount, taken into the record): `content_hash` is the file's, or `detail.deleted`.
    Ack,
}

impl MutationType {
    /// Every variant, in declaration order (for parsing and help text).
    pub const ALL: [MutationType; 26] = [
        MutationType::Write,
        MutationType::Create,
        MutationType::Delete,
        MutationType::Rename,
        MutationType::Mkdir,
        MutationType::Rmdir,
        MutationType::Symlink,
        MutationType::Link,
        MutationType::Mknod,
        MutationType::Chmod,
        MutationType::Chown,
        MutationType::Truncate,
        MutationType::Utimes,
        MutationType::Xattr,
        MutationType::Denial,
        MutationType::Approval,
        MutationType::LedgerRepair,
        MutationType::Mount,
        MutationType::Unmount,
        MutationType::Intent,
        MutationType::Lesson,
        MutationType::WriteBegin,
        MutationType::Ref,
        MutationType::Identity,
        MutationType::Output,
        MutationType::Ack,
    ];

    /// The name as written in the ledger (`"WRITE"`, `"LEDGER_REPAIR"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            MutationType::Write => "WRITE",
            MutationType::Create => "CREATE",
            MutationType::Delete => "DELETE",
            MutationType::Rename => "RENAME",
            MutationType::Mkdir => "MKDIR",
            MutationType::Rmdir => "RMDIR",
            MutationType::Symlink => "SYMLINK",
            MutationType::Link => "LINK",
            MutationType::Mknod => "MKNOD",
            MutationType::Chmod => "CHMOD",
            MutationType::Chown => "CHOWN",
            MutationType::Truncate => "TRUNCATE",
            MutationType::Utimes => "UTIMES",
            MutationType::Xattr => "XATTR",
            MutationType::Denial => "DENIAL",
            MutationType::Approval => "APPROVAL",
            MutationType::LedgerRepair => "LEDGER_REPAIR",
            MutationType::Mount => "MOUNT",
            MutationType::Unmount => "UNMOUNT",
            MutationType::Intent => "INTENT",
            MutationType::Lesson => "LESSON",
            MutationType::WriteBegin => "WRITE_BEGIN",
            MutationType::Ref => "REF",
            MutationType::Identity => "IDENTITY",
            MutationType::Output => "OUTPUT",
            MutationType::Ack => "ACK",
        }
    }

    /// Parses a ledger name, case-insensitively, `-` accepted for `_`.
    pub fn parse(s: &str) -> Option<MutationType> {
        let norm = s.trim().to_ascii_uppercase().replace('-', "_");
        MutationType::ALL.into_iter().find(|t| t.as_str() == norm)
    }

    /// Whether this type puts content at `path` (and so gets a `mutation_class`):
    /// a write, a truncation, a creation of any kind, or the destination of a rename.
    /// Deletions, metadata changes and governance events get no class.
    pub fn is_classified(self) -> bool {
        matches!(
            self,
            MutationType::Write
                | MutationType::Truncate
                | MutationType::Rename
                | MutationType::Link
                | MutationType::Symlink
                | MutationType::Mknod
                | MutationType::Mkdir
        )
    }

    /// Governance events (not changes to the workspace).
    pub fn is_governance(self) -> bool {
        matches!(
            self,
            MutationType::Denial
                | MutationType::Approval
                | MutationType::LedgerRepair
                | MutationType::Mount
                | MutationType::Unmount
                | MutationType::Intent
                | MutationType::Lesson
                | MutationType::WriteBegin
                | MutationType::Ref
                | MutationType::Identity
                | MutationType::Output
                | MutationType::Ack
        )
    }
}

/// `INTENT_EVOLUTION` for an intent's first content mutation of a path, `AST_REFACTOR` after.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MutationClass {
    IntentEvolution,
    AstRefactor,
}

impl MutationClass {
    /// The name as written in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            MutationClass::IntentEvolution => "INTENT_EVOLUTION",
            MutationClass::AstRefactor => "AST_REFACTOR",
        }
    }
}

/// A changed line range of the new version of a file, 1-based, inclusive.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LineRange {
    /// First changed line.
    pub start_line: u32,
    /// Last changed line (inclusive).
    pub end_line: u32,
}

/// The version-control state of the workspace when the entry was written.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Vcs {
    /// Always `"git"` for now.
    #[serde(rename = "type")]
    pub kind: String,
    /// The commit `HEAD` resolves to (40 hex digits, 64 for SHA-256 repositories).
    pub revision: String,
}

/// How an entry's event ended. Written as its lower-case name (`"ok"`, `"denied"`...);
/// entries read back keep the string ([`Entry::outcome`]), so an outcome a later version
/// adds still reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Done.
    #[default]
    Ok,
    /// Refused (a `DENIAL`).
    Denied,
    /// The circuit breaker tripped (a `DENIAL` naming no operation).
    Tripped,
    /// A human (or `--approver allow`) approved.
    Approved,
    /// A human (or `--approver deny`) rejected.
    Rejected,
    /// Nobody answered in time.
    Timeout,
    /// The writer repaired a torn tail at open.
    Repaired,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Denied => "denied",
            Outcome::Tripped => "tripped",
            Outcome::Approved => "approved",
            Outcome::Rejected => "rejected",
            Outcome::Timeout => "timeout",
            Outcome::Repaired => "repaired",
        }
    }

    /// The outcome an entry names, if this version knows it.
    pub fn parse(s: &str) -> Option<Outcome> {
        [
            Outcome::Ok,
            Outcome::Denied,
            Outcome::Tripped,
            Outcome::Approved,
            Outcome::Rejected,
            Outcome::Timeout,
            Outcome::Repaired,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }

    /// Nothing changed on disk: a refusal, a rejected or unanswered request, a trip.
    pub fn failed(self) -> bool {
        matches!(
            self,
            Outcome::Denied | Outcome::Tripped | Outcome::Rejected | Outcome::Timeout
        )
    }
}

/// What the filesystem hands the ledger; the writer fills id, timestamp,
/// mutation_class, vcs and prev.
#[derive(Clone, Debug, Default)]
pub struct Draft {
    /// The intent the agent had selected (None: no intent yet, e.g. a denial).
    pub intent_id: Option<String>,
    /// Who acted.
    pub agent: Option<Agent>,
    /// Required: [`crate::ledger::Ledger::record`] refuses a draft without one.
    pub mutation_type: Option<MutationType>,
    /// Workspace-relative path; may be non-UTF-8.
    pub path: Option<PathBuf>,
    /// Source of a rename or link.
    pub from: Option<PathBuf>,
    /// `"sha256:<hex>"` of the bytes on disk after the mutation.
    pub content_hash: Option<String>,
    /// The hash before the mutation, when known.
    pub prev_content_hash: Option<String>,
    /// Size in bytes after the mutation.
    pub size: Option<u64>,
    /// A WRITE by the handle that created the file.
    pub created: bool,
    /// Changed line ranges of the new version, 1-based inclusive.
    pub ranges: Option<Vec<(u32, u32)>>,
    /// How it ended.
    pub outcome: Outcome,
    /// Denial code.
    pub code: Option<super::Code>,
    /// The rule that decided, quoted.
    pub rule: Option<String>,
    /// Free-form extra (approval channel, latency, mode bits...).
    pub detail: Option<serde_json::Value>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One line of the ledger. Field order here is the order on disk.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    /// UUID v4.
    pub id: String,
    /// RFC 3339 UTC with microseconds.
    pub timestamp: String,
    /// Always written, `null` when there is no intent.
    #[serde(default)]
    pub intent_id: Option<String>,
    /// Who acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
    /// What happened.
    pub mutation_type: MutationType,
    /// See [`MutationClass`]; absent for entries that put no content at a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutation_class: Option<MutationClass>,
    /// Workspace-relative path (lossy when not UTF-8; then `path_b64` is exact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Standard base64 of the exact path bytes, only when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_b64: Option<String>,
    /// Source path of a rename or link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Exact bytes of `from` when not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_b64: Option<String>,
    /// Always written: `"sha256:<hex>"` of the bytes on disk after the mutation, or null.
    #[serde(default)]
    pub content_hash: Option<String>,
    /// The content hash before the mutation, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_content_hash: Option<String>,
    /// Size after the mutation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Only present (true) for a WRITE by the handle that created the file.
    #[serde(default, skip_serializing_if = "is_false")]
    pub created: bool,
    /// Changed line ranges of the new version, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranges: Option<Vec<LineRange>>,
    /// Git state of the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcs: Option<Vcs>,
    /// `"ok"`, `"denied"`, ...
    pub outcome: String,
    /// Denial code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The rule that decided, quoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Free-form extra.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
    /// Lowercase hex SHA-256 of the previous line's bytes including its `\n`.
    pub prev: String,
}

impl Entry {
    /// The exact path bytes (decoding `path_b64` when present).
    pub fn path_buf(&self) -> Option<PathBuf> {
        decode_path(self.path.as_deref(), self.path_b64.as_deref())
    }

    /// The exact `from` bytes.
    pub fn from_buf(&self) -> Option<PathBuf> {
        decode_path(self.from.as_deref(), self.from_b64.as_deref())
    }
}

/// Splits a path into its JSON string (lossy) and, when not UTF-8, its base64 bytes.
pub fn encode_path(p: &Path) -> (String, Option<String>) {
    match p.to_str() {
        Some(s) => (s.to_owned(), None),
        None => {
            let bytes = p.as_os_str().as_bytes();
            (
                String::from_utf8_lossy(bytes).into_owned(),
                Some(b64_encode(bytes)),
            )
        }
    }
}

/// At least the bytes `p` takes in an entry, as [`encode_path`] writes it (JSON string
/// escapes included): what an entry still to be written will take is judged by it
/// (`--record async` bounds its queue by the ledger's reserve).
pub fn encoded_len(p: &Path) -> usize {
    let bytes = p.as_os_str().as_bytes();
    let escaped: usize = bytes
        .iter()
        .map(|&b| match b {
            b'"' | b'\\' => 2,
            0..0x20 | 0x7f => 6,
            // Kept as it is in UTF-8, or one U+FFFD (3 bytes) per invalid byte at most.
            0x80.. => 3,
            _ => 1,
        })
        .sum();
    let b64 = if p.to_str().is_some() {
        0
    } else {
        bytes.len().div_ceil(3) * 4 + 16
    };
    escaped + b64
}

/// The inverse of [`encode_path`]; a malformed base64 falls back to the lossy string.
pub fn decode_path(s: Option<&str>, b64: Option<&str>) -> Option<PathBuf> {
    if let Some(bytes) = b64.and_then(b64_decode) {
        return Some(PathBuf::from(std::ffi::OsString::from_vec(bytes)));
    }
    s.map(|s| PathBuf::from(OsStr::new(s)))
}

/// Standard base64 (RFC 4648, `+/`, with padding): the ledger's `*_b64` fields.
pub fn b64_encode(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Decodes standard base64 (padding required); None when malformed.
pub fn b64_decode(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `encoded_len` is never less than what a path takes in an entry: its JSON string
    /// (escapes, U+FFFD for bytes that are not UTF-8) and its base64 field.
    #[test]
    fn encoded_len_bounds_the_bytes_a_path_takes() {
        let cases: [&[u8]; 7] = [
            b"src/main.rs",
            b"a \"quoted\" \\ name",
            b"tab\there\nnewline\x01\x7f",
            "caf\u{e9}/\u{65e5}\u{672c}.txt".as_bytes(),
            b"bad\xff\xfe\x80utf8",
            b"\xc3",
            b"",
        ];
        for c in cases {
            let p = Path::new(OsStr::from_bytes(c));
            let (s, b64) = encode_path(p);
            let mut taken = serde_json::to_string(&s).unwrap().len() - 2;
            if let Some(b) = b64 {
                taken += serde_json::to_string(&b).unwrap().len() + r#","path_b64":"#.len();
            }
            assert!(
                encoded_len(p) >= taken,
                "{c:?}: bound {} < {taken}",
                encoded_len(p)
            );
            // Not far above it either, for names of printable ASCII.
            if c.iter()
                .all(|b| (0x20..0x7f).contains(b) && *b != b'"' && *b != b'\\')
            {
                assert_eq!(encoded_len(p), taken, "{c:?}");
            }
        }
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, enc) in cases {
            assert_eq!(b64_encode(plain.as_bytes()), enc);
            assert_eq!(b64_decode(enc).as_deref(), Some(plain.as_bytes()));
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(b64_decode(&b64_encode(&all)), Some(all));
        assert_eq!(b64_decode("Zm9"), None);
        assert_eq!(b64_decode("Z=9v"), None);
        assert_eq!(b64_decode("Zg==Zg=="), None);
    }

    #[test]
    fn mutation_type_names_round_trip() {
        for t in MutationType::ALL {
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("\"{}\"", t.as_str()));
            assert_eq!(MutationType::parse(&t.as_str().to_lowercase()), Some(t));
        }
        assert_eq!(
            MutationType::parse("ledger-repair"),
            Some(MutationType::LedgerRepair)
        );
        assert_eq!(MutationType::parse("nope"), None);
    }

    #[test]
    fn non_utf8_path_encodes_losslessly() {
        let raw = PathBuf::from(std::ffi::OsString::from_vec(
            b"dir/caf\xe9\xff.txt".to_vec(),
        ));
        let (s, b64) = encode_path(&raw);
        assert!(s.contains('\u{fffd}'));
        assert_eq!(decode_path(Some(&s), b64.as_deref()), Some(raw));
        let (s, b64) = encode_path(Path::new("plain/é.rs"));
        assert_eq!((s.as_str(), b64), ("plain/é.rs", None));
    }
}
