//! `intentfs run [--mount MOUNTPOINT] --intent ID | --intents IDS [--agent NAME]
//! [--user USER] -- CMD [ARGS...]`: ask the mount's daemon, over its owner-only control
//! socket, for an identity of its own; the daemon moves this process into it (a cgroup, or
//! the ancestry of this process); then start CMD inside it, under `--user` if given, and
//! exit with CMD's status.
//!
//! Only the mount's owner and root reach the control socket, so only the operator grants
//! identities; CMD and everything it starts stay in the identity whatever they do
//! (`setsid`, double forks, daemons), and select only among the intents granted here.

use std::ffi::CString;
use std::os::fd::BorrowedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use rustix::termios::Winsize;

use super::approvals::{socket_for, talk};
use super::runtime;
use crate::approval::socket::Request;
use crate::approval::{LessonRequest, RegisterRequest};

#[derive(clap::Args, Debug)]
#[command(after_long_help = "EXAMPLES:
  intentfs run --intent INT-001 --agent claude --user agent -- claude
  intentfs run --intents INT-001,INT-002 --agent codex --user agent -- codex
  intentfs run --mount /mnt/agent --intent INT-002 -- sh -c 'sed -i s/foo/bar/ docs/a.md'
  intentfs run --verify --intent INT-001 --user agent -- cargo test

Run it as the mount's owner (or root): identities are granted over the mount's control
socket, which only they can reach. With --user the command runs as that user, which is
how agents should run (docs/security.md). The identity lasts as long as any of its
processes.")]
pub struct RunArgs {
    /// The intentfs mount [default: the mount containing the current directory].
    #[arg(long, value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
    /// Lock the identity to this intent (selected from the start; it cannot switch).
    #[arg(long, value_name = "ID", conflicts_with = "intents")]
    pub intent: Option<String>,
    /// The intents the agent may select itself (`echo ID > .intentfs/intent`):
    /// comma-separated ids, or `all`. Without --intent or --intents the identity can select none
    /// (it may read, not change anything).
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub intents: Option<Vec<String>>,
    /// Refuse overwriting or deleting an existing file this identity never read (the
    /// mount's --require-read applies anyway).
    #[arg(long)]
    pub require_read: bool,
    /// CMD is a verification (tests, a build): when it fails, a lesson with the tail of its
    /// output is appended to the lessons file (CLAUDE.md, or the policy's `lessons_file`).
    #[arg(long)]
    pub verify: bool,
    /// Name recorded as the contributor.
    #[arg(long, value_name = "NAME", default_value = "agent")]
    pub agent: String,
    /// Run CMD as this user (name or uid) with its groups; needs root. HOME, USER and
    /// LOGNAME are set to the user's.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
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

/// The user CMD runs as: uid, gid, supplementary groups, home and name.
struct RunAs {
    uid: nix::unistd::Uid,
    gid: nix::unistd::Gid,
    groups: Vec<nix::unistd::Gid>,
    home: PathBuf,
    name: String,
}

fn run_as(spec: &str) -> anyhow::Result<RunAs> {
    use nix::unistd::{Uid, User};
    let user = match spec.parse::<u32>() {
        Ok(n) => User::from_uid(Uid::from_raw(n))?,
        Err(_) => User::from_name(spec)?,
    };
    let Some(u) = user else {
        // A bare uid without a passwd entry is still a user to run as.
        if let Ok(n) = spec.parse::<u32>() {
            return Ok(RunAs {
                uid: Uid::from_raw(n),
                gid: nix::unistd::Gid::from_raw(n),
                groups: Vec::new(),
                home: PathBuf::from("/"),
                name: spec.to_string(),
            });
        }
        bail!("--user {spec:?}: no such user\nhint: give a user name from /etc/passwd or a numeric uid");
    };
    let cname = CString::new(u.name.clone())?;
    let groups = nix::unistd::getgrouplist(&cname, u.gid).unwrap_or_else(|_| vec![u.gid]);
    Ok(RunAs {
        uid: u.uid,
        gid: u.gid,
        groups,
        home: u.dir,
        name: u.name,
    })
}

/// The signals `run` passes on to CMD when they are sent to `run` itself (SIGWINCH: the
/// terminal's new size, for CMD's pseudo-terminal).
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGWINCH,
];

/// How CMD meets the operator's terminal.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tty {
    /// As any child: same session, same terminal (CMD runs as the operator's own uid).
    Shared,
    /// A session of its own, without a controlling terminal (`--user`, output not to a
    /// terminal): it cannot push input into the operator's terminal (`TIOCSTI` needs it to
    /// be the controlling terminal).
    Detached,
    /// A pseudo-terminal of its own, relayed by `run` (`--user` on a terminal): CMD is
    /// interactive, and never holds the operator's terminal — not to inject keystrokes
    /// into it, nor to read what is typed there after it returns.
    Pty,
}

/// Standard stream `fd` (0, 1 or 2). Plain syscalls on it, no allocation: usable between
/// fork and exec.
fn std_fd(fd: i32) -> BorrowedFd<'static> {
    match fd {
        0 => rustix::stdio::stdin(),
        1 => rustix::stdio::stdout(),
        _ => rustix::stdio::stderr(),
    }
}

fn isatty(fd: i32) -> bool {
    rustix::termios::isatty(std_fd(fd))
}

/// The terminal size of standard stream `fd`, if it is a terminal.
fn winsize(fd: i32) -> Option<Winsize> {
    rustix::termios::tcgetwinsize(std_fd(fd)).ok()
}

/// Puts the operator's terminal in raw mode for a pseudo-terminal relay, and back when
/// dropped.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else {
            return RawMode(None);
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        let _ = tcsetattr(&stdin, SetArg::TCSANOW, &raw);
        RawMode(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                t,
            );
        }
    }
}

fn forwarded_set() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set
}

pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mp = find_mount(a.mount.clone())?;
    let sock = socket_for(&mp)?;
    let user = a.user.as_deref().map(run_as).transpose()?;
    let req = RegisterRequest {
        agent: a.agent.clone(),
        intent: a.intent.clone(),
        intents: a.intents.clone(),
        require_read: a.require_read,
        uid: user.as_ref().map(|u| u.uid.as_raw()),
    };
    // The daemon moves this very process into the new identity before it answers: CMD,
    // started next, is born inside it.
    let reg = match talk(&sock, &Request::Register(req)) {
        Ok(r) => r
            .registered
            .ok_or_else(|| anyhow!("the daemon granted no identity"))?,
        Err(e) => bail!(
            "the mount at {} gave {:?} no identity of its own: {e:#}\nhint: identities are \
             granted by the mount's owner (or root) over its control socket; run `intentfs run` \
             as that user, with --user to start the agent under another uid",
            mp.display(),
            a.cmd[0]
        ),
    };
    if reg.tracking == "ancestry" {
        // Orphans of CMD (daemonized, `setsid`-ed) are re-parented to this process instead
        // of init, so they stay descendants of the identity's anchor.
        nix::sys::prctl::set_child_subreaper(true).context("PR_SET_CHILD_SUBREAPER")?;
    }
    // Block the forwarded signals before any thread exists, so the forwarding thread
    // inherits the mask and receives them (std resets the child's mask at spawn).
    let set = forwarded_set();
    set.thread_block()
        .context("blocking the forwarded signals")?;
    // Blocked, they wait to be read here (by the forwarding thread below).
    let signals = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC).context("signalfd")?;
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]);
    let tty = match &user {
        None => Tty::Shared,
        Some(_) if !a.verify && (isatty(0) || isatty(1) || isatty(2)) => Tty::Pty,
        Some(_) => Tty::Detached,
    };
    let mut master = None;
    let mut master_winsize: Option<std::fs::File> = None;
    if tty == Tty::Pty {
        let size = winsize(0).or_else(|| winsize(1));
        let term = nix::sys::termios::tcgetattr(std::io::stdin()).ok();
        let pty = nix::pty::openpty(None, term.as_ref()).context("opening a pseudo-terminal")?;
        if let Some(ws) = size {
            // The size of the pair, set through the master before CMD starts.
            let _ = rustix::termios::tcsetwinsize(&pty.master, ws);
        }
        for fd in [&pty.master, &pty.slave] {
            // Neither end leaks into CMD but as its standard streams.
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )?;
        }
        // Each standard stream that is the operator's terminal becomes CMD's own terminal;
        // a pipe or a file stays as it is.
        let slave = || pty.slave.try_clone().map(std::process::Stdio::from);
        if isatty(0) {
            cmd.stdin(slave()?);
        }
        if isatty(1) {
            cmd.stdout(slave()?);
        }
        if isatty(2) {
            cmd.stderr(slave()?);
        }
        master = Some((pty.master, pty.slave));
    }
    // CMD starts with none of the forwarded signals blocked: they are blocked here only so
    // that this process reads them (and passes them on); left blocked in CMD, Ctrl-C, a
    // TERM or `timeout` would not stop the agent.
    // SAFETY: `pre_exec` is unsafe because the closure runs in the forked child of a
    // multithreaded process, where only async-signal-safe calls are allowed. It makes one
    // sigprocmask syscall with a set built before the fork.
    unsafe {
        let set = forwarded_set();
        cmd.pre_exec(move || {
            nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_UNBLOCK,
                Some(&set),
                None,
            )?;
            Ok(())
        });
    }
    if tty != Tty::Shared {
        // SAFETY: `pre_exec` is unsafe because the closure runs in the forked child of a
        // multithreaded process, where only async-signal-safe calls are allowed. It makes
        // three plain syscalls (setsid, isatty's TCGETS, TIOCSCTTY) on the standard fds,
        // without allocating or taking a lock.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::setsid()?;
                if tty == Tty::Pty {
                    // The pty is on fd 1 or 2 when not on 0: make it the controlling terminal
                    // through whichever standard fd is one.
                    let fd = (0..3).find(|fd| isatty(*fd)).unwrap_or(0);
                    rustix::process::ioctl_tiocsctty(std_fd(fd))?;
                }
                Ok(())
            });
        }
    }
    if let Some(u) = &user {
        cmd.env("HOME", &u.home)
            .env("USER", &u.name)
            .env("LOGNAME", &u.name);
        let (uid, gid, groups) = (u.uid, u.gid, u.groups.clone());
        // SAFETY: `pre_exec` is unsafe because the closure runs in the forked child of a
        // multithreaded process. It only makes the setgroups/setgid/setuid syscalls, on
        // values prepared before the fork (the group list is not reallocated).
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setgroups(&groups)?;
                nix::unistd::setgid(gid)?;
                nix::unistd::setuid(uid)?;
                Ok(())
            });
        }
    }
    if a.verify {
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code: u8 = match e.raw_os_error() {
                Some(libc::ENOENT) => 127,
                Some(libc::EPERM) if user.is_some() => {
                    eprintln!("intentfs run: --user needs root (or CAP_SETUID/CAP_SETGID): {e}");
                    return Ok(ExitCode::from(126));
                }
                _ => 126,
            };
            eprintln!("intentfs run: {}: {e}", a.cmd[0]);
            return Ok(ExitCode::from(code));
        }
    };
    let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let mut pumps = Vec::new();
    let mut raw = None;
    let mut pty_pump = None;
    if let Some((m, slave)) = master.take() {
        // The relay: what the operator types goes to CMD's terminal, what CMD writes comes
        // back (CMD's terminal joins its stdout and stderr).
        drop(slave);
        raw = isatty(0).then(RawMode::enter);
        let m = std::fs::File::from(m);
        let (m_in, m_win) = (m.try_clone()?, m.try_clone()?);
        if isatty(0) {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin(), &mut &m_in);
            });
        }
        pty_pump = Some(pump(m, std::io::stdout(), captured.clone()));
        master_winsize = Some(m_win);
    }
    if let Some(out) = child.stdout.take() {
        pumps.push(pump(out, std::io::stdout(), captured.clone()));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(pump(err, std::io::stderr(), captured.clone()));
    }
    // Sharing our terminal, CMD gets the terminal's signals itself: only one sent to this
    // process alone (kill from a supervisor) is passed on. In a session of its own, every
    // one is; a new terminal size goes to its pseudo-terminal.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || loop {
        let info = match signals.read_signal() {
            Ok(Some(info)) => info,
            // Interrupted, or nothing yet: wait again.
            Ok(None) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!("reading the forwarded signals: {e}");
                return;
            }
        };
        let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
            continue;
        };
        if sig == Signal::SIGWINCH {
            if let (Some(m), Some(ws)) = (&master_winsize, winsize(0).or_else(|| winsize(1))) {
                let _ = rustix::termios::tcsetwinsize(m, ws);
            }
            continue;
        }
        if tty != Tty::Shared || matches!(info.ssi_code, libc::SI_USER | libc::SI_QUEUE) {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    });
    let status = child.wait()?;
    if reg.tracking == "ancestry" {
        // The identity is anchored here: stay until every process of it has ended.
        while nix::sys::wait::wait().is_ok() {}
    }
    for p in pumps {
        let _ = p.join();
    }
    if let Some(p) = pty_pump {
        // Until CMD's terminal is closed by its last process, or briefly: a daemon it left
        // holding the terminal loses it when this process exits (the pty hangs up).
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while !p.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    drop(raw);
    if a.verify && !status.success() {
        let output =
            String::from_utf8_lossy(&captured.lock().map(|b| b.clone()).unwrap_or_default())
                .into_owned();
        let lesson = LessonRequest {
            identity: reg.identity.clone(),
            command: a.cmd.join(" "),
            status: status.code().unwrap_or(128 + status.signal().unwrap_or(0)),
            output,
        };
        match talk(&sock, &Request::Lesson(lesson)) {
            Ok(r) => eprintln!(
                "intentfs: verification failed; lesson recorded in {}",
                r.file.as_deref().unwrap_or("the lessons file")
            ),
            Err(e) => {
                eprintln!("intentfs: verification failed; could not record the lesson: {e:#}")
            }
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
