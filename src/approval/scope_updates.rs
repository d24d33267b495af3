//! The record of "expand scope" grants: `.orchestration/pending_scope_updates.json`, a JSON
//! array the human folds into the policy. Written by the daemon straight into the backing
//! workspace (never through the mount, where `.orchestration/` is read-only), and replaced
//! atomically so a reader or a crash never sees half an array.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use parking_lot::Mutex;

/// Where the grants are recorded, relative to the workspace root.
pub const SCOPE_UPDATES_FILE: &str = ".orchestration/pending_scope_updates.json";

/// Serializes read-modify-write cycles within the daemon (several mounts, or several
/// grants at once, must not lose each other's entries).
static WRITING: Mutex<()> = Mutex::new(());

/// Appends `{time, intent, identity, agent, glob, path}` to
/// `WORKSPACE/.orchestration/pending_scope_updates.json` (created if missing). Refuses to
/// follow a symlink there, and refuses to overwrite a file that is not a JSON array.
pub fn record_scope_update(
    workspace: &Path,
    intent: &str,
    glob: &str,
    identity: &str,
    agent: &str,
    path: &Path,
) -> io::Result<()> {
    let _w = WRITING.lock();
    let dir = workspace.join(".orchestration");
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if !fs::symlink_metadata(&dir)?.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory (a symlink?): refusing to write through it",
            dir.display()
        )));
    }
    let file = dir.join("pending_scope_updates.json");
    let (mut entries, mode) = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&file)
    {
        Ok(mut f) => {
            let mode = f.metadata()?.permissions().mode() & 0o7777;
            let mut text = String::new();
            f.read_to_string(&mut text)?;
            let entries = if text.trim().is_empty() {
                Vec::new()
            } else {
                serde_json::from_str::<Vec<serde_json::Value>>(&text).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: not a JSON array ({e})\nhint: fix or remove the file",
                            file.display()
                        ),
                    )
                })?
            };
            (entries, mode)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => (Vec::new(), 0o644),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(io::Error::other(format!(
                "{} is a symlink: refusing to follow it",
                file.display()
            )))
        }
        Err(e) => return Err(e),
    };
    entries.push(serde_json::json!({
        "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "intent": intent,
        "identity": identity,
        "agent": agent,
        "glob": glob,
        "path": path.to_string_lossy(),
    }));
    let mut text = serde_json::to_string_pretty(&entries).map_err(io::Error::other)?;
    text.push('\n');

    let tmp = dir.join(format!(
        ".pending_scope_updates.json.{}.tmp",
        std::process::id()
    ));
    let written = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, &file)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable only once the directory is.
    fs::File::open(&dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(ws: &Path) -> Vec<serde_json::Value> {
        serde_json::from_str(&fs::read_to_string(ws.join(SCOPE_UPDATES_FILE)).unwrap()).unwrap()
    }

    #[test]
    fn appends_to_a_json_array_creating_it() {
        let ws = tempfile::tempdir().unwrap();
        record_scope_update(
            ws.path(),
            "INT-1",
            "src/db/**",
            "session:42",
            "claude",
            Path::new("src/db/x.rs"),
        )
        .unwrap();
        record_scope_update(
            ws.path(),
            "INT-2",
            "docs/**",
            "default",
            "docs",
            Path::new("docs/a.md"),
        )
        .unwrap();
        let v = read(ws.path());
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["intent"], "INT-1");
        assert_eq!(v[0]["glob"], "src/db/**");
        assert_eq!(v[0]["identity"], "session:42");
        assert_eq!(v[0]["agent"], "claude");
        assert_eq!(v[0]["path"], "src/db/x.rs");
        assert!(v[0]["time"].as_str().unwrap().ends_with('Z'));
        assert_eq!(v[1]["intent"], "INT-2");
        // no temp file left behind
        let names: Vec<_> = fs::read_dir(ws.path().join(".orchestration"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["pending_scope_updates.json"]);
    }

    #[test]
    fn keeps_a_file_it_cannot_parse_and_refuses_symlinks() {
        let ws = tempfile::tempdir().unwrap();
        fs::create_dir(ws.path().join(".orchestration")).unwrap();
        let f = ws.path().join(SCOPE_UPDATES_FILE);
        fs::write(&f, "{\"not\": \"an array\"}").unwrap();
        let e =
            record_scope_update(ws.path(), "I", "g", "default", "a", Path::new("p")).unwrap_err();
        assert!(e.to_string().contains("not a JSON array"), "{e}");
        assert_eq!(fs::read_to_string(&f).unwrap(), "{\"not\": \"an array\"}");

        fs::remove_file(&f).unwrap();
        let outside = ws.path().join("outside.json");
        fs::write(&outside, "[]").unwrap();
        std::os::unix::fs::symlink(&outside, &f).unwrap();
        let e =
            record_scope_update(ws.path(), "I", "g", "default", "a", Path::new("p")).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        assert_eq!(fs::read_to_string(&outside).unwrap(), "[]");
    }
}
