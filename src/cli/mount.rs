//! `intentfs mount [OPTIONS] WORKSPACE MOUNTPOINT`.
//!
//! Everything that can be wrong is checked before anything is mounted (workspace,
//! mountpoint, `/dev/fuse`, policy, `--intent`). Then, unless `--foreground`, the process
//! forks: the child mounts and serves, the parent returns once the mount is live — or
//! prints the child's error and fails.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::ForkResult;

use super::runtime;
use crate::approval::{Broker, BrokerConfig, Mode};
use crate::fs::recorder::RecordMode;
use crate::fs::{Fs, FsConfig};
use crate::fuse::{Data, MountSpec, Mounted, Transport};
use crate::guard::{Guard, Identities, Protected, Rules};
use crate::ledger::{Ledger, LedgerOptions};
use crate::policy::{IntentIgnore, Policy};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApproverArg {
    /// A desktop notification with Approve / Reject actions (and the CLI channel too).
    Desktop,
    /// `intentfs approvals` / `approve ID` / `reject ID` from any terminal of the mount's owner.
    Cli,
    /// Refuse every request that needs a human at once (unattended runs).
    Deny,
    /// Allow every request that needs a human at once (unattended, trusted runs only).
    Allow,
}

#[derive(clap::Args, Debug)]
#[command(after_long_help = "EXAMPLES:
  intentfs mount --intent INT-001 --agent claude ./project /mnt/agent
  intentfs mount --policy team.yaml --foreground ./project /mnt/agent
  intentfs umount /mnt/agent

Agents select an intent through the mount itself:
  cat /mnt/agent/.intentfs/intents          # what can be selected
  echo INT-001 > /mnt/agent/.intentfs/intent
  cat /mnt/agent/.intentfs/context          # paste into the agent's prompt
  cat /mnt/agent/.intentfs/last_error       # why the last operation was refused")]
pub struct MountArgs {
    /// The real directory to govern (the backing directory).
    pub workspace: PathBuf,
    /// An empty directory where agents will work.
    pub mountpoint: PathBuf,
    /// Policy file [default: WORKSPACE/.orchestration/active_intents.yaml].
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Ledger file [default: WORKSPACE/.orchestration/agent_trace.jsonl].
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// Select this intent for the mount's default identity.
    #[arg(long, value_name = "ID")]
    pub intent: Option<String>,
    /// The intents the default identity may select, comma-separated, or `all` [default:
    /// all]. `--intents INT-001` alone selects and locks it: the right shape for one agent
    /// per mount (e.g. an agent container), which then cannot widen its own scope.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub intents: Option<Vec<String>>,
    /// Name recorded as the contributor for the default identity.
    #[arg(long, value_name = "NAME", default_value = "agent")]
    pub agent: String,
    /// Let other users (containers, agents under another uid) use the mount.
    /// Non-root owners need `user_allow_other` in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
    /// Who answers when the policy says `ask` (out-of-scope writes, sensitive reads,
    /// deletes) [default: desktop when a D-Bus session bus is reachable; else deny, since
    /// nobody would see the request: choose cli to answer with `intentfs approve`].
    #[arg(long, value_enum)]
    pub approver: Option<ApproverArg>,
    /// Circuit breaker: an identity refused this many times within --breaker-window trips
    /// (all its mutations refused with CIRCUIT_OPEN until `intentfs reset`); 0 disables it.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub breaker: usize,
    /// Circuit breaker window, in seconds.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub breaker_window: u64,
    /// Refuse overwriting or deleting an existing file that the identity never read.
    #[arg(long)]
    pub require_read: bool,
    /// Stay attached to the terminal instead of daemonizing; Ctrl-C unmounts.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// FUSE worker threads.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub threads: usize,
    /// While requests arrive, keep idle CPUs polling instead of halting (a 0 µs CPU
    /// latency request on /dev/cpu_dma_latency, dropped 50 ms after the last request).
    /// Each request wakes two threads; on VMs a halted vCPU is slow to wake, and this
    /// cuts a request's round trip by about a third there, for CPU time spent polling.
    /// Needs root.
    #[arg(long)]
    pub low_latency: bool,
    /// How requests travel between the kernel and the daemon: `dev-fuse` or `dev`
    /// (read/write on /dev/fuse), `io-uring` (FUSE-over-io_uring: needs Linux 6.14+ with the
    /// `fuse` module's `enable_uring` set; the mount fails without it) or `auto` (io-uring when
    /// the kernel offers it, else dev-fuse, the log saying why). The daemon log names the
    /// one in use. INTENTFS_TRANSPORT sets it too (to run a whole test suite over the ring).
    /// `auto` by default: where root has not set `enable_uring` (it is off unless set)
    /// nothing changes, and where it is set the ring serves the same operations (the whole
    /// suite passes over it) about twice as fast for metadata.
    #[arg(
        long,
        value_enum,
        default_value_t = Transport::Auto,
        value_name = "T",
        env = "INTENTFS_TRANSPORT"
    )]
    pub transport: Transport,
    /// How regular files' reads and writes travel: `daemon` (each read and write is a
    /// request the daemon checks and hashes as it goes) or `passthrough` (the kernel reads
    /// and writes the backing file itself, Linux 6.9+: governance of data is decided at
    /// open and recorded at close; another identity's write open is refused while one
    /// holds the file open for writing, WRITE_LEASED; an intent switch is refused while
    /// the identity holds files open for writing, WRITES_OPEN). See docs/passthrough.md.
    /// INTENTFS_DATA sets it too.
    #[arg(
        long,
        value_enum,
        default_value_t = Data::Daemon,
        value_name = "MODE",
        env = "INTENTFS_DATA"
    )]
    pub data: Data,
    /// When the entry of a file's close is written: `sync` (before `close()` returns: a
    /// returned close is on record, even if the daemon is killed right after) or `async`
    /// (right after the reply, in order, by a thread of its own: `close()` does not wait
    /// for the hash, the kept version and the entry; mode, owner and xattr changes are
    /// recorded after their reply too; a later change of the same file waits for its
    /// entry; a daemon killed with entries queued, at most 256, loses them, and `intentfs
    /// ledger verify` reports the closes among them as drift; the entries queued never take
    /// more than the ledger's reserve on disk can hold: past that, a change is recorded
    /// before its reply). See docs/ledger.md.
    /// INTENTFS_RECORD sets it too.
    #[arg(
        long,
        value_enum,
        default_value_t = RecordMode::Sync,
        value_name = "WHEN",
        env = "INTENTFS_RECORD"
    )]
    pub record: RecordMode,
    /// Daemon log file [default: the mount's runtime directory, /run/intentfs/...].
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Export every ledger entry as an OpenTelemetry log record over OTLP/HTTP to ENDPOINT
    /// (the collector's base URL, e.g. http://localhost:4318), from a thread of its own: a
    /// slow or dead collector never slows the filesystem (records are dropped and counted
    /// in .intentfs/status). Also on when OTEL_EXPORTER_OTLP_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_LOGS_ENDPOINT is set; see docs/telemetry.md.
    #[arg(long, value_name = "ENDPOINT")]
    pub otlp: Option<String>,
    /// The content store, where every version of every changed file is kept (created
    /// 0700) [default: WORKSPACE/.orchestration/objects]. Outside the workspace, or
    /// under its `.orchestration/`; never visible through the mount. What is kept is the
    /// policy's `versions:` section; `intentfs gc` applies retention.
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

impl MountArgs {
    /// Defaults for `intentfs demo`.
    pub fn for_demo(workspace: PathBuf, mountpoint: PathBuf, foreground: bool) -> MountArgs {
        MountArgs {
            workspace,
            mountpoint,
            policy: None,
            ledger: None,
            intent: None,
            intents: None,
            agent: "demo-agent".into(),
            allow_other: false,
            approver: None,
            require_read: false,
            breaker: 20,
            breaker_window: 60,
            foreground,
            threads: 4,
            low_latency: false,
            transport: Transport::Auto,
            data: Data::Daemon,
            record: RecordMode::Sync,
            log: None,
            otlp: None,
            store: None,
        }
    }
}

/// Everything validated, ready to mount.
struct Plan {
    workspace: PathBuf,
    mountpoint: PathBuf,
    policy_path: PathBuf,
    ledger_path: PathBuf,
    /// The content store's directory.
    store_dir: PathBuf,
    policy: Policy,
    ignore: IntentIgnore,
    /// The policy's and `.intentignore`'s stamps before they were read: any change after
    /// that reloads them (taken by the policy watcher when its thread first ran, a change
    /// made right after the mount came up could be missed for good).
    loaded_stamps: Stamps,
    /// Where the ledger is exported live over OTLP, if anywhere.
    otlp: Option<crate::telemetry::Config>,
    args: MountArgs,
}

fn validate(a: MountArgs) -> anyhow::Result<(Plan, runtime::RuntimeDir)> {
    let workspace = a.workspace.canonicalize().map_err(|e| {
        anyhow!(
            "workspace {}: {e}\nhint: create it first, or check the path",
            a.workspace.display()
        )
    })?;
    if !workspace.is_dir() {
        bail!("workspace {} is not a directory", workspace.display());
    }
    let mountpoint = a.mountpoint.canonicalize().map_err(|e| {
        if is_dead_mount(&e) {
            return anyhow!(
                "mountpoint {} is a dead FUSE mount: its daemon is gone (killed, or crashed), and the \
                 mount was left behind\nhint: intentfs umount --lazy {p} (or umount -l {p}), then mount again",
                a.mountpoint.display(),
                p = a.mountpoint.display()
            );
        }
        anyhow!(
            "mountpoint {}: {e}\nhint: mkdir -p {}",
            a.mountpoint.display(),
            a.mountpoint.display()
        )
    })?;
    match std::fs::metadata(&mountpoint) {
        Err(e) if is_dead_mount(&e) => bail!(
            "mountpoint {p} is a dead FUSE mount: its daemon is gone (killed, or crashed), and the \
             mount was left behind\nhint: intentfs umount --lazy {p} (or umount -l {p}), then mount again",
            p = mountpoint.display()
        ),
        Ok(m) if m.is_dir() => {}
        _ => bail!("mountpoint {} is not a directory", mountpoint.display()),
    }
    if runtime::is_intentfs_mount(&mountpoint) {
        bail!(
            "{} is already an intentfs mount\nhint: intentfs umount {}",
            mountpoint.display(),
            mountpoint.display()
        );
    }
    if std::fs::read_dir(&mountpoint)
        .map(|mut d| d.next().is_some())
        .unwrap_or(true)
    {
        bail!(
            "mountpoint {} is not an empty directory\nhint: mount onto a new empty directory",
            mountpoint.display()
        );
    }
    if mountpoint.starts_with(&workspace) || workspace.starts_with(&mountpoint) {
        bail!(
            "the mountpoint {} and the workspace {} must not contain each other",
            mountpoint.display(),
            workspace.display()
        );
    }
    // The runtime directory (control socket, pid, log) is checked first: one another user
    // made is refused here, with how to fix it.
    runtime::precheck(&mountpoint)?;
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        bail!("cannot open /dev/fuse: {e}\nhint: load the fuse module (modprobe fuse) and install fuse3; in a container pass --device /dev/fuse");
    }
    if a.low_latency {
        if let Err(e) = std::fs::OpenOptions::new()
            .write(true)
            .open(crate::latency::DEVICE)
        {
            bail!(
                "--low-latency: cannot open {}: {e}\nhint: it needs root (the CPU latency request is system-wide); mount without --low-latency",
                crate::latency::DEVICE
            );
        }
    }
    let policy_path = a
        .policy
        .clone()
        .unwrap_or_else(|| workspace.join(".orchestration/active_intents.yaml"));
    let loaded_stamps = (stamp(&policy_path), stamp(&workspace.join(".intentignore")));
    let policy = Policy::load(&policy_path).map_err(|e| anyhow!("{e}"))?;
    let ignore = IntentIgnore::load(&workspace).map_err(|e| anyhow!("{e}"))?;
    if let Some(id) = &a.intent {
        match policy.intent(id) {
            None => {
                let ids: Vec<_> = policy
                    .intents()
                    .iter()
                    .filter(|i| i.selectable())
                    .map(|i| i.id.clone())
                    .collect();
                bail!(
                    "--intent {id:?} is not in {}\nhint: selectable intents: {}",
                    policy_path.display(),
                    if ids.is_empty() {
                        "(none)".into()
                    } else {
                        ids.join(", ")
                    }
                );
            }
            Some(it) if !it.selectable() => {
                bail!("--intent {id} is {:?}, not IN_PROGRESS\nhint: set its status to IN_PROGRESS in the policy", it.status)
            }
            Some(_) => {}
        }
    }
    for id in a.intents.iter().flatten().filter(|i| *i != "all") {
        if policy.intent(id).is_none() {
            bail!(
                "--intents: {id:?} is not in {}\nhint: intents of the policy: {}",
                policy_path.display(),
                policy
                    .intents()
                    .iter()
                    .map(|i| i.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if let (Some(id), Some(allowed)) = (&a.intent, &a.intents) {
        if !allowed.iter().any(|x| x == id || x == "all") {
            bail!(
                "--intent {id} is not among --intents {}\nhint: add it to --intents",
                allowed.join(",")
            );
        }
    }
    let ledger_path = a
        .ledger
        .clone()
        .unwrap_or_else(|| crate::ledger::default_ledger_path(&workspace));
    // Checked here, before anything is mounted: a mistyped endpoint or protocol is told to
    // the person mounting, not only to the daemon log.
    let otlp = match &a.otlp {
        Some(ep) => Some(crate::telemetry::Config::from_env(Some(ep)).context("--otlp")?),
        None if crate::telemetry::wanted_by_env() => Some(
            crate::telemetry::Config::from_env(None)
                .context("OTEL_EXPORTER_OTLP_* (live export)")?,
        ),
        None => None,
    };
    let store_dir = store_dir(a.store.as_deref(), &workspace, &mountpoint)?;
    let rt = runtime::create(&mountpoint)?;
    Ok((
        Plan {
            otlp,
            workspace,
            mountpoint,
            policy_path,
            ledger_path,
            store_dir,
            policy,
            ignore,
            loaded_stamps,
            args: a,
        },
        rt,
    ))
}

/// Where the content store goes: `--store` made absolute, or the default. Inside the
/// workspace only under `.orchestration/`, which the mount protects (an agent could
/// otherwise rename the directory holding it, or fill its name first); never inside the
/// mountpoint (the daemon would write through itself).
fn store_dir(arg: Option<&Path>, workspace: &Path, mountpoint: &Path) -> anyhow::Result<PathBuf> {
    let Some(arg) = arg else {
        return Ok(crate::store::Store::default_dir(workspace));
    };
    let abs = if arg.is_absolute() {
        arg.to_path_buf()
    } else {
        std::env::current_dir()
            .context("cannot read the current directory")?
            .join(arg)
    };
    // Resolve what exists of it (symlinks, `..`), keep the rest as given.
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(p), Some(n)) => {
                rest.push(n.to_owned());
                existing = p.to_path_buf();
            }
            _ => break,
        }
    }
    let mut full = existing.canonicalize().unwrap_or(existing);
    for n in rest.iter().rev() {
        if n == ".." || n == "." {
            bail!(
                "--store {}: give a path without `.` or `..` components",
                arg.display()
            );
        }
        full.push(n);
    }
    if full.starts_with(mountpoint) {
        bail!(
            "--store {} is inside the mountpoint {}\nhint: put the store outside the mount (the default is WORKSPACE/.orchestration/objects)",
            arg.display(),
            mountpoint.display()
        );
    }
    if full.starts_with(workspace) && !full.starts_with(workspace.join(".orchestration")) {
        bail!(
            "--store {} is inside the workspace but not under its .orchestration/: agents could reach it through the mount\nhint: put it outside the workspace, or under {}/ (omit --store for the default, {})",
            arg.display(),
            workspace.join(".orchestration").display(),
            crate::store::Store::default_dir(workspace).display()
        );
    }
    Ok(full)
}

/// `.orchestration/.gitignore` ignoring everything in it (itself included), unless one is
/// there: the ledger, its head and the intent map are the daemon's, not the project's, and
/// `git add -A` must not commit them (tracked files there, like a policy, stay tracked).
fn ignore_orchestration(workspace: &Path) {
    let dir = workspace.join(".orchestration");
    let f = dir.join(".gitignore");
    if dir.is_dir() && std::fs::symlink_metadata(&f).is_err() {
        if let Err(e) = std::fs::write(
            &f,
            "# Written by intentfs: the audit ledger, its head and the intent map are not for commits.\n*\n",
        ) {
            tracing::warn!("{}: {e}", f.display());
        }
    }
}

/// What the user must know about approvals before agents start: with no `--approver` and no
/// desktop session, requests the policy asks a human about are refused at once.
fn approver_notice(plan: &Plan) -> Option<String> {
    if plan.args.approver.is_some() || crate::approval::desktop_available() {
        return None;
    }
    let a = plan.policy.approval();
    let asks = a.out_of_scope == crate::policy::OutOfScope::Ask
        || a.sensitive_read == crate::policy::SensitiveRead::Ask
        || a.delete == crate::policy::DeleteRule::Ask;
    asks.then(|| {
        "intentfs: no desktop session to show approval prompts: what the policy asks a human \
         about (sensitive reads, and out-of-scope writes or deletes where it says `ask`) is \
         refused at once.\n  hint: to answer from a terminal instead, mount with --approver cli \
         and use `intentfs approvals` / `intentfs approve ID` (a request then waits up to the \
         policy's timeout)"
            .to_string()
    })
}

/// The policy and ledger files count as protected when they live inside the workspace.
fn protected_extra(plan: &Plan) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let head = crate::ledger::writer::head_path(&plan.ledger_path);
    for p in [&plan.policy_path, &plan.ledger_path, &head] {
        let abs = if p.is_absolute() {
            p.clone()
        } else {
            std::env::current_dir().unwrap_or_default().join(p)
        };
        let abs = abs
            .parent()
            .and_then(|d| d.canonicalize().ok())
            .map(|d| d.join(abs.file_name().unwrap_or_default()))
            .unwrap_or(abs);
        if let Ok(rel) = abs.strip_prefix(&plan.workspace) {
            v.push(rel.to_path_buf());
        }
    }
    v
}

fn load_rules(policy_path: &Path, workspace: &Path, extra: &[PathBuf]) -> Result<Rules, String> {
    let policy = Policy::load(policy_path).map_err(|e| e.to_string())?;
    let ignore = IntentIgnore::load(workspace).map_err(|e| e.to_string())?;
    Ok(Rules {
        policy,
        ignore,
        protected: Protected::new(extra),
    })
}

/// Why the workspace looks writable by users other than the mount's owner, if it does: a
/// directory from the workspace up to `/` that is writable by group or others (a sticky
/// parent such as `/tmp` excepted: others cannot replace what they do not own there), or
/// owned by a uid other than `owner` and root. With `--allow-other` such users may be the
/// very agents the mount governs, and writing the workspace directly bypasses intentfs.
/// (Only these directories are checked, not the tree below the workspace.)
fn backing_exposure(workspace: &Path, owner: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mut dir = Some(workspace);
    while let Some(d) = dir {
        if let Ok(m) = std::fs::metadata(d) {
            let mode = m.mode() & 0o7777;
            if m.uid() != owner && m.uid() != 0 {
                return Some(format!("{} is owned by uid {}", d.display(), m.uid()));
            }
            let sticky_parent = d != workspace && mode & 0o1000 != 0;
            if mode & 0o022 != 0 && !sticky_parent {
                let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
                    (true, true) => "group and others",
                    (true, false) => "its group",
                    _ => "others",
                };
                return Some(format!(
                    "{} has mode {mode:04o}: writable by {who}",
                    d.display()
                ));
            }
        }
        dir = d.parent();
    }
    None
}

pub fn run(a: MountArgs) -> anyhow::Result<ExitCode> {
    let (plan, rt) = validate(a)?;
    if plan.args.allow_other {
        if let Some(why) = backing_exposure(&plan.workspace, nix::unistd::geteuid().as_raw()) {
            eprintln!(
                "warning: {} is writable by other users; agents sharing this mount could bypass \
                 intentfs by writing it directly (see mount/containers.md)\n  ({why})",
                plan.workspace.display()
            );
        }
    }
    if let Some(w) = super::check_policy::tracked_sensitive_warning(&plan.workspace, &plan.policy) {
        eprintln!("{w}");
    }
    if let Some(n) = approver_notice(&plan) {
        eprintln!("{n}");
    }
    if plan.args.foreground {
        init_logging(None);
        serve(plan, &rt, None)?;
        return Ok(ExitCode::SUCCESS);
    }
    let log = plan
        .args
        .log
        .clone()
        .unwrap_or_else(|| rt.path.join("daemon.log"));
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
    // SAFETY: fork is unsafe because the child of a multithreaded process may only make
    // async-signal-safe calls until it execs. This process has one thread here: nothing
    // has been spawned yet (the broker, ledger and FUSE threads start in `serve`, after the
    // fork), so the child is a full copy and may allocate, log and spawn as it likes.
    match unsafe { nix::unistd::fork() }.context("fork")? {
        ForkResult::Child => {
            drop(rd);
            // Detach from the terminal's session. It cannot fail here: a forked child is
            // never a process group leader.
            let _ = nix::unistd::setsid();
            // The default log is opened in the verified runtime directory, not by path.
            let logf = match &plan.args.log {
                Some(p) => std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p),
                None => rt.open_file("daemon.log", true),
            };
            redirect_stdio(logf.ok());
            init_logging(Some(&log));
            // A duplicate keeps a way to report errors after `serve` consumed the original.
            let ready = std::fs::File::from(wr);
            let mut report = ready.try_clone().ok();
            match serve(plan, &rt, Some(ready)) {
                Ok(()) => std::process::exit(0),
                Err(e) => {
                    if let Some(r) = report.as_mut() {
                        let _ = writeln!(r, "ERR {e:#}");
                    }
                    tracing::error!("{e:#}");
                    std::process::exit(1)
                }
            }
        }
        ForkResult::Parent { .. } => {
            drop(wr);
            // "WARN ..." lines for the user, then one line: "OK" once the mount serves, or
            // "ERR ..."; EOF if the child died.
            let mut reader = std::io::BufReader::new(std::fs::File::from(rd));
            let mut msg = String::new();
            loop {
                msg.clear();
                if reader.read_line(&mut msg).unwrap_or(0) == 0 {
                    break;
                }
                match msg.strip_prefix("WARN ") {
                    Some(w) => eprintln!("warning: {}", w.trim_end()),
                    None => break,
                }
            }
            if let Some(m) = msg.strip_prefix("OK") {
                let _ = m;
                Ok(ExitCode::SUCCESS)
            } else if let Some(e) = msg.strip_prefix("ERR ") {
                bail!("{}", e.trim_end())
            } else {
                bail!(
                    "the mount daemon exited before the mount was ready; see {}",
                    log.display()
                )
            }
        }
    }
}

fn redirect_stdio(logf: Option<std::fs::File>) {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    if let Ok(n) = &null {
        let _ = nix::unistd::dup2_stdin(n);
    }
    if let Some(l) = &logf {
        let _ = nix::unistd::dup2_stdout(l);
        let _ = nix::unistd::dup2_stderr(l);
    }
}

fn init_logging(_log: Option<&Path>) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INTENTFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// Block the termination signals in this thread (and every thread spawned after), so one
/// thread can wait for them with `sigwait`.
fn block_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    if let Err(e) = set.thread_block() {
        tracing::warn!("blocking the termination signals: {e}");
    }
    set
}

/// Mount, signal readiness, serve until unmounted, then close the ledger.
fn serve(plan: Plan, rt: &runtime::RuntimeDir, ready: Option<std::fs::File>) -> anyhow::Result<()> {
    let sigset = block_signals();
    let limit = crate::fs::sys::raise_nofile_limit();
    // Keep half the descriptors for open files; the rest for node handles.
    let fd_cap = ((limit as usize) / 2).clamp(256, 100_000);
    let extra = protected_extra(&plan);
    if let Some(dir) = plan.ledger_path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // The content store exists before the mount serves (its directory is hidden by
    // inode), and before the ledger: the ledger's group commit makes the store's new
    // objects durable before the entries naming them (see `store::Store::sync`).
    let store = Arc::new(crate::store::Store::open(&plan.store_dir).map_err(|e| {
        anyhow!("content store: {e}\nhint: give --store DIR on a writable filesystem")
    })?);
    store.defer_sync();
    store.use_packs();
    // Leftovers of puts a killed daemon interrupted (an hour old: not a put running now).
    let _ = store.sweep_temps(Duration::from_secs(3600));
    let synced = store.clone();
    let (ledger, report) = Ledger::open(
        &plan.ledger_path,
        LedgerOptions {
            workspace: Some(plan.workspace.clone()),
            before_sync: Some(crate::ledger::BeforeSync(Arc::new(move || {
                if let Err(e) = synced.sync() {
                    tracing::warn!("content store: syncfs: {e}");
                }
            }))),
            ..Default::default()
        },
    )
    .map_err(|e| anyhow!("ledger {}: {e}", plan.ledger_path.display()))?;
    // Where this daemon's entries begin (nothing of its own is written yet): the live OTLP
    // export starts there.
    let otlp_from = std::fs::metadata(&plan.ledger_path).map_or(0, |m| m.len());
    // What is wrong with the ledger goes to the log and to the person mounting.
    let mut warnings = Vec::new();
    if let Some(r) = &report.repaired_torn_tail {
        warnings.push(format!(
            "ledger {}: repaired a torn last line: {r}",
            plan.ledger_path.display()
        ));
    }
    for f in &report.chain_findings {
        warnings.push(format!(
            "ledger {}: line {}: {} (run `intentfs ledger verify`)",
            plan.ledger_path.display(),
            f.line,
            f.message
        ));
    }
    for w in &warnings {
        tracing::warn!("{w}");
    }
    ignore_orchestration(&plan.workspace);
    let guard = Arc::new(Guard::new(Rules {
        policy: plan.policy,
        ignore: plan.ignore,
        protected: Protected::new(&extra),
    }));
    let default_intents = match (&plan.args.intents, &plan.args.intent) {
        (Some(v), _) if v.iter().any(|x| x == "all") => crate::guard::Intents::All,
        (Some(v), _) if v.len() == 1 => crate::guard::Intents::Locked(v[0].clone()),
        (Some(v), _) => crate::guard::Intents::Among(v.clone()),
        (None, _) => crate::guard::Intents::All,
    };
    let ids = Arc::new(Identities::new(
        plan.args.agent.clone(),
        default_intents,
        plan.args.require_read,
        Some(&crate::guard::tracking::cgroup_name(&plan.mountpoint)),
    ));
    if let Some(i) = &plan.args.intent {
        *ids.default_identity().intent.lock() = Some(i.clone());
    }
    let cfg = FsConfig {
        workspace: plan.workspace.clone(),
        mountpoint: plan.mountpoint.clone(),
        policy_path: plan.policy_path.clone(),
        fd_cap,
    };
    let mode = match plan.args.approver {
        Some(ApproverArg::Desktop) => Mode::Desktop,
        Some(ApproverArg::Cli) => Mode::Cli,
        Some(ApproverArg::Deny) => Mode::Deny,
        Some(ApproverArg::Allow) => Mode::Allow,
        None if crate::approval::desktop_available() => Mode::Desktop,
        // Nobody would see a request: refused at once, not after the whole timeout for
        // every sensitive read (the mount says so at start, see `approver_notice`).
        None => Mode::Deny,
    };
    // The broker always runs: its socket also serves `intentfs reset` and `approvals`.
    let broker = Broker::start(BrokerConfig {
        mode,
        timeout: Duration::from_secs(guard.rules().policy.approval().timeout_s),
        // Bound through the verified directory's handle: no path a symlink could redirect.
        socket_path: Some(rt.via_fd(super::approvals::SOCKET_NAME)),
        owner_uid: nix::unistd::getuid().as_raw(),
        mountpoint: plan.mountpoint.clone(),
        workspace: plan.workspace.clone(),
    })
    .context("starting the approval broker")?;
    {
        let ids = ids.clone();
        broker.set_reset_hook(Box::new(move |key| match ids.by_key(key) {
            Some(i) => {
                i.reset_breaker();
                tracing::info!("circuit breaker of {key} reset by a human");
                true
            }
            None => false,
        }));
    }
    tracing::info!("approvals: {mode:?}");
    let mut fs = Fs::new(cfg, guard.clone(), ids.clone(), Some(ledger.clone()))?;
    // The live OTLP export follows the ledger from here (the MOUNT entry on): a thread that
    // reads what the writer appended, never in a request's way.
    let otlp = match plan.otlp.clone() {
        Some(cfg) => {
            let f = crate::telemetry::Follower::start(
                cfg,
                &plan.ledger_path,
                otlp_from,
                &plan.workspace,
            )
            .context("starting the OTLP export")?;
            let _ = fs.otlp.set(f.stats());
            Some(f)
        }
        None => None,
    };
    fs.set_store(store)
        .with_context(|| format!("content store {}", plan.store_dir.display()))?;
    fs.gate.approver = match mode {
        Mode::Deny => crate::fs::approve::Approver::Deny,
        Mode::Allow => crate::fs::approve::Approver::Allow,
        Mode::Desktop | Mode::Cli => crate::fs::approve::Approver::Human(broker.clone()),
    };
    fs.gate.breaker = crate::guard::identity::Breaker {
        limit: plan.args.breaker,
        window: Duration::from_secs(plan.args.breaker_window),
    };
    if plan.args.low_latency {
        let ll = crate::latency::LowLatency::start()
            .map_err(|e| anyhow!("--low-latency: {}: {e}", crate::latency::DEVICE))?;
        let _ = fs.low_latency.set(ll);
    }
    let fs = Arc::new(fs);
    if plan.args.record == RecordMode::Async {
        fs.start_recorder()
            .map_err(|e| anyhow!("--record async: cannot start the recorder thread: {e}"))?;
    }
    tracing::info!("record: {}", plan.args.record.name());
    let fs_weak = Arc::downgrade(&fs);
    spawn_temp_sweeper(Arc::downgrade(&fs));
    broker.set_operator(Arc::new(crate::fs::operator::FsOperator(Arc::downgrade(
        &fs,
    ))));
    let spec = MountSpec {
        allow_other: plan.args.allow_other,
        threads: plan.args.threads,
        transport: plan.args.transport,
        data: plan.args.data,
        fsname: format!("intentfs:{}", plan.workspace.display()),
    };
    let mut mounted = Mounted::new(fs.clone(), &plan.mountpoint, &spec)
        .map_err(|e| anyhow!("mounting {}: {e}", plan.mountpoint.display()))?;
    // What the daemon writes on its own, not for a request: the kernel hears of those
    // changes like of changes made outside the mount (its cached size of the ledger, the
    // listing of `.orchestration/`).
    for p in [
        plan.ledger_path.clone(),
        crate::ledger::writer::head_path(&plan.ledger_path),
        plan.workspace.join(crate::ledger::DEFAULT_INTENT_MAP),
        plan.policy_path.clone(),
        plan.workspace.join(crate::fs::LESSON_FILE),
    ] {
        fs.daemon_writes(&p);
    }
    drop(fs);
    let pid_file = runtime::hold_pid_file(rt)
        .map_err(|e| tracing::warn!("pid file in {}: {e}", rt.path.display()))
        .ok();
    let _ = ledger.record_nowait(crate::ledger::Draft {
        mutation_type: Some(crate::ledger::MutationType::Mount),
        detail: Some(serde_json::json!({
            "mountpoint": plan.mountpoint.display().to_string(),
            "policy": plan.policy_path.display().to_string(),
            "agent": plan.args.agent,
            "intent": plan.args.intent,
            "intents_allowed": ids.default_identity().allowed.describe(),
            "identity_tracking": ids.tracking(),
            "require_read": plan.args.require_read,
            "breaker": plan.args.breaker,
            "record": plan.args.record.name(),
            "store": plan.store_dir.display().to_string(),
        })),
        ..Default::default()
    });
    tracing::info!(
        "mounted {} at {} (policy {}, ledger {})",
        plan.workspace.display(),
        plan.mountpoint.display(),
        plan.policy_path.display(),
        plan.ledger_path.display()
    );
    if let Some(mut r) = ready {
        for w in &warnings {
            let _ = writeln!(r, "WARN {}", w.replace('\n', " "));
        }
        // Closing the pipe releases the waiting parent.
        let _ = writeln!(r, "OK");
    }
    // Signals unmount; the session loop then ends on its own.
    let mut unmounter = mounted.unmounter();
    let mp = plan.mountpoint.clone();
    let broker2 = broker.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            // sigwait fails only for an invalid set; unmount then too rather than never.
            let sig = sigset.wait().map_or(0, |s| s as i32);
            tracing::info!("signal {sig}: unmounting {}", mp.display());
            // Answer every parked request (rejected) while the mount still serves.
            broker2.shutdown();
            if let Err(e) = unmounter.unmount() {
                tracing::warn!("unmount: {e}; retrying lazily");
                let _ = super::umount::unmount(&mp, true);
            }
        })?;
    // `.orchestration/intent_map.md`, regenerated as the ledger grows (at most once a second).
    let map_out = plan.workspace.join(crate::ledger::DEFAULT_INTENT_MAP);
    let intent_map = crate::ledger::map::IntentMapWriter::new(
        &plan.ledger_path,
        Some(&plan.workspace),
        &map_out,
    )
    .spawn(Duration::from_secs(1))
    .map_err(|e| tracing::warn!("intent map: {e}"))
    .ok();
    let stop = Arc::new(AtomicBool::new(false));
    spawn_policy_watcher(
        guard,
        ids.clone(),
        plan.policy_path.clone(),
        plan.workspace.clone(),
        extra,
        plan.loaded_stamps,
        stop.clone(),
    );
    let result = mounted.run();
    if let Some(fs) = fs_weak.upgrade() {
        // `--record async`: the closes still queued are recorded before the unmount is.
        fs.settle_records();
        fs.gate.bursts.flush(&ledger, true);
    }
    broker.shutdown();
    stop.store(true, Ordering::Relaxed);
    let _ = ledger.record(crate::ledger::Draft {
        mutation_type: Some(crate::ledger::MutationType::Unmount),
        ..Default::default()
    });
    ledger.shutdown();
    if let Some(f) = otlp {
        f.finish();
    }
    drop(intent_map);
    ids.shutdown();
    rt.remove("pid");
    drop(pid_file);
    // Leave no empty runtime directory behind (a daemonized mount keeps its daemon.log).
    let _ = std::fs::remove_dir(&rt.path);
    tracing::info!("unmounted {}", plan.mountpoint.display());
    result.map_err(|e| anyhow!("serving: {e}"))
}

/// A file's change stamp (device, inode, size, mtime, ctime).
/// What identifies a version of a file for the policy watcher.
type Stamp = Option<(u64, u64, u64, i64, i64, i64)>;
/// The policy's stamp and `.intentignore`'s.
type Stamps = (Stamp, Stamp);

fn stamp(p: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime_nsec(),
    ))
}

/// Reload the policy and `.intentignore` when they change on disk; a reload that fails keeps
/// the last good rules (never falls open) and says so. Also frees identities of ended
/// sessions.
fn spawn_policy_watcher(
    guard: Arc<Guard>,
    ids: Arc<Identities>,
    policy: PathBuf,
    workspace: PathBuf,
    extra: Vec<PathBuf>,
    loaded: Stamps,
    stop: Arc<AtomicBool>,
) {
    let ignore = workspace.join(".intentignore");
    let _ = std::thread::Builder::new()
        .name("policy-watch".into())
        .spawn(move || {
            let mut last = loaded;
            let mut ticks = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(250));
                ticks += 1;
                if ticks.is_multiple_of(40) {
                    let n = ids.reap();
                    if n > 0 {
                        tracing::info!("freed {n} identity(ies) whose session ended");
                    }
                }
                let now = (stamp(&policy), stamp(&ignore));
                if now == last {
                    continue;
                }
                last = now;
                match load_rules(&policy, &workspace, &extra) {
                    Ok(r) => {
                        tracing::info!("policy reloaded: {} intent(s)", r.policy.intents().len());
                        guard.replace(r);
                    }
                    Err(e) => {
                        tracing::error!("policy reload failed, keeping the last good policy: {e}");
                        notify_human(
                            "intentfs: policy reload failed",
                            &format!("Keeping the last good policy.\n{e}"),
                        );
                        guard.set_reload_error(Some(e));
                    }
                }
            }
        });
}

/// Clean up tools' temporaries left behind (`fs::temps`) and write the build output
/// summaries whose burst ended (`fs::output`), once a second, for as long as the filesystem
/// lives.
fn spawn_temp_sweeper(fs: std::sync::Weak<Fs>) {
    let _ = std::thread::Builder::new()
        .name("temp-sweeper".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            let Some(fs) = fs.upgrade() else { return };
            let n = fs.sweep_temps();
            if n > 0 {
                tracing::info!("cleaned up {n} temporary file(s) tools left behind");
            }
            if let Some(l) = &fs.gate.ledger {
                fs.gate.bursts.flush(l, false);
            }
        });
}

/// A best-effort desktop notice (the log line is the reliable channel).
fn notify_human(summary: &str, body: &str) {
    if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_none() {
        return;
    }
    let _ = notify_rust::Notification::new()
        .appname("intentfs")
        .summary(summary)
        .body(body)
        .show();
}

/// A FUSE mount whose daemon is gone: `ENOTCONN` on `/dev/fuse`, `ECONNABORTED` when the
/// mount was served over FUSE-over-io_uring (the kernel tears the ring down that way), or
/// `ECANCELED` for a request the kernel had handed to a ring thread that was dying (seen
/// by the first access after a `kill -9`: the request's delivery runs in the dead
/// thread's context and is cancelled).
fn is_dead_mount(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN) | Some(libc::ECONNABORTED) | Some(libc::ECANCELED)
    )
}

#[cfg(test)]
mod tests {
    use super::backing_exposure;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Does the finding (if any) name `p` itself?
    fn names(r: &Option<String>, p: &Path) -> bool {
        r.as_deref()
            .is_some_and(|r| r.starts_with(&format!("{} ", p.display())))
    }

    #[test]
    fn backing_exposure_finds_writable_or_foreign_directories() {
        let me = nix::unistd::geteuid().as_raw();
        let t = tempfile::tempdir().unwrap();
        let parent = t.path().canonicalize().unwrap().join("parent");
        let ws = parent.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        chmod(&parent, 0o755);
        chmod(&ws, 0o755);
        // Private directories: nothing to say about them (what is above the temp dir
        // depends on the machine).
        let r = backing_exposure(&ws, me);
        assert!(!names(&r, &ws) && !names(&r, &parent), "{r:?}");

        chmod(&ws, 0o777);
        let r = backing_exposure(&ws, me);
        assert!(
            names(&r, &ws) && r.as_ref().unwrap().contains("group and others"),
            "{r:?}"
        );
        chmod(&ws, 0o775);
        let r = backing_exposure(&ws, me);
        assert!(
            names(&r, &ws) && r.as_ref().unwrap().contains("0775"),
            "{r:?}"
        );
        // The sticky bit does not make the workspace itself safe...
        chmod(&ws, 0o1777);
        assert!(names(&backing_exposure(&ws, me), &ws));
        chmod(&ws, 0o755);
        // ...but a sticky parent (like /tmp) is fine; a plain world-writable one is not.
        chmod(&parent, 0o1777);
        let r = backing_exposure(&ws, me);
        assert!(!names(&r, &ws) && !names(&r, &parent), "{r:?}");
        chmod(&parent, 0o757);
        let r = backing_exposure(&ws, me);
        assert!(
            names(&r, &parent) && r.as_ref().unwrap().contains("others"),
            "{r:?}"
        );
        chmod(&parent, 0o755);

        // Owned by another uid (root-owned directories are not a finding).
        if me == 0 {
            std::os::unix::fs::chown(&ws, Some(4242), None).unwrap();
            let r = backing_exposure(&ws, 0);
            assert!(
                names(&r, &ws) && r.as_ref().unwrap().contains("uid 4242"),
                "{r:?}"
            );
        } else {
            let r = backing_exposure(&ws, me + 1);
            assert!(
                names(&r, &ws) && r.as_ref().unwrap().contains(&format!("uid {me}")),
                "{r:?}"
            );
        }
    }
}
