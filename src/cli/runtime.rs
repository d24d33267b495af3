//! Per-mount runtime files (pid, log) outside the workspace and outside the mount:
//! `/run/intentfs/<mount>/` for root, `$XDG_RUNTIME_DIR/intentfs/<mount>/` otherwise.

use std::path::{Path, PathBuf};

/// The runtime directory of the mount at `mountpoint` (canonical path).
pub fn dir_for(mountpoint: &Path) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let base = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/run/intentfs")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(x).join("intentfs")
    } else {
        std::env::temp_dir().join(format!("intentfs-{}", unsafe { libc::geteuid() }))
    };
    let key: String = mountpoint
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    base.join(if key.is_empty() { "root".into() } else { key })
}

/// Create the runtime directory, private to the mount's owner.
pub fn create(mountpoint: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let d = dir_for(mountpoint);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&d)?;
    Ok(d)
}

/// Write the daemon's pid file and hold an exclusive `flock` on it for the daemon's life:
/// `intentfs umount` waits on the lock, which works also when the daemon runs in another pid
/// namespace (where the pid it writes means nothing to the caller). Keep the file open.
pub fn hold_pid_file(rt: &Path) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(rt.join("pid"))?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    f.set_len(0)?;
    writeln!(f, "{}", std::process::id())?;
    Ok(f)
}

/// Wait (at most `max`) until the daemon of the mount at `mountpoint` has exited: its pid
/// file is gone or no longer locked. True when it has.
pub fn wait_daemon_exit(mountpoint: &Path, max: std::time::Duration) -> bool {
    use std::os::fd::AsRawFd;
    let start = std::time::Instant::now();
    let Ok(f) = std::fs::File::open(dir_for(mountpoint).join("pid")) else {
        return true;
    };
    loop {
        // SAFETY: flock on an fd we own; released when `f` closes.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return true;
        }
        if start.elapsed() >= max {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// intentfs mounts listed in `/proc/self/mountinfo`: their mountpoints.
pub fn intentfs_mounts() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.split(" - ");
        let (Some(left), Some(right)) = (parts.next(), parts.next()) else {
            continue;
        };
        let mut r = right.split_whitespace();
        let fstype = r.next().unwrap_or("");
        let source = r.next().unwrap_or("");
        // Mounted directly by fuser the type is plain `fuse`; our fsname says `intentfs:`.
        if fstype != "fuse.intentfs" && !(fstype == "fuse" && source.starts_with("intentfs:")) {
            continue;
        }
        if let Some(mp) = left.split_whitespace().nth(4) {
            out.push(PathBuf::from(unescape(mp)));
        }
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Is `path` an intentfs mountpoint?
pub fn is_intentfs_mount(path: &Path) -> bool {
    intentfs_mounts().iter().any(|m| m == path)
}
