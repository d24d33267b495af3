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
    use nix::mount::{umount2, MntFlags};
    let flags = if lazy {
        MntFlags::MNT_DETACH
    } else {
        MntFlags::empty()
    };
    let err = match umount2(mp, flags) {
        Ok(()) => return Ok(()),
        Err(e) => std::io::Error::from(e),
    };
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
    if let Err(e) = unmount(&mp, a.lazy) {
        // Busy because agents wait for a human: reject their requests and unmount as SIGTERM
        // does, through the daemon (which may run where no signal of ours reaches).
        let sock = super::approvals::socket_for(&mp)?;
        let pending = super::approvals::list_at(&sock)
            .map(|p| p.len())
            .unwrap_or(0);
        if a.lazy || pending == 0 {
            return Err(e);
        }
        eprintln!(
            "intentfs: {} has {pending} approval request(s) pending: rejecting them and unmounting",
            mp.display()
        );
        super::approvals::unmount_at(&sock)
            .with_context(|| format!("asking the daemon of {} to unmount", mp.display()))?;
        let start = Instant::now();
        while runtime::is_intentfs_mount(&mp) {
            if start.elapsed() > Duration::from_secs(15) {
                bail!(
                    "{} is still mounted 15 s after the daemon was asked to unmount\nhint: `intentfs umount --lazy {}`",
                    mp.display(),
                    mp.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The daemon flushes and closes its ledger after the unmount: wait for it.
    if !runtime::wait_daemon_exit(&mp, Duration::from_secs(15)) {
        eprintln!(
            "intentfs: unmounted {}, but its daemon is still finishing its ledger after 15 s",
            mp.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
