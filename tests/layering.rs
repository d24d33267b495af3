//! The crate's layering, checked from its source: no two sibling modules know about each
//! other (the module import graph has no cycle, at every level), and the top-level modules
//! only reach the layers `src/lib.rs` lists before them ("a module never knows about the
//! layers above it"). No build or mount needed: it reads `src/`.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`["fs", "ops"]`) of a source file, `None` for the binary's `main.rs`.
fn module_of(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    match last.as_str() {
        "main.rs" if parts.is_empty() => return None,
        "lib.rs" if parts.is_empty() => {}
        "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_owned()),
    }
    Some(parts)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text of a file without comments and string literals (so a path in a doc comment
/// or a message is not an import).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            // A raw string (`r"..."`, `r#"..."#`) or a plain one.
            let raw_hashes = {
                let mut j = i;
                let mut n = 0;
                while j > 0 && b[j - 1] == b'#' {
                    n += 1;
                    j -= 1;
                }
                (j > 0 && b[j - 1] == b'r').then_some(n)
            };
            i += 1;
            match raw_hashes {
                Some(n) => {
                    let close: Vec<u8> = std::iter::once(b'"')
                        .chain(std::iter::repeat_n(b'#', n))
                        .collect();
                    while i < b.len() && !b[i..].starts_with(&close) {
                        out.push(if b[i] == b'\n' { '\n' } else { ' ' });
                        i += 1;
                    }
                    i += close.len();
                }
                None => {
                    while i < b.len() && b[i] != b'"' {
                        if b[i] == b'\\' {
                            i += 1;
                        }
                        if b.get(i) == Some(&b'\n') {
                            out.push('\n');
                        }
                        i += 1;
                    }
                    i += 1;
                }
            }
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as '"' or '{'.
            out.push_str("' '");
            i += 3;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Every path a file names through `crate::`, `super::` or `self::`, resolved to absolute
/// segment lists (braces expanded), with the line it is on.
fn references(module: &[String], is_mod_rs: bool, code: &str) -> Vec<(Vec<String>, usize)> {
    // `super` of `a::b` (file a/b.rs) is `a`; of `a` (file a/mod.rs) is the crate root.
    let here: Vec<String> = module.to_vec();
    let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
    let _ = is_mod_rs;
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let text: String = chars.iter().collect();
    for (start, root) in [
        ("crate::", "crate"),
        ("super::", "super"),
        ("self::", "self"),
    ] {
        let mut from = 0;
        while let Some(pos) = text[from..].find(start) {
            let at = from + pos;
            from = at + start.len();
            let before = text[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let base: Vec<String> = match root {
                "crate" => Vec::new(),
                "super" => parent.clone(),
                _ => here.clone(),
            };
            let line = text[..at].matches('\n').count() + 1;
            for tail in expand(&text[from..]) {
                let mut p = base.clone();
                p.extend(tail);
                out.push((p, line));
            }
        }
    }
    out
}

/// The paths a `use` tail names: `a::b::C` → `[a, b, C]`; `{a::X, b}` → both.
fn expand(s: &str) -> Vec<Vec<String>> {
    let mut segs = Vec::new();
    let mut rest = s;
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            if let Some(inner) = rest.strip_prefix('{') {
                let mut depth = 1;
                let mut end = 0;
                for (i, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = i;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let body = &inner[..end];
                let mut parts = Vec::new();
                let (mut d, mut last) = (0, 0);
                for (i, c) in body.char_indices() {
                    match c {
                        '{' => d += 1,
                        '}' => d -= 1,
                        ',' if d == 0 => {
                            parts.push(&body[last..i]);
                            last = i + 1;
                        }
                        _ => {}
                    }
                }
                parts.push(&body[last..]);
                let mut all = Vec::new();
                for p in parts {
                    let p = p.trim();
                    if p.is_empty() || p == "self" {
                        all.push(segs.clone());
                        continue;
                    }
                    for t in expand(p) {
                        let mut v = segs.clone();
                        v.extend(t);
                        all.push(v);
                    }
                }
                return all;
            }
            return vec![segs];
        }
        rest = &rest[ident.len()..];
        segs.push(ident);
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => return vec![segs],
        }
    }
}

struct Crate {
    modules: BTreeSet<Vec<String>>,
    /// For each parent module, edges between its children: (from, to) -> a witness.
    edges: BTreeMap<Vec<String>, BTreeMap<(String, String), String>>,
}

fn load() -> Crate {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut modules = BTreeSet::new();
    let mut parsed = Vec::new();
    for f in &files {
        let Some(m) = module_of(&src, f) else {
            continue;
        };
        // Unit tests may reach anything.
        if m.last().is_some_and(|l| l == "tests") {
            continue;
        }
        modules.insert(m.clone());
        parsed.push((f.clone(), m));
    }
    let mut edges: BTreeMap<Vec<String>, BTreeMap<(String, String), String>> = BTreeMap::new();
    for (f, m) in &parsed {
        let text = std::fs::read_to_string(f).unwrap();
        // Inline unit tests may reach anything too.
        let text = match text.find("#[cfg(test)]\nmod tests {") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        let code = code_only(text);
        let is_mod_rs = f.file_name().is_some_and(|n| n == "mod.rs");
        for (path, line) in references(m, is_mod_rs, &code) {
            // The longest known module the path names.
            let Some(target) = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            let common = m
                .iter()
                .zip(target.iter())
                .take_while(|(a, b)| a == b)
                .count();
            // Within one module, or between a module and its ancestors or descendants.
            if common == m.len() || common == target.len() {
                continue;
            }
            let parent = m[..common].to_vec();
            let (a, b) = (m[common].clone(), target[common].clone());
            let rel = f.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(f);
            edges
                .entry(parent)
                .or_default()
                .entry((a, b))
                .or_insert_with(|| format!("{}:{line} names {}", rel.display(), path.join("::")));
        }
    }
    Crate { modules, edges }
}

/// A cycle in one sibling graph, as the edges that make it, if there is one.
fn find_cycle(edges: &BTreeMap<(String, String), String>) -> Option<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    for start in &nodes {
        // Depth-first from `start`, looking for a way back to it.
        let mut stack: Vec<(String, Vec<String>)> = vec![((*start).clone(), Vec::new())];
        let mut seen = BTreeSet::new();
        while let Some((n, path)) = stack.pop() {
            for ((a, b), why) in edges.range((n.clone(), String::new())..) {
                if *a != n {
                    break;
                }
                let mut p = path.clone();
                p.push(format!("{a} -> {b} ({why})"));
                if b == *start {
                    return Some(p);
                }
                if seen.insert(b.clone()) {
                    stack.push((b.clone(), p));
                }
            }
        }
    }
    None
}

#[test]
fn sibling_modules_never_know_each_other_both_ways() {
    let c = load();
    assert!(
        c.modules.len() > 40,
        "found only {} modules",
        c.modules.len()
    );
    let mut cycles = Vec::new();
    for (parent, edges) in &c.edges {
        if let Some(cy) = find_cycle(edges) {
            let name = if parent.is_empty() {
                "crate".to_owned()
            } else {
                parent.join("::")
            };
            cycles.push(format!("in {name}:\n  {}", cy.join("\n  ")));
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles between sibling modules:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn top_level_modules_only_reach_the_layers_below_them() {
    let c = load();
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    // `//! - [`policy`]: ...` lines, bottom layer first.
    let order: Vec<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//! - "))
        .filter_map(|l| {
            let l = l.trim_start_matches('[');
            let l = l.strip_prefix('`')?;
            Some(l[..l.find('`')?].to_owned())
        })
        .collect();
    let top: BTreeSet<String> = c
        .modules
        .iter()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].clone())
        .collect();
    let listed: BTreeSet<String> = order.iter().cloned().collect();
    assert_eq!(
        listed, top,
        "src/lib.rs must list every top-level module, bottom layer first"
    );
    let rank = |m: &str| order.iter().position(|o| o == m).unwrap();
    let mut upward = Vec::new();
    for ((a, b), why) in c.edges.get(&Vec::new()).into_iter().flatten() {
        if rank(b) > rank(a) {
            upward.push(format!("{a} reaches {b}, listed above it: {why}"));
        }
    }
    assert!(
        upward.is_empty(),
        "a module reaches a layer above it:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_checker_sees_an_import_and_a_cycle() {
    let refs = references(
        &["fs".into(), "ops".into()],
        false,
        &code_only("use super::{gate::Gate, sys};\nuse crate::guard::{Code, op::Operation};\n// crate::cli::x\nlet s = \"crate::cli\";"),
    );
    let paths: Vec<String> = refs.iter().map(|(p, _)| p.join("::")).collect();
    assert_eq!(
        paths,
        [
            "guard::Code",
            "guard::op::Operation",
            "fs::gate::Gate",
            "fs::sys"
        ],
        "{refs:?}"
    );
    let mut e = BTreeMap::new();
    e.insert(("a".to_owned(), "b".to_owned()), "x".to_owned());
    assert!(find_cycle(&e).is_none());
    e.insert(("b".to_owned(), "a".to_owned()), "y".to_owned());
    assert!(find_cycle(&e).is_some());
}
