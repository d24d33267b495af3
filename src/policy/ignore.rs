//! `.intentignore`: the paths no intent may ever write, whatever its scope says.
//!
//! The file sits at the workspace root and uses gitignore syntax, matched with the
//! `ignore` crate (the same engine as ripgrep). As in gitignore, a pattern that matches
//! a directory covers everything below it, `dir/` matches directories only, a pattern
//! without `/` matches at any depth, and the last matching line wins, so `!pattern`
//! re-allows a path. One difference from git, on purpose: because we test the path
//! itself before its parents, `!secrets/README.md` re-allows that file even though
//! `secrets/` is ignored (git would not look inside an ignored directory).
//!
//! This file owns reading and matching `.intentignore`; it does not know that the file
//! itself is always protected (that is the guard's list of protected paths).

use std::io::Read;
use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::error::{line_col_of_byte, quote, quote_verbatim, PolicyError};

/// The file name, at the workspace root.
pub const INTENTIGNORE: &str = ".intentignore";

/// Same bound as for the policy file: a real ignore file is a few hundred bytes.
const MAX_IGNORE_BYTES: u64 = 4 * 1024 * 1024;

/// The compiled `.intentignore`.
#[derive(Clone, Debug)]
pub struct IntentIgnore {
    /// The matcher. Each glob's `from` is `.intentignore:LINE`, which is how a match
    /// reports its line number (the `ignore` crate keeps no line numbers itself).
    matcher: Gitignore,
    /// The file it came from (empty for [`IntentIgnore::empty`]).
    source: PathBuf,
}

impl IntentIgnore {
    /// Reads `WORKSPACE/.intentignore`. A missing file is an empty ignore list; any
    /// other read error (permissions, a directory, not UTF-8, a bad pattern) is an error.
    ///
    /// # Errors
    /// [`PolicyError::Read`] when the file exists but cannot be read; otherwise as for
    /// [`IntentIgnore::parse`].
    pub fn load(workspace_root: &Path) -> Result<IntentIgnore, PolicyError> {
        let path = workspace_root.join(INTENTIGNORE);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(IntentIgnore::empty()),
            Err(e) => return Err(PolicyError::read(&path, ".intentignore", e)),
        };
        let mut bytes = Vec::new();
        file.take(MAX_IGNORE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| PolicyError::read(&path, ".intentignore", e))?;
        if bytes.len() as u64 > MAX_IGNORE_BYTES {
            return Err(PolicyError::read(
                &path,
                ".intentignore",
                std::io::Error::new(
                    std::io::ErrorKind::FileTooLarge,
                    "file is larger than 4 MiB",
                ),
            ));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            let (line, column) = line_col_of_byte(
                &String::from_utf8_lossy(e.as_bytes()),
                e.utf8_error().valid_up_to(),
            );
            PolicyError::invalid(
                &path,
                line,
                column,
                "the file is not valid utf-8",
                "save it as utf-8 text",
            )
        })?;
        IntentIgnore::parse(&text, &path)
    }

    /// Parses gitignore-syntax `text`; `origin` names the file in messages and rules.
    ///
    /// # Errors
    /// [`PolicyError::Invalid`] with the file and line of a pattern that does not compile.
    pub fn parse(text: &str, origin: &Path) -> Result<IntentIgnore, PolicyError> {
        // Root "." makes the matcher take our workspace-relative paths as they are.
        let mut builder = GitignoreBuilder::new(".");
        let name = origin.file_name().map_or_else(
            || INTENTIGNORE.to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        for (i, line) in text.lines().enumerate() {
            let from = PathBuf::from(format!("{name}:{}", i + 1));
            builder.add_line(Some(from), line).map_err(|e| {
                PolicyError::invalid(
                    origin,
                    i as u64 + 1,
                    1,
                    format!(
                        "invalid pattern {}: {}",
                        quote(line.trim_end()),
                        lower_ignore_error(&e)
                    ),
                    "gitignore syntax: one pattern per line, `dir/` for a directory, \
                     `!pattern` to re-allow, `#` for comments; write `[*]` for a literal `*`",
                )
            })?;
        }
        let matcher = builder.build().map_err(|e| {
            PolicyError::invalid(
                origin,
                0,
                0,
                format!("cannot compile the patterns: {e}"),
                "simplify the patterns",
            )
        })?;
        Ok(IntentIgnore {
            matcher,
            source: origin.to_path_buf(),
        })
    }

    /// Ignores nothing.
    pub fn empty() -> IntentIgnore {
        IntentIgnore {
            matcher: Gitignore::empty(),
            source: PathBuf::new(),
        }
    }

    /// True when there are no patterns.
    pub fn is_empty(&self) -> bool {
        self.matcher.is_empty()
    }

    /// The file this was read from (empty for [`IntentIgnore::empty`]).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The deciding rule, e.g. `.intentignore:3 "secrets/"`, when `rel` or one of its
    /// parent directories is ignored. `is_dir` says whether `rel` itself is a directory
    /// (gitignore's `dir/` patterns match directories only). The workspace root (the
    /// empty path) is never ignored.
    pub fn matched(&self, rel: &Path, is_dir: bool) -> Option<String> {
        if self.matcher.is_empty() {
            return None;
        }
        // The matcher asserts (panics) on paths with a root; strip one defensively
        // rather than ever panicking inside a request.
        let rel = strip_root(rel);
        if rel.as_os_str().is_empty() {
            return None;
        }
        match self.matcher.matched_path_or_any_parents(rel, is_dir) {
            ignore::Match::Ignore(glob) => {
                let from = glob
                    .from()
                    .map_or_else(|| INTENTIGNORE.to_string(), |f| f.display().to_string());
                Some(format!("{from} {}", quote_verbatim(glob.original())))
            }
            ignore::Match::Whitelist(_) | ignore::Match::None => None,
        }
    }
}

/// Removes leading `/` and `./` (see the matcher's assertion above).
fn strip_root(rel: &Path) -> &Path {
    let mut rel = rel;
    while let Ok(stripped) = rel.strip_prefix("/").or_else(|_| rel.strip_prefix(".")) {
        if stripped == rel {
            break;
        }
        rel = stripped;
    }
    rel
}

/// The `ignore` crate's error text without its "error parsing glob '...':" preamble
/// (we quote the line ourselves).
fn lower_ignore_error(e: &ignore::Error) -> String {
    let text = e.to_string();
    let text = match text.find("': ") {
        Some(i) if text.starts_with("error parsing glob '") => text[i + 3..].to_string(),
        _ => text,
    };
    super::error::lower_first(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    const TEXT: &str = "# comment\n\
                        secrets/\n\
                        *.lock\n\
                        !Cargo.lock\n\
                        /build\n\
                        vendor/**/generated.rs\n\
                        keys/\n\
                        !keys/README.md\n";

    fn ig() -> IntentIgnore {
        IntentIgnore::parse(TEXT, Path::new("/ws/.intentignore")).expect("parses")
    }

    #[test]
    fn directories_negation_and_anchoring() {
        let ig = ig();
        // (path, is_dir, expected rule)
        let table: &[(&str, bool, Option<&str>)] = &[
            ("secrets", true, Some(".intentignore:2 \"secrets/\"")),
            ("secrets", false, None), // `dir/` matches directories only
            (
                "secrets/db.yaml",
                false,
                Some(".intentignore:2 \"secrets/\""),
            ),
            ("secrets/a/b/c", false, Some(".intentignore:2 \"secrets/\"")),
            ("app/secrets/x", false, Some(".intentignore:2 \"secrets/\"")), // no `/` inside: any depth
            ("yarn.lock", false, Some(".intentignore:3 \"*.lock\"")),
            (
                "web/package.lock",
                false,
                Some(".intentignore:3 \"*.lock\""),
            ),
            ("Cargo.lock", false, None), // negated
            ("build", true, Some(".intentignore:5 \"/build\"")),
            ("build/out.o", false, Some(".intentignore:5 \"/build\"")),
            ("src/build/x", false, None), // anchored by the leading /
            (
                "vendor/a/b/generated.rs",
                false,
                Some(".intentignore:6 \"vendor/**/generated.rs\""),
            ),
            ("vendor/a/b/other.rs", false, None),
            ("keys/id", false, Some(".intentignore:7 \"keys/\"")),
            ("keys/README.md", false, None), // re-allowed inside an ignored directory
            ("src/main.rs", false, None),
            ("", true, None),
        ];
        for (path, is_dir, expected) in table {
            assert_eq!(
                ig.matched(Path::new(path), *is_dir).as_deref(),
                *expected,
                "path {path:?}"
            );
        }
    }

    #[test]
    fn odd_paths_never_panic() {
        let ig = ig();
        assert_eq!(
            ig.matched(Path::new("/secrets/x"), false).as_deref(),
            Some(".intentignore:2 \"secrets/\"")
        );
        assert_eq!(
            ig.matched(Path::new("./secrets/x"), false).as_deref(),
            Some(".intentignore:2 \"secrets/\"")
        );
        let non_utf8 = Path::new(OsStr::from_bytes(b"secrets/\xff"));
        assert_eq!(
            ig.matched(non_utf8, false).as_deref(),
            Some(".intentignore:2 \"secrets/\"")
        );
        assert_eq!(
            ig.matched(Path::new(OsStr::from_bytes(b"\xff.lock")), false)
                .as_deref(),
            Some(".intentignore:3 \"*.lock\"")
        );
    }

    #[test]
    fn empty_and_missing() {
        assert_eq!(
            IntentIgnore::empty().matched(Path::new("anything"), false),
            None
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let ig = IntentIgnore::load(dir.path()).expect("missing file is fine");
        assert!(ig.is_empty());
        std::fs::write(dir.path().join(".intentignore"), "dist/\n").expect("write");
        let ig = IntentIgnore::load(dir.path()).expect("loads");
        assert_eq!(
            ig.matched(Path::new("dist/x.js"), false).as_deref(),
            Some(".intentignore:1 \"dist/\"")
        );
        assert_eq!(ig.source(), dir.path().join(".intentignore"));
    }

    #[test]
    fn bad_pattern_and_bad_encoding_are_errors_with_position() {
        let e = IntentIgnore::parse("ok\nsrc/{a,b\n", Path::new("ws/.intentignore"))
            .expect_err("bad glob");
        let text = e.to_string();
        assert!(
            text.starts_with(
                "ws/.intentignore:2:1: invalid pattern \"src/{a,b\": unclosed alternate group"
            ),
            "{text}"
        );
        assert!(text.contains("\nhint: gitignore syntax"), "{text}");

        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(".intentignore"), b"a\nb\xff\n").expect("write");
        let e = IntentIgnore::load(dir.path()).expect_err("not utf-8");
        assert!(
            e.to_string()
                .contains(".intentignore:2:2: the file is not valid utf-8"),
            "{e}"
        );
        std::fs::remove_file(dir.path().join(".intentignore")).expect("rm");
        std::fs::create_dir(dir.path().join(".intentignore")).expect("mkdir");
        let e = IntentIgnore::load(dir.path()).expect_err("a directory");
        assert!(e.to_string().contains("cannot read .intentignore"), "{e}");
    }
}
