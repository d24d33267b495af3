//! `intentfs run [--mount MOUNTPOINT] --intent ID [--agent NAME] -- CMD [ARGS...]`: start CMD
//! in a new POSIX session that the mount treats as an identity of its own, with the intent
//! handshake already done, and exit with CMD's status.

use std::ffi::CString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};

use super::runtime;

#[derive(clap::Args, Debug)]
#[command(after_long_help = "EXAMPLES:
  intentfs run --intent INT-001 --agent claude -- claude-code
  intentfs run --mount /mnt/agent --intent INT-002 -- sh -c 'sed -i s/foo/bar/ docs/a.md'")]
pub struct RunArgs {
    /// The intentfs mount [default: the mount containing the current directory].
    #[arg(long, value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
    /// The intent to select for this identity.
    #[arg(long, value_name = "ID")]
    pub intent: String,
    /// Name recorded as the contributor.
    #[arg(long, value_name = "NAME", default_value = "agent")]
    pub agent: String,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

fn find_mount(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(m) = explicit {
        let m = m.canonicalize().with_context(|| m.display().to_string())?;
        if !runtime::is_intentfs_mount(&m) {
            bail!("{} is not an intentfs mount", m.display());
        }
        return Ok(m);
    }
    let cwd = std::env::current_dir()?;
    runtime::intentfs_mounts()
        .into_iter()
        .filter(|m| cwd.starts_with(m))
        .max_by_key(|m| m.as_os_str().len())
        .ok_or_else(|| anyhow!("the current directory is not inside an intentfs mount\nhint: cd into the mount, or pass --mount MOUNTPOINT"))
}

/// Write `text` to a file with raw syscalls (async-signal-safe, for use after fork).
fn raw_write(path: &CString, text: &[u8]) -> std::io::Result<()> {
    // SAFETY: valid C string; open/write/close are async-signal-safe.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, text.as_ptr() as *const libc::c_void, text.len());
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        if n < 0 {
            return Err(e);
        }
    }
    Ok(())
}

pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mp = find_mount(a.mount)?;
    let ctl = mp.join(crate::control::DIR_NAME);
    // Check the intent before starting anything, for a clear error.
    let intents = std::fs::read_to_string(ctl.join("intents"))
        .with_context(|| format!("reading {}", ctl.join("intents").display()))?;
    if !intents
        .lines()
        .any(|l| l.split('\t').next() == Some(a.intent.as_str()))
    {
        bail!(
            "intent {:?} is not selectable on {}\nhint: selectable intents:\n{}",
            a.intent,
            mp.display(),
            intents
                .lines()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let session_path = CString::new(ctl.join("session").as_os_str().as_encoded_bytes())?;
    let intent_path = CString::new(ctl.join("intent").as_os_str().as_encoded_bytes())?;
    let name = format!("{}\n", a.agent).into_bytes();
    let intent = format!("{}\n", a.intent).into_bytes();
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]);
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe syscalls (setsid, open, write, close) on pre-built buffers.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            raw_write(&session_path, &name)?;
            raw_write(&intent_path, &intent)?;
            Ok(())
        });
    }
    // SAFETY: block the forwarded signals here before any thread exists, so the forwarding
    // thread inherits the mask and receives them through sigwait (std resets the child's mask).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", a.cmd[0]))?;
    // The child is in its own session, so terminal signals reach only us: forward them.
    let pid = child.id() as i32;
    std::thread::spawn(move || {
        // SAFETY: sigset operations on a local set, sigwait in this thread only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGHUP);
            loop {
                let mut sig = 0;
                if libc::sigwait(&set, &mut sig) == 0 {
                    libc::kill(-pid, sig);
                }
            }
        }
    });
    let status = child.wait()?;
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(s)) => ExitCode::from(128u8.wrapping_add(s as u8)),
        _ => ExitCode::FAILURE,
    })
}
