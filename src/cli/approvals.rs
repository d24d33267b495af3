//! `intentfs approvals`, `approve`, `reject`, `reset`: the CLI channel of the approval broker.
//!
//! These talk to the mount's daemon over its approval socket
//! (`runtime::dir_for(MOUNTPOINT)/control.sock`, outside the workspace and the mount),
//! which serves only the mount's owner and root.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};

use super::runtime;
use crate::approval::socket::{self, Request, Response};
use crate::approval::{Grant, PendingInfo};

/// The socket's file name inside the mount's runtime directory.
pub const SOCKET_NAME: &str = "control.sock";

/// `intentfs approvals [--json] [MOUNTPOINT]`
#[derive(clap::Args, Debug)]
pub struct ApprovalsArgs {
    /// Print a JSON array of objects (id, identity, agent, intent, kind, op, path, age_ms).
    #[arg(long)]
    pub json: bool,
    /// The intentfs mount [default: the one containing the current directory].
    pub mountpoint: Option<PathBuf>,
}

/// `intentfs approve ID [--for-file | --expand-scope] [--mount MP]`
#[derive(clap::Args, Debug)]
pub struct ApproveArgs {
    /// The request id, from `intentfs approvals`.
    pub id: u64,
    /// Approve this file for the rest of the agent's session (out-of-scope writes, sensitive reads).
    #[arg(long, conflicts_with = "expand_scope")]
    pub for_file: bool,
    /// Add the suggested glob to the agent's scope for its session, and record it in
    /// .orchestration/pending_scope_updates.json to fold into the policy.
    #[arg(long)]
    pub expand_scope: bool,
    /// The intentfs mount [default: the one containing the current directory].
    #[arg(long = "mount", value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
}

/// `intentfs reject ID [--mount MP]`
#[derive(clap::Args, Debug)]
pub struct RejectArgs {
    /// The request id, from `intentfs approvals`.
    pub id: u64,
    /// The intentfs mount [default: the one containing the current directory].
    #[arg(long = "mount", value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
}

/// `intentfs reset IDENTITY [--mount MP]`
#[derive(clap::Args, Debug)]
pub struct ResetArgs {
    /// The identity whose circuit breaker tripped: `default` or `run:<pid>`.
    pub identity: String,
    /// The intentfs mount [default: the one containing the current directory].
    #[arg(long = "mount", value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
}

pub fn run_approvals(a: ApprovalsArgs) -> anyhow::Result<ExitCode> {
    let mp = resolve_mount(a.mountpoint.as_deref())?;
    let pending = list_at(&socket_for(&mp)?)?;
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &pending)?;
        writeln!(out)?;
    } else if pending.is_empty() {
        writeln!(out, "no pending approvals on {}", mp.display())?;
    } else {
        write!(out, "{}", table(&pending))?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_approve(a: ApproveArgs) -> anyhow::Result<ExitCode> {
    let mp = resolve_mount(a.mount.as_deref())?;
    let grant = match (a.for_file, a.expand_scope) {
        (true, _) => Grant::File,
        (_, true) => Grant::ExpandScope,
        _ => Grant::Once,
    };
    approve_at(&socket_for(&mp)?, a.id, grant)?;
    println!(
        "approved request {}{}",
        a.id,
        match grant {
            Grant::Once => " (once)",
            Grant::File => " for this file, for the rest of the agent's session",
            Grant::ExpandScope => " and expanded the agent's scope (recorded in .orchestration/pending_scope_updates.json)",
        }
    );
    Ok(ExitCode::SUCCESS)
}

pub fn run_reject(a: RejectArgs) -> anyhow::Result<ExitCode> {
    let mp = resolve_mount(a.mount.as_deref())?;
    reject_at(&socket_for(&mp)?, a.id)?;
    println!("rejected request {}", a.id);
    Ok(ExitCode::SUCCESS)
}

pub fn run_reset(a: ResetArgs) -> anyhow::Result<ExitCode> {
    let mp = resolve_mount(a.mount.as_deref())?;
    reset_at(&socket_for(&mp)?, &a.identity)?;
    println!(
        "reset the circuit breaker of {}: its mutations are checked again",
        a.identity
    );
    Ok(ExitCode::SUCCESS)
}

/// The control socket of the mount at `mp`, in its runtime directory once that is checked
/// to be the owner's (see `runtime`): a socket somebody else put there must not receive an
/// approval or a grant.
pub fn socket_for(mp: &Path) -> anyhow::Result<PathBuf> {
    let dir = runtime::dir_for(mp);
    if dir.exists() {
        runtime::verify(&dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(dir.join(SOCKET_NAME))
}

/// The intentfs mount `given` names (or is inside), else the one containing the current
/// directory; the innermost if mounts nest.
fn resolve_mount(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let mounts = runtime::intentfs_mounts();
    let innermost = |p: &Path| {
        mounts
            .iter()
            .filter(|m| p.starts_with(m))
            .max_by_key(|m| m.components().count())
            .cloned()
    };
    match given {
        Some(p) => {
            // Lexically first: root may not be able to stat another user's FUSE mount.
            let abs = std::path::absolute(p).with_context(|| p.display().to_string())?;
            if let Some(m) = innermost(&abs) {
                return Ok(m);
            }
            let canon = p.canonicalize().with_context(|| p.display().to_string())?;
            innermost(&canon).ok_or_else(|| {
                anyhow!(
                    "{} is not an intentfs mount\nhint: `grep intentfs /proc/self/mountinfo` lists them",
                    p.display()
                )
            })
        }
        None => {
            let cwd = std::env::current_dir().context("reading the current directory")?;
            innermost(&cwd).ok_or_else(|| {
                let list = if mounts.is_empty() {
                    "no intentfs mount is mounted".to_string()
                } else {
                    format!(
                        "intentfs mounts: {}",
                        mounts.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", ")
                    )
                };
                anyhow!(
                    "the current directory {} is not inside an intentfs mount ({list})\nhint: name the mount: `intentfs approvals MOUNTPOINT` or `--mount MOUNTPOINT`",
                    cwd.display()
                )
            })
        }
    }
}

/// Sends `req`, turning transport failures and `{"ok":false}` into readable errors.
pub(crate) fn talk(sock: &Path, req: &Request) -> anyhow::Result<Response> {
    let r = match socket::call(sock, req) {
        Ok(r) => r,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => bail!(
            "no control socket at {}: is the mount's daemon running?\nhint: the socket is in the mount owner's runtime directory; run this as the user who mounted it",
            sock.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
            "permission refused: {} belongs to the mount's owner\nhint: only the user who mounted it (and root) may decide approvals; agents run under another uid",
            sock.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("talking to {}", sock.display())),
    };
    if !r.ok {
        bail!(
            "{}",
            r.error
                .as_deref()
                .unwrap_or("the daemon refused the request")
        );
    }
    Ok(r)
}

pub(crate) fn list_at(sock: &Path) -> anyhow::Result<Vec<PendingInfo>> {
    Ok(talk(sock, &Request::List)?.pending.unwrap_or_default())
}

pub(crate) fn approve_at(sock: &Path, id: u64, grant: Grant) -> anyhow::Result<()> {
    talk(sock, &Request::Approve { id, grant }).map(drop)
}

pub(crate) fn reject_at(sock: &Path, id: u64) -> anyhow::Result<()> {
    talk(sock, &Request::Reject { id }).map(drop)
}

pub(crate) fn unmount_at(sock: &Path) -> anyhow::Result<()> {
    talk(sock, &Request::Unmount).map(drop)
}

pub(crate) fn reset_at(sock: &Path, identity: &str) -> anyhow::Result<()> {
    talk(
        sock,
        &Request::Reset {
            identity: identity.into(),
        },
    )
    .map(drop)
}

/// The human table: id, agent (identity), intent, operation, path, age.
fn table(pending: &[PendingInfo]) -> String {
    let header = [
        "ID",
        "AGENT (IDENTITY)",
        "INTENT",
        "OPERATION",
        "PATH",
        "AGE",
    ];
    let rows: Vec<[String; 6]> = pending
        .iter()
        .map(|p| {
            [
                p.id.to_string(),
                format!(
                    "{} ({})",
                    super::visible(&p.agent),
                    super::visible(&p.identity)
                ),
                p.intent
                    .as_deref()
                    .map_or_else(|| "-".into(), super::visible),
                format!("{} [{}]", p.op, p.kind),
                super::visible(&p.path),
                age(p.age_ms),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header);
    for (r, p) in rows.iter().zip(pending) {
        line(&r.each_ref().map(String::as_str));
        // The agent's own words (it asked ahead, `.intentfs/approval`): quoted as data.
        if let Some(why) = &p.reason {
            line(&[&format!("    the agent says: {why:?}")]);
        }
    }
    out
}

/// `850ms`, `12s`, `3m04s`, `1h02m`.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::approval::{Ask, AskKind, Broker, BrokerConfig, Decision, Mode};

    #[derive(Parser, Debug)]
    enum T {
        Approvals(ApprovalsArgs),
        Approve(ApproveArgs),
        Reject(RejectArgs),
        Reset(ResetArgs),
    }

    #[test]
    fn arguments() {
        let T::Approve(a) =
            T::try_parse_from(["t", "approve", "7", "--for-file", "--mount", "/m"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (a.id, a.for_file, a.expand_scope, a.mount),
            (7, true, false, Some(PathBuf::from("/m")))
        );
        assert!(T::try_parse_from(["t", "approve", "7", "--for-file", "--expand-scope"]).is_err());
        assert!(T::try_parse_from(["t", "approve", "x"]).is_err());
        let T::Approvals(a) = T::try_parse_from(["t", "approvals", "--json", "/m"]).unwrap() else {
            panic!()
        };
        assert!(a.json);
        assert_eq!(a.mountpoint, Some(PathBuf::from("/m")));
        let T::Reject(a) = T::try_parse_from(["t", "reject", "3"]).unwrap() else {
            panic!()
        };
        assert_eq!((a.id, a.mount), (3, None));
        let T::Reset(a) = T::try_parse_from(["t", "reset", "session:12"]).unwrap() else {
            panic!()
        };
        assert_eq!(a.identity, "session:12");
    }

    #[test]
    fn ages_and_table() {
        assert_eq!(age(850), "850ms");
        assert_eq!(age(12_000), "12s");
        assert_eq!(age(184_000), "3m04s");
        assert_eq!(age(3_720_000), "1h02m");
        let p = PendingInfo {
            id: 12,
            identity: "session:4242".into(),
            agent: "claude".into(),
            intent: None,
            kind: "delete".into(),
            op: "unlink".into(),
            path: "src/old.rs".into(),
            age_ms: 3000,
            reason: None,
        };
        let t = table(&[p]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("ID  AGENT (IDENTITY)"), "{t}");
        assert!(lines[1].starts_with("12  claude (session:4242)  -"), "{t}");
        assert!(lines[1].contains("unlink [delete]"), "{t}");
        assert!(lines[1].ends_with("src/old.rs  3s"), "{t}");
    }

    #[test]
    fn not_an_intentfs_mount() {
        let e = resolve_mount(Some(Path::new("/"))).unwrap_err().to_string();
        assert!(e.contains("/ is not an intentfs mount"), "{e}");
        let e = resolve_mount(Some(Path::new("/nonexistent/x")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/x"), "{e}");
    }

    #[test]
    fn commands_against_a_live_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join(SOCKET_NAME);
        let b = Broker::start(BrokerConfig {
            mode: Mode::Cli,
            timeout: Duration::from_secs(60),
            socket_path: Some(sock.clone()),
            owner_uid: nix::unistd::geteuid().as_raw(),
            mountpoint: "/mnt".into(),
            workspace: dir.path().into(),
        })
        .unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let ask = Ask {
            kind: AskKind::SensitiveRead,
            identity: "default".into(),
            agent: "a".into(),
            intent: None,
            op: "read".into(),
            path: ".env".into(),
            suggested_glob: String::new(),
            reason: None,
        };
        let tx2 = tx.clone();
        let id = b.ask(ask.clone(), Box::new(move |d| tx.send(d).unwrap()));
        let id2 = b.ask(ask, Box::new(move |d| tx2.send(d).unwrap()));
        let listed = list_at(&sock).unwrap();
        assert_eq!(listed.iter().map(|p| p.id).collect::<Vec<_>>(), [id, id2]);
        let e = approve_at(&sock, id, Grant::ExpandScope)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not apply"), "{e}");
        approve_at(&sock, id, Grant::File).unwrap();
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            Decision::Approved {
                grant: Grant::File,
                ..
            }
        ));
        let e = approve_at(&sock, id, Grant::Once).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "no pending request {id}: already decided or timed out"
            )),
            "{e}"
        );
        reject_at(&sock, id2).unwrap();
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            Decision::Rejected { .. }
        ));
        let e = reset_at(&sock, "default").unwrap_err().to_string();
        assert!(e.contains("no circuit breaker"), "{e}");
        b.shutdown();
        let e = list_at(&sock).unwrap_err().to_string();
        assert!(e.contains("no control socket"), "{e}");
    }
}
