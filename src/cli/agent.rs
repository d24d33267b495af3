//! The agent's side of the handshake, for `intentfs mcp` and `intentfs hook`: both run as
//! processes of the agent (its client starts them inside the mount), so everything goes
//! through the control files of `MOUNT/.intentfs/` and the daemon answers for the identity
//! of the process that asks. Nothing here is trusted by the daemon.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

use crate::control::DIR_NAME;

/// A mount seen from inside, as the calling process.
pub struct Governed {
    /// The mount's root (where `.intentfs/` is), canonical.
    pub root: PathBuf,
}

/// A query the daemon refused (reading `.intentfs/approval`'s answer failed `EACCES`: the
/// human said no): the errno and the caller's `last_error` after it.
pub struct Refused {
    pub errno: i32,
    pub last_error: Value,
}

impl Governed {
    /// The intentfs mount holding `start`: the nearest directory, `start` or above, with
    /// the control directory in it.
    pub fn find(start: &Path) -> anyhow::Result<Governed> {
        let start = start
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", start.display()))?;
        for dir in start.ancestors() {
            let ctl = dir.join(DIR_NAME);
            if ctl.join("session").is_file() && ctl.join("last_error").is_file() {
                return Ok(Governed {
                    root: dir.to_path_buf(),
                });
            }
        }
        bail!(
            "{} is not inside an intentfs mount (no directory above it has {DIR_NAME}/)\n\
             hint: start the agent (and so this command) inside the mountpoint, e.g. \
             `cd /mnt/agent && intentfs run --intents all --agent claude -- claude`",
            start.display()
        )
    }

    fn ctl(&self, name: &str) -> PathBuf {
        self.root.join(DIR_NAME).join(name)
    }

    /// A control file's content, rendered for the caller.
    pub fn read(&self, name: &str) -> anyhow::Result<String> {
        std::fs::read_to_string(self.ctl(name))
            .with_context(|| format!("cannot read {}", self.ctl(name).display()))
    }

    /// The caller's most recent refusal (`{}` when none).
    pub fn last_error(&self) -> Value {
        self.read("last_error")
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_else(|| json!({}))
    }

    /// The mount's status (JSON).
    pub fn status(&self) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.read("status")?)?)
    }

    /// The selectable intents: `(id, name, scope globs)`.
    pub fn intents(&self) -> anyhow::Result<Vec<(String, String, Vec<String>)>> {
        Ok(self
            .read("intents")?
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, '\t');
                let id = f.next()?.to_string();
                let name = f.next().unwrap_or_default().to_string();
                let globs = f
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_string)
                    .collect();
                Some((id, name, globs))
            })
            .collect())
    }

    /// The caller's identity: `(key, agent name, intents it may select)`.
    pub fn session(&self) -> anyhow::Result<(String, String, String)> {
        let s = self.read("session")?;
        let mut f = s.trim_end().splitn(3, '\t');
        Ok((
            f.next().unwrap_or_default().to_string(),
            f.next().unwrap_or_default().to_string(),
            f.next().unwrap_or_default().to_string(),
        ))
    }

    /// Select an intent for the caller's identity. A refusal is the daemon's, explained
    /// in `last_error` (returned).
    pub fn select(&self, id: &str) -> Result<(), Value> {
        let r = OpenOptions::new()
            .write(true)
            .open(self.ctl("intent"))
            .and_then(|mut f| f.write_all(format!("{id}\n").as_bytes()));
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                let le = self.last_error();
                if le.get("code").is_some() {
                    Err(le)
                } else {
                    Err(json!({ "code": "IO_ERROR", "message": e.to_string(),
                                "remedy": "Check that the intentfs mount is still there." }))
                }
            }
        }
    }

    /// Ask a query file (`check` or `approval`): write the request, read the answer back
    /// from the same open file.
    pub fn query(&self, name: &str, req: &Value) -> anyhow::Result<Result<Value, Refused>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.ctl(name))
            .with_context(|| format!("cannot open {}", self.ctl(name).display()))?;
        if let Err(e) = f.write_all_at(req.to_string().as_bytes(), 0) {
            let Some(errno) = e.raw_os_error() else {
                return Err(e.into());
            };
            return Ok(Err(Refused {
                errno,
                last_error: self.last_error(),
            }));
        }
        // Reading the answer is what waits for a human (`approval`), and what fails when
        // the human said no.
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match f.read_at(&mut buf, out.len() as u64) {
                Ok(n) => n,
                Err(e) => {
                    let Some(errno) = e.raw_os_error() else {
                        return Err(e.into());
                    };
                    return Ok(Err(Refused {
                        errno,
                        last_error: self.last_error(),
                    }));
                }
            };
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        let v: Value = serde_json::from_slice(&out)
            .map_err(|e| anyhow!("the daemon's answer on .intentfs/{name} is not JSON: {e}"))?;
        Ok(Ok(v))
    }

    /// `path` (absolute, or relative to `cwd`) as a path relative to the mount's root,
    /// after the symlinks of its existing part, as an operation on it would resolve them.
    pub fn rel(&self, path: &Path, cwd: &Path) -> anyhow::Result<String> {
        let abs = if path.is_absolute() {
            path.to_path_buf()
        } else {
            cwd.join(path)
        };
        let abs = normalize(&abs);
        // The longest existing ancestor, canonical; the rest as given.
        let mut base = abs.clone();
        let mut rest = Vec::new();
        let resolved = loop {
            match base.canonicalize() {
                Ok(c) => break c,
                Err(_) => {
                    let Some(name) = base.file_name() else {
                        break base.clone();
                    };
                    rest.push(name.to_os_string());
                    if !base.pop() {
                        break base.clone();
                    }
                }
            }
        };
        let mut full = resolved;
        for n in rest.iter().rev() {
            full.push(n);
        }
        let rel = full.strip_prefix(&self.root).map_err(|_| {
            anyhow!(
                "{} is outside the intentfs mount {}: intentfs governs only paths inside it",
                path.display(),
                self.root.display()
            )
        })?;
        Ok(rel.to_string_lossy().into_owned())
    }
}

/// `..` and `.` resolved lexically (before any symlink: as given).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c.as_os_str()),
        }
    }
    out
}

/// An error of the handshake in the shape of `last_error`.
pub fn error(code: &str, message: impl Into<String>, remedy: impl Into<String>) -> Value {
    json!({ "code": code, "message": message.into(), "remedy": remedy.into() })
}

/// `io::Error` for an errno, for messages.
pub fn errno_text(errno: i32) -> String {
    io::Error::from_raw_os_error(errno).to_string()
}
