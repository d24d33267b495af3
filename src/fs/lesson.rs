//! Lessons from failed verification: `intentfs run --verify -- CMD` hands the daemon the
//! tail of a failing command's output through `.intentfs/lesson`; the daemon appends it to
//! `CLAUDE.md` at the workspace root — directly in the workspace, not through the mount, so
//! no intent's scope is needed — deduplicated by a hash of the output.

use std::io::Write;
use std::os::fd::{AsFd, FromRawFd};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{error::err, sys, Fs, Result};
use crate::guard::Identity;

/// Most characters of output kept in a lesson.
pub const MAX_TAIL: usize = 2000;

/// What `intentfs run --verify` sends.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LessonMsg {
    command: String,
    status: i32,
    output: String,
    #[serde(default)]
    intent: Option<String>,
    /// The agent that ran the command (`run --verify --agent`).
    #[serde(default)]
    agent: Option<String>,
}

/// Remove ANSI escape sequences (colours, cursor moves).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match it.peek() {
            Some('[') => {
                it.next();
                // CSI: parameters then one final byte in @..~
                for c in it.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                // OSC: until BEL or ESC \
                it.next();
                while let Some(c) = it.next() {
                    if c == '\u{7}' {
                        break;
                    }
                    if c == '\u{1b}' {
                        it.next();
                        break;
                    }
                }
            }
            Some(_) => {
                it.next();
            }
            None => {}
        }
    }
    out
}

/// The last `max` characters of `s`.
pub fn tail(s: &str, max: usize) -> &str {
    let n = s.chars().count();
    if n <= max {
        return s;
    }
    let skip = s.char_indices().nth(n - max).map(|(i, _)| i).unwrap_or(0);
    &s[skip..]
}

impl Fs {
    pub(crate) fn append_lesson(&self, ident: &Identity, raw: &[u8]) -> Result<()> {
        let Ok(msg) = serde_json::from_slice::<LessonMsg>(raw) else {
            return err(libc::EINVAL);
        };
        let output = strip_ansi(&msg.output);
        let output = tail(output.trim_end(), MAX_TAIL);
        let digest = hex::encode(Sha256::digest(output.as_bytes()));
        let marker = format!("<!-- intentfs-lesson {} -->", &digest[..16]);
        let root = self.fd(self.table.root())?;
        let name = std::ffi::OsStr::new(super::LESSON_FILE);
        // Dedup: skip when CLAUDE.md already holds this output's lesson.
        if let Ok(fd) = sys::open_path(root.as_fd(), name) {
            if sys::stat_fd(fd.as_fd())
                .map(|s| s.st_mode & libc::S_IFMT != libc::S_IFREG)
                .unwrap_or(true)
            {
                return err(libc::EINVAL);
            }
            let f = sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), libc::O_RDONLY)?;
            if let Some(existing) = super::hash::read_small(&f, 64 * 1024 * 1024) {
                if String::from_utf8_lossy(&existing).contains(&marker) {
                    return Ok(());
                }
            }
        }
        let c = std::ffi::CString::new(super::LESSON_FILE).unwrap_or_default();
        // SAFETY: valid C string and dirfd; O_NOFOLLOW refuses a symlinked CLAUDE.md.
        let fd = unsafe {
            libc::openat(
                std::os::fd::AsRawFd::as_raw_fd(&*root),
                c.as_ptr(),
                libc::O_WRONLY
                    | libc::O_APPEND
                    | libc::O_CREAT
                    | libc::O_NOFOLLOW
                    | libc::O_CLOEXEC,
                0o644 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: fresh fd from openat.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let intent = msg
            .intent
            .or_else(|| ident.intent())
            .unwrap_or_else(|| "(none)".into());
        let when = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let text = format!(
            "\n## Lesson: verification failed ({when})\n{marker}\n\n- intent: {intent}\n- agent: {}\n- command: `{}`\n- exit status: {}\n\n```text\n{}\n```\n",
            msg.agent.as_deref().unwrap_or(&ident.name),
            msg.command.replace('`', "'"),
            msg.status,
            output.replace("```", "'''"),
        );
        f.write_all(text.as_bytes())?;
        f.sync_data()?;
        tracing::info!(agent = %ident.name, "lesson appended to CLAUDE.md for `{}`", msg.command);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_is_stripped() {
        assert_eq!(strip_ansi("\u{1b}[31merror\u{1b}[0m: x"), "error: x");
        assert_eq!(strip_ansi("a\u{1b}]0;title\u{7}b"), "ab");
        assert_eq!(strip_ansi("plain"), "plain");
    }

    #[test]
    fn tail_keeps_last_chars() {
        assert_eq!(tail("abcdef", 3), "def");
        assert_eq!(tail("ab", 3), "ab");
        assert_eq!(tail("ééé", 2), "éé");
    }
}
