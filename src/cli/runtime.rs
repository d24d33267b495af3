//! Per-mount runtime files (control socket, pid, log) outside the workspace and outside the
//! mount: `/run/intentfs/<mount>/` for root, `$XDG_RUNTIME_DIR/intentfs/<mount>/` otherwise.
//!
//! The directory is the mount owner's private place: whoever can put files there receives
//! the owner's `intentfs approve` (the control socket) and chooses where the daemon writes.
//! So it is used only after checking it: the runtime directory and the mount's directory
//! in it must be directories (not symlinks) owned by the user, mode 0700, and every
//! directory above them owned by root or the user and not writable by others unless
//! sticky. Files in it are opened relative to the verified directory without following
//! symlinks. A directory that fails is refused with how to fix it, never "repaired".

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::{Flock, FlockArg};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The runtime directory of this user: where every mount's directory goes.
fn base_dir() -> PathBuf {
    let uid = nix::unistd::geteuid().as_raw();
    if uid == 0 {
        PathBuf::from("/run/intentfs")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        PathBuf::from(x).join("intentfs")
    } else {
        // Only after the checks below: another user may have made it first.
        std::env::temp_dir().join(format!("intentfs-{uid}"))
    }
}

/// The runtime directory of the mount at `mountpoint` (canonical path).
pub fn dir_for(mountpoint: &Path) -> PathBuf {
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
    base_dir().join(if key.is_empty() { "root".into() } else { key })
}

/// How to fix a runtime directory that fails the checks.
fn hint() -> &'static str {
    "hint: the runtime directory holds the mount's control socket, so it must be private to \
     the mount's owner. Set XDG_RUNTIME_DIR to a directory only you can write (e.g. \
     `export XDG_RUNTIME_DIR=/run/user/$(id -u)`), or remove the offending directory after \
     checking who made it"
}

/// Check one directory of the chain: `private` for the runtime directories themselves
/// (ours, 0700, not a symlink), otherwise a parent (root's or ours, not writable by others
/// unless sticky).
fn check_dir(d: &Path, private: bool, me: u32) -> Result<(), String> {
    let m = if private {
        std::fs::symlink_metadata(d)
    } else {
        std::fs::metadata(d)
    }
    .map_err(|e| format!("{}: {e}", d.display()))?;
    if private && m.file_type().is_symlink() {
        return Err(format!(
            "runtime directory {} is a symbolic link: refusing to use it\n{}",
            d.display(),
            hint()
        ));
    }
    if !m.is_dir() {
        return Err(format!("{} is not a directory\n{}", d.display(), hint()));
    }
    let mode = m.mode() & 0o7777;
    if private {
        if m.uid() != me {
            return Err(format!(
                "runtime directory {} belongs to uid {}, not to you (uid {me}): another user may \
                 have made it to take over this mount's control socket\n{}",
                d.display(),
                m.uid(),
                hint()
            ));
        }
        if mode & 0o077 != 0 {
            return Err(format!(
                "runtime directory {} has mode {mode:04o}; it must be 0700\n{}",
                d.display(),
                hint()
            ));
        }
    } else {
        if m.uid() != 0 && m.uid() != me {
            return Err(format!(
                "{} (above the runtime directory) belongs to uid {}, not to you or root\n{}",
                d.display(),
                m.uid(),
                hint()
            ));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(format!(
                "{} (above the runtime directory) has mode {mode:04o}: others can replace what \
                 is in it\n{}",
                d.display(),
                hint()
            ));
        }
    }
    Ok(())
}

/// Verify the runtime directory of a mount and everything above it (see the module doc).
pub fn verify(dir: &Path) -> Result<(), String> {
    let me = nix::unistd::geteuid().as_raw();
    let base = dir.parent().unwrap_or(dir);
    check_dir(dir, true, me)?;
    check_dir(base, true, me)?;
    let mut up = base.parent();
    while let Some(d) = up {
        check_dir(d, false, me)?;
        up = d.parent();
    }
    Ok(())
}

/// The verified runtime directory of a mount, held open: files are made in it relative to
/// this handle, never through a path a symlink could redirect.
pub struct RuntimeDir {
    /// Its path (for messages and for clients).
    pub path: PathBuf,
    fd: OwnedFd,
}

impl RuntimeDir {
    /// Open (creating, mode 0600) `name` in the directory, not following a symlink.
    pub fn open_file(&self, name: &str, append: bool) -> std::io::Result<std::fs::File> {
        let flags = libc::O_WRONLY
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_CLOEXEC
            | if append { libc::O_APPEND } else { 0 };
        let fd =
            crate::fs::sys::openat_mode(self.fd.as_fd(), std::ffi::OsStr::new(name), flags, 0o600)?;
        Ok(std::fs::File::from(fd))
    }

    /// A path to `name` through this process's handle of the directory (for `bind`).
    pub fn via_fd(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd()))
    }

    /// Remove `name` from the directory (not following symlinks).
    pub fn remove(&self, name: &str) {
        let _ = crate::fs::sys::unlink_at(self.fd.as_fd(), std::ffi::OsStr::new(name), false);
    }
}

/// Check what exists of the runtime directory of the mount at `mountpoint` (nothing is
/// made): a directory another user prepared is refused before anything else happens.
pub fn precheck(mountpoint: &Path) -> anyhow::Result<()> {
    let d = dir_for(mountpoint);
    let base = d.parent().unwrap_or(&d);
    let me = nix::unistd::geteuid().as_raw();
    let exists = |p: &Path| std::fs::symlink_metadata(p).is_ok();
    if exists(base) {
        check_dir(base, true, me).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    if exists(&d) {
        check_dir(&d, true, me).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// Create (or check) the runtime directory of the mount at `mountpoint`, private to the
/// mount's owner.
pub fn create(mountpoint: &Path) -> anyhow::Result<RuntimeDir> {
    let d = dir_for(mountpoint);
    let base = d.parent().unwrap_or(&d).to_path_buf();
    for dir in [&base, &d] {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir == &base => {
                anyhow::bail!(
                    "cannot create the runtime directory {}: {e} (the directory above it is missing)\n{}",
                    base.display(),
                    hint()
                );
            }
            Err(e) => anyhow::bail!("cannot create the runtime directory {}: {e}", dir.display()),
        }
    }
    verify(&d).map_err(|e| anyhow::anyhow!("{e}"))?;
    let fd = crate::fs::sys::open_dir_nofollow(&d)
        .map_err(|e| anyhow::anyhow!("opening the runtime directory {}: {e}", d.display()))?;
    // The handle must be the directory checked above (not one swapped in since).
    let st = crate::fs::sys::stat_fd(fd.as_fd())?;
    if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
        anyhow::bail!(
            "runtime directory {} changed while it was checked\n{}",
            d.display(),
            hint()
        );
    }
    Ok(RuntimeDir { path: d, fd })
}

/// Write the daemon's pid file and hold an exclusive `flock` on it for the daemon's life:
/// `intentfs umount` waits on the lock, which works also when the daemon runs in another pid
/// namespace (where the pid it writes means nothing to the caller). Keep the lock: dropping
/// it releases the lock and closes the file.
pub fn hold_pid_file(rt: &RuntimeDir) -> std::io::Result<Flock<std::fs::File>> {
    use std::io::Write;
    let f = rt.open_file("pid", false)?;
    let mut f = Flock::lock(f, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| std::io::Error::from(e))?;
    f.set_len(0)?;
    writeln!(&mut *f, "{}", std::process::id())?;
    Ok(f)
}

/// Wait (at most `max`) until the daemon of the mount at `mountpoint` has exited: its pid
/// file is gone or no longer locked. True when it has.
pub fn wait_daemon_exit(mountpoint: &Path, max: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    let dir = dir_for(mountpoint);
    if verify(&dir).is_err() {
        return true;
    }
    let Ok(mut f) = std::fs::File::open(dir.join("pid")) else {
        return true;
    };
    loop {
        // Released at once (the lock is dropped): only whether it could be taken matters.
        match Flock::lock(f, FlockArg::LockSharedNonblock) {
            Ok(_) => return true,
            Err((back, _)) => f = back,
        }
        if start.elapsed() >= max {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// intentfs mounts listed in `/proc/self/mountinfo`: their mountpoints.
pub fn intentfs_mounts() -> Vec<PathBuf> {
    mounts_with_sources()
        .into_iter()
        .map(|(mp, _)| mp)
        .collect()
}

/// intentfs mounts: (mountpoint, workspace), the workspace from the mount's source
/// (`intentfs:/path` as the daemon names it; the helper `mount -t fuse.intentfs` passes the
/// path itself).
pub fn mounts_with_sources() -> Vec<(PathBuf, PathBuf)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let unescape = crate::guard::tracking::unescape_mountinfo;
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
            let src = unescape(source);
            let ws = src.strip_prefix("intentfs:").unwrap_or(&src).to_string();
            out.push((PathBuf::from(unescape(mp)), PathBuf::from(ws)));
        }
    }
    out
}

/// `path` as a path in the backing workspace when it lies inside an intentfs mount (the
/// innermost), else as it is.
pub fn backing_path(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    mounts_with_sources()
        .into_iter()
        .filter(|(mp, _)| abs.starts_with(mp))
        .max_by_key(|(mp, _)| mp.components().count())
        .map(|(mp, ws)| ws.join(abs.strip_prefix(&mp).unwrap_or(Path::new(""))))
        .unwrap_or(abs)
}

/// The workspace that `dir` is in: `dir` (mapped from a mount to its workspace) or the
/// nearest directory above it holding a ledger (`.orchestration/agent_trace.jsonl`).
pub fn workspace_of(dir: &Path) -> Option<PathBuf> {
    let dir = backing_path(dir);
    dir.ancestors()
        .find(|d| crate::ledger::default_ledger_path(d).is_file())
        .map(Path::to_path_buf)
}

/// Is `path` an intentfs mountpoint?
pub fn is_intentfs_mount(path: &Path) -> bool {
    intentfs_mounts().iter().any(|m| m == path)
}
