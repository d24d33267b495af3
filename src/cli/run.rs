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
    /// The intent to select for this identity (optional with --verify: the command then
    /// runs as the mount's default identity).
    #[arg(long, value_name = "ID", required_unless_present = "verify")]
    pub intent: Option<String>,
    /// Refuse overwriting or deleting an existing file this identity never read.
    #[arg(long)]
    pub require_read: bool,
    /// CMD is a verification (tests, a build): when it fails, a lesson with the tail of its
    /// output is appended to CLAUDE.md at the workspace root for the next agent session.
    #[arg(long)]
    pub verify: bool,
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
    if let Some(intent) = a
        .intent
        .as_deref()
        .filter(|i| !intents.lines().any(|l| l.split('\t').next() == Some(*i)))
    {
        bail!(
            "intent {:?} is not selectable on {}\nhint: selectable intents:\n{}",
            intent,
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
    let name = format!(
        "{}{}\n",
        a.agent,
        if a.require_read { " require-read" } else { "" }
    )
    .into_bytes();
    let intent = a.intent.as_ref().map(|i| format!("{i}\n").into_bytes());
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]);
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe syscalls (setsid, open, write, close) on pre-built buffers.
    unsafe {
        cmd.pre_exec(move || {
            let Some(intent) = &intent else { return Ok(()) };
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            raw_write(&session_path, &name)?;
            raw_write(&intent_path, intent)?;
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
    if a.verify {
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        // EPERM comes from the session registration in the child (exec says EACCES).
        Err(e) if a.intent.is_some() && e.raw_os_error() == Some(libc::EPERM) => bail!(
            "the mount at {} refused to give {:?} an identity of its own: the daemon cannot \
             see this process (it runs in another pid namespace, e.g. a sidecar container, \
             so the caller's pid is not visible to it)\n\
             hint: every process is then the mount's default identity; select the intent \
             with `echo ID > {}/intent` instead, or run one mount per agent container \
             (README: Containers)",
            mp.display(),
            a.cmd[0],
            ctl.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("starting {:?}", a.cmd[0])),
    };
    let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        pumps.push(pump(out, std::io::stdout(), captured.clone()));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(pump(err, std::io::stderr(), captured.clone()));
    }
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
    for p in pumps {
        let _ = p.join();
    }
    if a.verify && !status.success() {
        let output =
            String::from_utf8_lossy(&captured.lock().map(|b| b.clone()).unwrap_or_default())
                .into_owned();
        let lesson = serde_json::json!({
            "command": a.cmd.join(" "),
            "status": status.code().unwrap_or(128 + status.signal().unwrap_or(0)),
            "output": output,
            "intent": a.intent,
            "agent": a.agent,
        });
        match std::fs::write(ctl.join("lesson"), lesson.to_string()) {
            Ok(()) => eprintln!("intentfs: verification failed; lesson recorded in CLAUDE.md"),
            Err(e) => eprintln!("intentfs: verification failed; could not record the lesson: {e}"),
        }
    }
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(s)) => ExitCode::from(128u8.wrapping_add(s as u8)),
        _ => ExitCode::FAILURE,
    })
}

/// Copy a child's output stream to ours while keeping its last 64 KiB.
fn pump(
    mut from: impl std::io::Read + Send + 'static,
    mut to: impl std::io::Write + Send + 'static,
    keep: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let _ = to.write_all(&buf[..n]);
            let _ = to.flush();
            if let Ok(mut k) = keep.lock() {
                k.extend_from_slice(&buf[..n]);
                if k.len() > 64 * 1024 {
                    let cut = k.len() - 64 * 1024;
                    k.drain(..cut);
                }
            }
        }
    })
}
