//! `intentfs demo [DIR]`: create a small demo workspace with the embedded example policy and
//! mount it, so a new user can try the handshake, scopes and the ledger in one command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use super::mount::{self, MountArgs};

/// The example policy shipped in `policies/example.yaml`, embedded in the binary.
pub const EXAMPLE_POLICY: &str = include_str!("../../policies/example.yaml");

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Where to create `workspace/` and `mnt/` [default: /tmp/intentfs-demo].
    #[arg(default_value = "/tmp/intentfs-demo")]
    pub dir: PathBuf,
    /// Stay attached to the terminal (Ctrl-C unmounts).
    #[arg(long, short = 'f')]
    pub foreground: bool,
}

const FILES: &[(&str, &str)] = &[
    (
        "README.md",
        "# Demo web project\n\nA tiny API used to try intentfs.\n",
    ),
    (
        "src/auth/session.ts",
        "export function login(user: string) {\n  return `session-${user}`;\n}\n",
    ),
    (
        "src/middleware/jwt.ts",
        "export const verify = (token: string) => token.length > 0;\n",
    ),
    (
        "src/routes/users.ts",
        "export const users = ['ada', 'grace'];\n",
    ),
    (
        "tests/auth/session.test.ts",
        "import { login } from '../../src/auth/session';\n",
    ),
    ("docs/index.md", "# Docs\n"),
    (".env", "API_KEY=not-a-real-secret\n"),
];

fn write_workspace(ws: &Path) -> anyhow::Result<()> {
    for (rel, text) in FILES {
        let p = ws.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(&p, text).with_context(|| p.display().to_string())?;
    }
    let orch = ws.join(".orchestration");
    std::fs::create_dir_all(&orch)?;
    std::fs::write(orch.join("active_intents.yaml"), EXAMPLE_POLICY)?;
    std::fs::write(
        ws.join(".intentignore"),
        "# paths no intent may write (gitignore syntax)\n*.lock\n",
    )?;
    Ok(())
}

pub fn run(a: DemoArgs) -> anyhow::Result<ExitCode> {
    let ws = a.dir.join("workspace");
    let mnt = a.dir.join("mnt");
    if ws.exists() && !ws.join(".orchestration/active_intents.yaml").exists() {
        bail!(
            "{} exists and is not an intentfs demo workspace; pass another DIR",
            ws.display()
        );
    }
    if !ws.exists() {
        write_workspace(&ws)?;
    }
    std::fs::create_dir_all(&mnt)?;
    println!("demo workspace: {}", ws.display());
    println!("mountpoint:     {}  (agents work here)", mnt.display());
    println!(
        "\ntry:\n  cat {m}/.intentfs/intents\n  echo INT-001 > {m}/.intentfs/intent\n  cat {m}/.intentfs/context\n  \
         echo '// ok' >> {m}/src/auth/session.ts          # in scope: allowed\n  \
         echo '// no' >> {m}/src/routes/users.ts          # out of scope: Permission denied\n  \
         cat {m}/.intentfs/last_error\n  intentfs log {w}\n  intentfs umount {m}\n",
        m = mnt.display(),
        w = ws.display()
    );
    mount::run(MountArgs::for_demo(ws, mnt, a.foreground))
}
