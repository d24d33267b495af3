//! `intentfs umount MOUNTPOINT`: unmount, then wait for the daemon to finish its ledger.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::runtime;

#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// The mountpoint to unmount.
    pub mountpoint: PathBuf,
    /// Detach even if busy (lazy unmount).
    #[arg(long, short = 'l')]
    pub lazy: bool,
}

/// Unmount `mp`: directly as root, else through `fusermount3 -u`.
pub fn unmount(mp: &std::path::Path, lazy: bool) -> anyhow::Result<()> {
    let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes())
        .context("mountpoint has a NUL byte")?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: valid C string.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EPERM) {
        let mut cmd = std::process::Command::new("fusermount3");
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        let st = cmd
            .arg(mp)
            .status()
            .context("running fusermount3 (install the fuse3 package)")?;
        if st.success() {
            return Ok(());
        }
        bail!("fusermount3 -u {} failed", mp.display());
    }
    if err.raw_os_error() == Some(libc::EBUSY) {
        bail!(
            "{} is busy: a process still uses it (see `fuser -vm {}`), or use --lazy",
            mp.display(),
            mp.display()
        );
    }
    bail!("cannot unmount {}: {err}", mp.display())
}

pub fn run(a: UmountArgs) -> anyhow::Result<ExitCode> {
    let mp = a
        .mountpoint
        .canonicalize()
        .with_context(|| format!("{}", a.mountpoint.display()))?;
    if !runtime::is_intentfs_mount(&mp) {
        bail!(
            "{} is not an intentfs mount\nhint: `grep intentfs /proc/mounts` lists them",
            mp.display()
        );
    }
    let pid = runtime::live_pid(&mp);
    unmount(&mp, a.lazy)?;
    // The daemon flushes and closes its ledger after the unmount: wait for it.
    if let Some(pid) = pid {
        let start = Instant::now();
        // SAFETY: signal 0 only checks for existence.
        while unsafe { libc::kill(pid, 0) } == 0 && start.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(ExitCode::SUCCESS)
}
