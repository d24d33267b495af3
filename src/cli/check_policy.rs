//! `intentfs check-policy FILE [--workspace DIR]`: validate a policy and print its intents;
//! with a workspace, also warn about sensitive files git tracks (their content is in
//! `.git/objects`, readable through the mount).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::policy::Policy;

#[derive(clap::Args, Debug)]
pub struct CheckPolicyArgs {
    /// The policy file (YAML), e.g. WORKSPACE/.orchestration/active_intents.yaml.
    pub file: PathBuf,
    /// The workspace the policy governs [default: the directory above `.orchestration/`
    /// when FILE is there].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
}

/// Files git tracks in `workspace` that the policy calls sensitive: agents cannot open them
/// through the mount without a human, but their content is in git's object store, which
/// they can read. Empty when the workspace is not a git repository (or git is missing).
pub(crate) fn tracked_sensitive(workspace: &Path, policy: &Policy) -> Vec<String> {
    if !workspace.join(".git").exists() {
        return Vec::new();
    }
    // Nothing the repository configures runs: this reads the index only.
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(workspace)
        .args([
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(["ls-files", "-z"])
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(out) = out else { return Vec::new() };
    if !out.status.success() {
        return Vec::new();
    }
    out.stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .filter(|p| policy.sensitive_match(Path::new(p)).is_some())
        .collect()
}

/// The warning for [`tracked_sensitive`]'s findings, if any.
pub(crate) fn tracked_sensitive_warning(workspace: &Path, policy: &Policy) -> Option<String> {
    let found = tracked_sensitive(workspace, policy);
    if found.is_empty() {
        return None;
    }
    let shown: Vec<&str> = found.iter().take(5).map(String::as_str).collect();
    Some(format!(
        "warning: {} sensitive file(s) are tracked by git in {} ({}{}): agents cannot open them \
         through the mount without a human, but git's object store holds their content, and \
         `git show HEAD:PATH` reads it\n  hint: remove them from the repository's history \
         (git filter-repo), or keep such repositories out of agents' mounts",
        found.len(),
        workspace.display(),
        shown.join(", "),
        if found.len() > shown.len() {
            ", …"
        } else {
            ""
        }
    ))
}

pub fn run(a: CheckPolicyArgs) -> anyhow::Result<ExitCode> {
    match Policy::load(&a.file) {
        Ok(p) => {
            println!("{}: ok, {} intent(s)", a.file.display(), p.intents().len());
            print!("{}", p.summary_table());
            let ws = a.workspace.clone().or_else(|| {
                let dir = a.file.canonicalize().ok()?.parent()?.to_path_buf();
                (dir.file_name()? == ".orchestration")
                    .then(|| dir.parent().map(Path::to_path_buf))?
            });
            if let Some(w) = ws.and_then(|w| tracked_sensitive_warning(&w, &p)) {
                eprintln!("{w}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("intentfs: {e}");
            Ok(ExitCode::from(2))
        }
    }
}
