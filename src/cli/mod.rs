//! The command line: clap derive, one file per subcommand. Raw arguments are validated into
//! settings here, before anything is mounted.

mod agent;
mod approvals;
mod blame;
mod check_policy;
mod demo;
mod diff;
mod gc;
mod hook;
mod init;
mod ledger;
mod log;
mod mcp;
mod mount;
mod notes;
mod report;
mod restore;
mod run;
mod runtime;
mod time;
mod umount;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// intentfs: a FUSE filesystem that governs AI coding agents.
///
/// Mount a workspace through intentfs, let agents work inside the mountpoint, and every
/// change they make is checked against the intent they selected, refused when stale, and
/// recorded in a hash-chained audit ledger.
#[derive(Parser, Debug)]
#[command(
    name = "intentfs",
    version,
    about,
    long_about,
    propagate_version = true,
    after_help = "QUICK START:
  intentfs demo                          # demo workspace mounted at /tmp/intentfs-demo/mnt
  intentfs mount --intent INT-001 ./project /mnt/agent
  cat /mnt/agent/.intentfs/context       # the intent, ready for the agent's prompt
  intentfs run --mount /mnt/agent --intent INT-002 --agent docs --user agent -- CMD...
  intentfs log ./project                 # what changed, by which intent and agent
  intentfs ledger verify ./project       # chain intact? edits made outside the mount?
  intentfs diff --agent docs ./project   # what that agent changed, as diffs
  intentfs rewind --agent docs ./project # undo it, without clobbering anyone else's work
  intentfs umount /mnt/agent"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Mount WORKSPACE at MOUNTPOINT with governance on.
    Mount(mount::MountArgs),
    /// Unmount an intentfs mount (plain `umount` works too).
    #[command(alias = "unmount")]
    Umount(umount::UmountArgs),
    /// Grant a command an agent identity of its own (as the operator) and run it in it.
    Run(run::RunArgs),
    /// Validate a policy file and print its intents.
    CheckPolicy(check_policy::CheckPolicyArgs),
    /// Create a demo workspace with the example policy and mount it.
    Demo(demo::DemoArgs),
    /// List the approval requests waiting for a human.
    Approvals(approvals::ApprovalsArgs),
    /// Approve a pending request (once, for the file, or expanding the scope).
    Approve(approvals::ApproveArgs),
    /// Reject a pending request.
    Reject(approvals::RejectArgs),
    /// Reset an identity's tripped circuit breaker.
    Reset(approvals::ResetArgs),
    /// Verify or export the audit ledger.
    Ledger(ledger::LedgerArgs),
    /// List ledger entries, filtered.
    Log(log::LogArgs),
    /// Which intent and agent last changed each line of a file.
    Blame(blame::BlameArgs),
    /// Write the ledger's attribution of each commit as a git note (refs/notes/intentfs).
    Notes(notes::NotesArgs),
    /// MCP server over stdio for an agent inside the mount (its client starts it).
    Mcp(mcp::McpArgs),
    /// Answer one event of Claude Code's hook protocol (JSON on stdin).
    Hook(hook::HookArgs),
    /// Write an agent's MCP and hook configuration into the workspace.
    Init(init::InitArgs),
    /// Show what changes did, as unified diffs of the recorded versions.
    Diff(diff::DiffArgs),
    /// Put a recorded version of a file back (deleted files too).
    Restore(restore::RestoreArgs),
    /// Undo an agent's, intent's or period's changes, latest first, sparing others' later work.
    Rewind(restore::RewindArgs),
    /// Write the audit report of a workspace (self-contained HTML, or JSON).
    Report(report::ReportArgs),
    /// Remove old file versions from the content store (retention).
    Gc(gc::GcArgs),
    /// (There is no `verify`: it says where the command is.)
    #[command(hide = true)]
    Verify {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
}

/// Parse the command line and run the subcommand.
pub(crate) use crate::text::visible;

pub fn run() -> ExitCode {
    let cli = Cli::parse();
    // Commands that print for a pipe (`intentfs log | head`) end quietly when it closes,
    // as other Unix tools do. (Not the daemon: a closed socket must not kill it. `restore`
    // and `rewind` print only once their work is done and on record.)
    if matches!(
        cli.command,
        Command::Log(_)
            | Command::Blame(_)
            | Command::Diff(_)
            | Command::Report(_)
            | Command::Restore(_)
            | Command::Rewind(_)
            | Command::Ledger(_)
            | Command::CheckPolicy(_)
            | Command::Approvals(_)
            | Command::Notes(_)
            | Command::Init(_)
            | Command::Hook(_)
            | Command::Gc(_)
    ) {
        use nix::sys::signal::{signal, SigHandler, Signal};
        // SAFETY: `signal` is unsafe because a handler runs at any point of any thread;
        // SIG_DFL installs no handler (a broken pipe ends the process), and no thread exists
        // yet to have relied on SIGPIPE being ignored.
        let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    }
    let result = match cli.command {
        Command::Mount(a) => mount::run(a),
        Command::Umount(a) => umount::run(a),
        Command::Run(a) => run::run(a),
        Command::CheckPolicy(a) => check_policy::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Approvals(a) => approvals::run_approvals(a),
        Command::Approve(a) => approvals::run_approve(a),
        Command::Reject(a) => approvals::run_reject(a),
        Command::Reset(a) => approvals::run_reset(a),
        Command::Ledger(a) => ledger::run(a),
        Command::Log(a) => log::run(a),
        Command::Blame(a) => blame::run(a),
        Command::Notes(a) => notes::run(a),
        Command::Mcp(a) => mcp::run(a),
        Command::Hook(a) => hook::run(a),
        Command::Init(a) => init::run(a),
        Command::Diff(a) => diff::run(a),
        Command::Restore(a) => restore::run_restore(a),
        Command::Rewind(a) => restore::run_rewind(a),
        Command::Report(a) => report::run(a),
        Command::Gc(a) => gc::run(a),
        Command::Verify { rest } => Err(anyhow::anyhow!(
            "there is no `verify` command\nhint: intentfs ledger verify {}",
            if rest.is_empty() {
                "[WORKSPACE]".to_string()
            } else {
                rest.join(" ")
            }
        )),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("intentfs: {e:#}");
            ExitCode::from(2)
        }
    }
}
