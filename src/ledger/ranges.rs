//! Content hashing and line-range diffs: the two computations the filesystem makes
//! on a file's bytes before handing a [`super::Draft`] to the ledger.
//!
//! Pure functions over bytes and one streaming file read; no knowledge of intents.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Largest file (each side) for which line ranges are computed.
pub const MAX_DIFF_BYTES: usize = 1024 * 1024;

/// Most line ranges an entry carries: more are merged into fewer, wider ones (the
/// narrowest unchanged stretches between them counted as changed), so what an entry takes
/// is bounded (`--record async` queues entries against the ledger's reserve by their size).
pub const MAX_RANGES: usize = 32;

/// What [`MAX_RANGES`] ranges take in an entry at most (`{"start_line":N,"end_line":N},`
/// with ten-digit numbers).
pub const RANGES_BYTES: u64 = MAX_RANGES as u64 * 48 + 16;

/// `ranges` (sorted, disjoint), merged into at most `max` that cover every line they did:
/// the widest gaps between them are kept, the others filled in.
pub fn coarsen(ranges: &[(u32, u32)], max: usize) -> Vec<(u32, u32)> {
    if ranges.len() <= max || max == 0 {
        return ranges.to_vec();
    }
    // Gap i lies between range i and range i + 1; keep the `max - 1` widest.
    let mut gaps: Vec<(u32, usize)> = ranges
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1].0.saturating_sub(w[0].1), i))
        .collect();
    gaps.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut keep: Vec<usize> = gaps[..max - 1].iter().map(|g| g.1).collect();
    keep.sort_unstable();
    let mut out = Vec::with_capacity(max);
    let mut start = ranges[0].0;
    for &i in &keep {
        out.push((start, ranges[i].1));
        start = ranges[i + 1].0;
    }
    out.push((start, ranges[ranges.len() - 1].1));
    out
}

/// A diff that takes longer than this falls back to a coarser (still correct:
/// it may only over-report changed lines) answer.
const DIFF_DEADLINE: Duration = Duration::from_millis(200);

/// `("sha256:<hex>", size)` of a file, streaming with a 128 KiB buffer.
pub fn sha256_file(path: &Path) -> io::Result<(String, u64)> {
    let mut f = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 128 * 1024];
    let mut size = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((format!("sha256:{}", hex::encode(hasher.finalize())), size))
}

/// `"sha256:<hex>"` of bytes in memory.
pub fn sha256_bytes(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// Whether bytes look like text: no NUL byte (the test git and grep use).
pub fn is_text(data: &[u8]) -> bool {
    !data.contains(&0)
}

/// The changed line ranges of `new` relative to `old`, 1-based and inclusive, merged
/// when adjacent. None if either side is not text or is larger than 1 MiB.
///
/// Lines keep their `\n`, so adding a final newline marks the last line changed.
/// A pure deletion changes no line of the new version and gives `Some(vec![])`.
pub fn changed_ranges(old: &[u8], new: &[u8]) -> Option<Vec<(u32, u32)>> {
    if old.len() > MAX_DIFF_BYTES || new.len() > MAX_DIFF_BYTES || !is_text(old) || !is_text(new) {
        return None;
    }
    if old.is_empty() {
        // A new (or emptied) file: every line is new, no diff needed (`tar x`, a create).
        if new.is_empty() {
            return Some(Vec::new());
        }
        let lines = memchr::memchr_iter(b'\n', new).count() + usize::from(!new.ends_with(b"\n"));
        return Some(vec![(1, lines as u32)]);
    }
    // The whole lines both sides begin and end with are cut off before the lines are
    // split: an edit changes a few lines of a file, and splitting and comparing all of
    // them was most of a close's diff. The diff trims the same common lines itself (first
    // the prefix, then the suffix), so what it reports does not change; `skip` lines are
    // added back to its line numbers.
    let (skip, old, new) = trim_common_lines(old, new);
    let old_lines: Vec<&[u8]> = old.split_inclusive(|&b| b == b'\n').collect();
    let new_lines: Vec<&[u8]> = new.split_inclusive(|&b| b == b'\n').collect();
    let ops = similar::capture_diff_slices_deadline(
        similar::Algorithm::Myers,
        &old_lines,
        &new_lines,
        Some(Instant::now() + DIFF_DEADLINE),
    );
    let mut out: Vec<(u32, u32)> = Vec::new();
    for op in ops {
        let (start, len) = match op {
            similar::DiffOp::Insert {
                new_index, new_len, ..
            } => (new_index, new_len),
            similar::DiffOp::Replace {
                new_index, new_len, ..
            } => (new_index, new_len),
            similar::DiffOp::Equal { .. } | similar::DiffOp::Delete { .. } => continue,
        };
        if len == 0 {
            continue;
        }
        // Line counts fit u32: at most 1 MiB of input.
        let (s, e) = ((skip + start) as u32 + 1, (skip + start + len) as u32);
        match out.last_mut() {
            Some(last) if last.1 + 1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    Some(out)
}

/// The lines `old` and `new` have in common at their start and their end cut off: how
/// many lines were cut at the start, and what is left of each side. Only whole lines are
/// cut (each ending in `\n`), the longest common run at the start, and at the end the
/// common run that begins after a `\n` both sides share.
fn trim_common_lines<'a>(old: &'a [u8], new: &'a [u8]) -> (usize, &'a [u8], &'a [u8]) {
    let n = old.len().min(new.len());
    let mut i = 0;
    while i + 64 <= n && old[i..i + 64] == new[i..i + 64] {
        i += 64;
    }
    while i < n && old[i] == new[i] {
        i += 1;
    }
    // Back to the end of the last whole line in common.
    let p = memchr::memrchr(b'\n', &old[..i]).map_or(0, |x| x + 1);
    let skip = memchr::memchr_iter(b'\n', &old[..p]).count();
    let (o, w) = (&old[p..], &new[p..]);
    let m = o.len().min(w.len());
    let mut j = 0;
    while j + 64 <= m && o[o.len() - j - 64..o.len() - j] == w[w.len() - j - 64..w.len() - j] {
        j += 64;
    }
    while j < m && o[o.len() - j - 1] == w[w.len() - j - 1] {
        j += 1;
    }
    // The common end, from just after its first `\n` (a line start on both sides).
    let tail = &o[o.len() - j..];
    let cut = match memchr::memchr(b'\n', tail) {
        Some(x) => j - (x + 1),
        None => 0,
    };
    (skip, &o[..o.len() - cut], &w[..w.len() - cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_file_matches_known_vector_and_streams() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            (
                "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
                    .to_owned(),
                3
            )
        );
        // Larger than the buffer, not a multiple of it.
        let big: Vec<u8> = (0..300_001u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &big).unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            (sha256_bytes(&big), big.len() as u64)
        );
        assert!(sha256_file(&dir.path().join("missing")).is_err());
    }

    /// The diff without the trimming: the reference the trimmed diff must equal.
    fn untrimmed(old: &[u8], new: &[u8]) -> Vec<(u32, u32)> {
        let o: Vec<&[u8]> = old.split_inclusive(|&b| b == b'\n').collect();
        let n: Vec<&[u8]> = new.split_inclusive(|&b| b == b'\n').collect();
        let mut out: Vec<(u32, u32)> = Vec::new();
        for op in similar::capture_diff_slices(similar::Algorithm::Myers, &o, &n) {
            let (start, len) = match op {
                similar::DiffOp::Insert {
                    new_index, new_len, ..
                }
                | similar::DiffOp::Replace {
                    new_index, new_len, ..
                } => (new_index, new_len),
                _ => continue,
            };
            if len == 0 {
                continue;
            }
            let (s, e) = (start as u32 + 1, (start + len) as u32);
            match out.last_mut() {
                Some(last) if last.1 + 1 >= s => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        out
    }

    #[test]
    fn trimming_common_lines_changes_no_range() {
        // Edits at the start, the end, the middle; repeated lines (where an alignment
        // could be ambiguous); no final newline; lines longer than the 64-byte strides.
        let long = "x".repeat(150);
        let base: Vec<String> = (0..40)
            .map(|i| match i % 7 {
                0 => "same\n".to_owned(),
                3 => format!("{long}{i}\n"),
                _ => format!("line {i}\n"),
            })
            .collect();
        let text = |lines: &[String]| lines.concat().into_bytes();
        let old = text(&base);
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for at in [0, 1, 3, 20, 38, 39] {
            let mut v = base.clone();
            v[at] = format!("changed {at}\n");
            cases.push(text(&v));
            let mut v = base.clone();
            v.insert(at, "same\n".into());
            cases.push(text(&v));
            let mut v = base.clone();
            v.remove(at);
            cases.push(text(&v));
            let mut v = base.clone();
            v[at] = format!("{long}{at}!\n");
            cases.push(text(&v));
        }
        let mut no_nl = old.clone();
        no_nl.pop();
        cases.push(no_nl.clone());
        let mut more = old.clone();
        more.extend_from_slice(b"// edit 1\n");
        cases.push(more);
        cases.push(b"same\n".to_vec());
        for new in &cases {
            for (a, b) in [(&old, new), (new, &old), (&no_nl, new)] {
                assert_eq!(
                    changed_ranges(a, b),
                    Some(untrimmed(a, b)),
                    "{:?} -> {:?}",
                    String::from_utf8_lossy(a),
                    String::from_utf8_lossy(b)
                );
            }
        }
        assert_eq!(
            changed_ranges(b"a\n", b"a\na\n"),
            Some(untrimmed(b"a\n", b"a\na\n"))
        );
        assert_eq!(changed_ranges(b"a\nb", b"a\nc"), Some(vec![(2, 2)]));
    }

    #[test]
    fn coarsened_ranges_are_few_and_cover_every_line() {
        // Every other line of 3000 changed: 1500 ranges.
        let many: Vec<(u32, u32)> = (0..1500).map(|i| (2 * i + 1, 2 * i + 1)).collect();
        let c = coarsen(&many, MAX_RANGES);
        assert_eq!(c.len(), MAX_RANGES);
        for &(a, b) in &many {
            assert!(
                c.iter().any(|&(s, e)| s <= a && b <= e),
                "{a}-{b} not covered"
            );
        }
        assert!(c.windows(2).all(|w| w[0].1 < w[1].0), "{c:?}");
        // The widest gaps are the ones kept.
        let mut few = vec![(1, 1), (3, 3), (100, 100), (102, 102)];
        assert_eq!(coarsen(&few, 2), [(1, 3), (100, 102)]);
        few.truncate(2);
        assert_eq!(coarsen(&few, 2), few);
        // What 32 of the widest take in an entry is within RANGES_BYTES.
        let wide: Vec<(u32, u32)> = (0..MAX_RANGES as u32)
            .map(|i| (u32::MAX - 100 + i, u32::MAX - 100 + i))
            .collect();
        let json: Vec<_> = wide
            .iter()
            .map(|&(s, e)| serde_json::json!({"start_line": s, "end_line": e}))
            .collect();
        let taken = serde_json::to_string(&json).unwrap().len() + r#","ranges":"#.len();
        assert!(taken as u64 <= RANGES_BYTES, "{taken}");
    }

    #[test]
    fn ranges_for_insert_delete_modify() {
        let old = b"a\nb\nc\nd\ne\n";
        // Modify line 3.
        assert_eq!(changed_ranges(old, b"a\nb\nC\nd\ne\n"), Some(vec![(3, 3)]));
        // Insert two lines after line 1.
        assert_eq!(
            changed_ranges(old, b"a\nx\ny\nb\nc\nd\ne\n"),
            Some(vec![(2, 3)])
        );
        // Delete line 2: nothing in the new version changed.
        assert_eq!(changed_ranges(old, b"a\nc\nd\ne\n"), Some(vec![]));
        // Two separate edits stay separate; adjacent ones merge.
        assert_eq!(
            changed_ranges(old, b"A\nb\nc\nd\nE\n"),
            Some(vec![(1, 1), (5, 5)])
        );
        assert_eq!(changed_ranges(old, b"A\nB\nc\nd\ne\n"), Some(vec![(1, 2)]));
        // Creation: everything is new; a missing final newline is a change.
        assert_eq!(changed_ranges(b"", b"x\ny\nz"), Some(vec![(1, 3)]));
        assert_eq!(changed_ranges(b"", b"x\ny\n"), Some(vec![(1, 2)]));
        assert_eq!(changed_ranges(b"", b"\n"), Some(vec![(1, 1)]));
        assert_eq!(changed_ranges(b"", b""), Some(vec![]));
        assert_eq!(changed_ranges(b"", b"a\0"), None);
        assert_eq!(changed_ranges(b"x\ny", b"x\ny\n"), Some(vec![(2, 2)]));
        assert_eq!(changed_ranges(old, old), Some(vec![]));
    }

    #[test]
    fn ranges_refuse_binary_and_large() {
        assert_eq!(changed_ranges(b"a\0b", b"a"), None);
        assert_eq!(changed_ranges(b"a", b"\0"), None);
        let big = vec![b'x'; MAX_DIFF_BYTES + 1];
        assert_eq!(changed_ranges(&big, b"a"), None);
        let ok = vec![b'x'; MAX_DIFF_BYTES];
        assert_eq!(changed_ranges(&ok, b"a"), Some(vec![(1, 1)]));
    }
}
