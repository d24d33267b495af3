//! Real toolchains in the mount (issue 17): the everyday tools an agent runs, each started
//! as an agent identity (`intentfs run`) inside a governed mount under the scopes a user
//! would write. Each must finish as it does natively, leave nothing outside its scope
//! changed, and leave a ledger that verifies.
//!
//! Packages come from the registries (crates.io is not needed: the crate has no
//! dependencies; npm and PyPI are). A test whose toolchain is absent says so and returns;
//! CI installs them all (`.ci/run`).

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

/// `intentfs run --mount MNT --intent INTENT --agent tool -- sh -c SCRIPT` from the mount.
fn agent(tm: &TestMount, intent: &str, script: &str) -> Output {
    intentfs()
        .arg("run")
        .arg("--mount")
        .arg(&tm.mnt)
        .args([
            "--intent", intent, "--agent", "tool", "--", "sh", "-c", script,
        ])
        .current_dir(&tm.mnt)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "agent")
        .env("GIT_AUTHOR_EMAIL", "agent@example.com")
        .env("GIT_COMMITTER_NAME", "agent")
        .env("GIT_COMMITTER_EMAIL", "agent@example.com")
        .env("CARGO_NET_OFFLINE", "true")
        // The crates build into their own `target/` in the mount, whatever the
        // environment running the tests builds into.
        .env_remove("CARGO_TARGET_DIR")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("intentfs run")
}

/// Run `script` as the agent; it must succeed. Its stdout.
fn agent_ok(tm: &TestMount, intent: &str, script: &str) -> String {
    ok(agent(tm, intent, script), script)
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd} >/dev/null"))
        .status()
        .is_ok_and(|s| s.success())
}

/// Print why a test does not run here; true when it should return.
fn skip_unless(cond: bool, why: &str) -> bool {
    if !cond {
        eprintln!("SKIPPED: {why}");
    }
    !cond
}

/// `intentfs ledger verify WS` must pass.
fn ledger_verifies(tm: &TestMount) {
    let v = intentfs()
        .args(["ledger", "verify"])
        .arg(&tm.ws)
        .output()
        .unwrap();
    assert!(
        v.status.success(),
        "ledger verify: {}{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
}

/// The workspace tree without the paths under `skip` (scoped output, the daemon's files).
fn tree_without(tm: &TestMount, skip: &[&str]) -> Vec<(String, &'static str, String, u32)> {
    tree(&tm.ws, &[".orchestration"])
        .into_iter()
        .filter(|(p, ..)| {
            !skip
                .iter()
                .any(|s| p == s || p.starts_with(&format!("{s}/")))
        })
        .collect()
}

/// Every DENIAL in the ledger (there should be none when tools work in scope).
fn denials(tm: &TestMount) -> Vec<Value> {
    tm.ledger()
        .into_iter()
        .filter(|e| e["mutation_type"] == "DENIAL")
        .collect()
}

// ----- Rust ---------------------------------------------------------------------------

const CARGO_TOML: &str = r#"[package]
name = "demo"
version = "0.1.0"
edition = "2021"
build = "build.rs"

[lib]
path = "src/lib.rs"

[[bin]]
name = "demo"
path = "src/main.rs"
"#;

const BUILD_RS: &str = r#"fn main() {
    println!("cargo:rustc-env=DEMO_BUILT_BY=build.rs");
    println!("cargo:rerun-if-changed=build.rs");
}
"#;

const LIB_RS: &str = "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn adds() {\n        assert_eq!(super::add(2, 2), 4);\n    }\n}\n";

const MAIN_RS: &str =
    "fn main() {\n    println!(\"{} {}\", demo::add(2, 3), env!(\"DEMO_BUILT_BY\"));\n}\n";

fn rust_policy() -> String {
    "intents:
  - id: RUST
    name: the crate
    status: IN_PROGRESS
    owned_scope: [\"src/**\", \"tests/**\", \"build.rs\", \"Cargo.toml\", \"Cargo.lock\", \"target/\"]
  - id: FMT
    name: format one file
    status: IN_PROGRESS
    owned_scope: [\"src/main.rs\"]
output: [\"target/\"]
approval:
  out_of_scope: deny
"
    .into()
}

/// `cargo build`, `cargo test`, `cargo clippy` of a crate with a build script and a binary,
/// with the default linker (rust-lld on current stable: it fills its output through `mmap`
/// and renames it, and the binaries must come out executable) and with `-fuse-ld=bfd`;
/// `rustfmt` of one file under a one-file scope. Build output is summarized in the ledger.
#[test]
fn rust_build_test_clippy_and_rustfmt() {
    if skip_unless(
        have("cargo") && have("rustfmt"),
        "cargo/rustfmt are not installed",
    ) {
        return;
    }
    let tm = TestMount::builder()
        .policy(&rust_policy())
        .files(&[
            ("Cargo.toml", CARGO_TOML),
            ("build.rs", BUILD_RS),
            ("src/lib.rs", LIB_RS),
            ("src/main.rs", MAIN_RS),
            ("docs/untouched.md", "docs\n"),
        ])
        .mount();
    let before = tree_without(&tm, &["target", "Cargo.lock", "src"]);
    let out = agent_ok(
        &tm,
        "RUST",
        "cargo build -q 2>&1 && ./target/debug/demo && cargo test -q 2>&1 | tail -3 && \
         cargo clippy -q 2>&1 && echo clippy-ok",
    );
    assert!(out.contains("5 build.rs"), "{out}");
    assert!(out.contains("test result: ok"), "{out}");
    assert!(out.contains("clippy-ok"), "{out}");
    // The binary rust-lld wrote is executable, in the workspace too.
    let m = std::fs::metadata(tm.w("target/debug/demo")).unwrap();
    assert!(std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0);
    let out = agent_ok(
        &tm,
        "RUST",
        "RUSTFLAGS='-C link-arg=-fuse-ld=bfd' cargo build -q --target-dir target/bfd 2>&1 && ./target/bfd/debug/demo",
    );
    assert!(out.contains("5 build.rs"), "{out}");
    // rustfmt on a one-file scope.
    std::fs::write(
        tm.w("src/main.rs"),
        "fn main(){println!(\"{} {}\",demo::add(2,3),env!(\"DEMO_BUILT_BY\"));}\n",
    )
    .unwrap();
    agent_ok(
        &tm,
        "FMT",
        "cat src/main.rs >/dev/null && rustfmt --edition 2021 src/main.rs",
    );
    assert_eq!(
        String::from_utf8_lossy(&tm.ws_bytes("src/main.rs")),
        MAIN_RS
    );
    assert_eq!(tree_without(&tm, &["target", "Cargo.lock", "src"]), before);
    assert!(denials(&tm).is_empty(), "{:#?}", denials(&tm));
    // Build output is summarized: a handful of OUTPUT entries, no entry per object file.
    let l = tm.ledger();
    let per_file = l
        .iter()
        .filter(|e| {
            e["path"].as_str().unwrap_or("").starts_with("target/")
                && e["mutation_type"] != "OUTPUT"
        })
        .count();
    assert_eq!(per_file, 0, "per-file entries under target/");
    // Summaries are written when a burst has been quiet for a second.
    assert!(wait_until(std::time::Duration::from_secs(10), || {
        tm.ledger()
            .iter()
            .filter(|e| e["mutation_type"] == "OUTPUT")
            .count()
            > 0
    }));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let l = tm.ledger();
    let outputs: Vec<&Value> = l
        .iter()
        .filter(|e| e["mutation_type"] == "OUTPUT")
        .collect();
    assert!(
        !outputs.is_empty() && outputs.len() < 40,
        "{} OUTPUT entries",
        outputs.len()
    );
    assert!(
        outputs.iter().all(|e| e["path"] == "target"),
        "{outputs:#?}"
    );
    let total: u64 = outputs
        .iter()
        .map(|e| e["detail"]["mutations"].as_u64().unwrap())
        .sum();
    assert!(
        total > 50,
        "the summaries count the build's mutations: {total}"
    );
    ledger_verifies(&tm);
}

// ----- C ------------------------------------------------------------------------------

#[test]
fn c_make_with_gcc() {
    if skip_unless(have("make") && have("cc"), "make or cc is not installed") {
        return;
    }
    let tm = TestMount::builder()
        .policy(
            "intents:\n  - id: C\n    status: IN_PROGRESS\n    owned_scope: [\"src/**\", \"build/\"]\noutput: [\"build/\"]\napproval:\n  out_of_scope: deny\n",
        )
        .files(&[
            ("Makefile", "build/app: src/main.c src/util.c src/util.h\n\tmkdir -p build\n\tcc -O1 -o build/app src/main.c src/util.c\n"),
            ("src/main.c", "#include <stdio.h>\n#include \"util.h\"\nint main(void) { printf(\"%d\\n\", twice(21)); return 0; }\n"),
            ("src/util.c", "#include \"util.h\"\nint twice(int x) { return 2 * x; }\n"),
            ("src/util.h", "int twice(int x);\n"),
        ])
        .mount();
    let before = tree_without(&tm, &["build"]);
    let out = agent_ok(
        &tm,
        "C",
        "make -s && ./build/app && sed -i 's/2 \\* x/x + x/' src/util.c && make -s && ./build/app",
    );
    assert_eq!(out, "42\n42\n");
    let after = tree_without(&tm, &["build"]);
    assert_eq!(after.len(), before.len(), "{after:#?}");
    assert!(denials(&tm).is_empty(), "{:#?}", denials(&tm));
    ledger_verifies(&tm);
}

// ----- Node ---------------------------------------------------------------------------

/// `npm install` into `node_modules/`, `npm test`, and `npx prettier --write` of one file
/// under a one-file scope.
#[test]
fn node_npm_install_test_and_prettier() {
    if skip_unless(have("npm") && have("npx"), "npm is not installed") {
        return;
    }
    let tm = TestMount::builder()
        .policy(
            "intents:
  - id: NODE
    status: IN_PROGRESS
    owned_scope: [\"package.json\", \"package-lock.json\", \"node_modules/\", \"test.js\"]
  - id: FMT
    status: IN_PROGRESS
    owned_scope: [\"src/a.js\"]
output: [\"node_modules/\"]
approval:
  out_of_scope: deny
",
        )
        .files(&[
            ("package.json", "{\n  \"name\": \"demo\",\n  \"version\": \"1.0.0\",\n  \"scripts\": { \"test\": \"node test.js\" }\n}\n"),
            ("test.js", "const ms = require('ms');\nif (ms('2s') !== 2000) { process.exit(1); }\nconsole.log('node-tests-ok');\n"),
            ("src/a.js", "const  x = {a:1,\n b:2}\n"),
            ("src/b.js", "keep  =  1\n"),
        ])
        .mount();
    let out = agent_ok(
        &tm,
        "NODE",
        "npm install --no-audit --no-fund --loglevel=error ms@2 prettier@3 >/dev/null && npm test 2>&1",
    );
    assert!(out.contains("node-tests-ok"), "{out}");
    assert!(tm.w("node_modules/ms/package.json").exists());
    agent_ok(
        &tm,
        "FMT",
        "cat src/a.js >/dev/null && npx --no-install prettier --write src/a.js >/dev/null",
    );
    assert_eq!(
        String::from_utf8_lossy(&tm.ws_bytes("src/a.js")),
        "const x = { a: 1, b: 2 };\n"
    );
    assert_eq!(tm.ws_bytes("src/b.js"), b"keep  =  1\n");
    assert!(denials(&tm).is_empty(), "{:#?}", denials(&tm));
    ledger_verifies(&tm);
}

// ----- Python -------------------------------------------------------------------------

/// `python3 -m venv .venv`, `pip install` into it, `pytest`, and `black` of one file under a
/// one-file scope.
#[test]
fn python_venv_pip_pytest_and_black() {
    let py = "/usr/bin/python3";
    if skip_unless(
        Path::new(py).exists() && ok_status(&[py, "-c", "import venv, ensurepip"]),
        "/usr/bin/python3 with venv and ensurepip (python3-venv) is not installed",
    ) {
        return;
    }
    let tm = TestMount::builder()
        .policy(
            "intents:
  - id: PY
    status: IN_PROGRESS
    owned_scope: [\".venv/\", \"tests/**\", \"app.py\"]
  - id: FMT
    status: IN_PROGRESS
    owned_scope: [\"app.py\"]
output: [\".venv/\"]
approval:
  out_of_scope: deny
",
        )
        .files(&[
            ("app.py", "def double(x):\n    return x*2\n"),
            (
                "tests/test_app.py",
                "from app import double\n\ndef test_double():\n    assert double(2) == 4\n",
            ),
            ("other.py", "x=1\n"),
        ])
        .mount();
    let out = agent_ok(
        &tm,
        "PY",
        &format!(
            "{py} -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check pytest black >/dev/null && \
             PYTHONDONTWRITEBYTECODE=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests 2>&1 | tail -1"
        ),
    );
    assert!(out.contains("1 passed"), "{out}");
    agent_ok(
        &tm,
        "FMT",
        "cat app.py >/dev/null && .venv/bin/black -q app.py",
    );
    assert_eq!(
        String::from_utf8_lossy(&tm.ws_bytes("app.py")),
        "def double(x):\n    return x * 2\n"
    );
    assert_eq!(tm.ws_bytes("other.py"), b"x=1\n");
    assert!(denials(&tm).is_empty(), "{:#?}", denials(&tm));
    ledger_verifies(&tm);
}

fn ok_status(argv: &[&str]) -> bool {
    Command::new(argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

// ----- git by an agent ----------------------------------------------------------------

/// A long session's commits: each appends a line to `.git/logs/HEAD` (and the branch's),
/// which the mount judges write by write. Through the page cache an unaligned append
/// that crosses a 4 KiB page reached the daemon in two pieces, the first a cut line, and
/// every commit failed from then on (an attack pass's agent, after about 31 commits).
#[test]
fn a_hundred_commits_grow_the_reflog_past_its_first_pages() {
    let tm = TestMount::builder()
        .policy("intents:\n  - id: SRC\n    status: IN_PROGRESS\n    owned_scope: [\"src/**\"]\napproval:\n  out_of_scope: deny\n")
        .files(&[("src/a.rs", "a\n")])
        .setup(|ws| {
            ok(sh_in(ws, "git init -q -b main . && git add -A && git commit -qm init"), "git init");
        })
        .mount();
    let script = "n=0; for i in $(seq 1 100); do echo $i >> src/a.rs; git commit -qam \"commit number $i of a long session\" && n=$((n+1)); done; echo committed=$n";
    let out = intentfs()
        .arg("run")
        .arg("--mount")
        .arg(&tm.mnt)
        .args([
            "--intent", "SRC", "--agent", "tool", "--", "sh", "-c", script,
        ])
        .current_dir(&tm.mnt)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("committed=100"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(tm.ws.join(".git/logs/HEAD")).unwrap();
    assert!(log.len() > 3 * 4096, "{}", log.len());
    assert_eq!(log.lines().count(), 101);
    assert!(
        !tm.ledger().iter().any(|e| e["mutation_type"] == "DENIAL"),
        "a commit was refused"
    );
}

/// `status`/`diff`/`log` before the handshake neither fail nor count toward the breaker;
/// then add, commit, checkout -b, stash, rebase, merge, cherry-pick, gc.
#[test]
fn git_before_and_after_the_handshake() {
    let tm = TestMount::builder()
        .policy("intents:\n  - id: SRC\n    status: IN_PROGRESS\n    owned_scope: [\"src/**\"]\napproval:\n  out_of_scope: deny\n")
        .files(&[("src/a.rs", "a\n"), ("docs/d.md", "d\n")])
        .arg("--breaker")
        .arg("5")
        .setup(|ws| {
            ok(sh_in(ws, "git init -q -b main . && git add -A && git commit -qm init"), "git init");
        })
        .mount();
    // Before the handshake: looking around works, many times over, and trips nothing.
    let look = "for i in 1 2 3 4 5 6 7 8; do git status --short >/dev/null; git diff >/dev/null; git log --oneline >/dev/null; done; echo looked";
    let out = intentfs()
        .arg("run")
        .arg("--mount")
        .arg(&tm.mnt)
        .args(["--intents", "all", "--agent", "tool", "--", "sh", "-c"])
        .arg(format!("echo x >> src/a.rs; {look}; echo > .intentfs/intent; echo SRC > .intentfs/intent && echo y >> src/a.rs && echo wrote"))
        .current_dir(&tm.mnt)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("looked") && said.contains("wrote"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = tm.status();
    let refused: Vec<Value> = denials(&tm)
        .into_iter()
        .filter(|e| e["agent"]["name"] == "tool")
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "only the real refusal (src/a.rs before the handshake) counts: {refused:#?}"
    );
    assert_eq!(refused[0]["code"], "NO_INTENT");
    assert!(
        st["counters"]["probe_refusals"].as_u64().unwrap() > 0,
        "{st:#}"
    );
    assert!(
        !tm.ledger().iter().any(|e| e["mutation_type"] == "DENIAL"
            && e["path"].as_str().unwrap_or("").starts_with(".git")),
        "git's probes are not DENIAL entries"
    );
    let script = "set -e
        git add src && git commit -qm one
        git checkout -q -b feature
        echo f >> src/a.rs && git commit -qam feature
        git checkout -q main
        echo w > src/w.rs && git add src/w.rs && git stash -q && git stash pop -q && git add src/w.rs && git commit -qm wip
        git merge -q --no-edit feature
        git checkout -q -b side main~1
        echo s > src/s.rs && git add src/s.rs && git commit -qm side
        git rebase -q main
        git checkout -q main && git cherry-pick side >/dev/null
        git gc -q
        git log --format=%s | head -3";
    let log = agent_ok(&tm, "SRC", script);
    assert!(log.starts_with("side\n"), "{log}");
    assert_eq!(tm.ws_bytes("docs/d.md"), b"d\n");
    ledger_verifies(&tm);
}

// ----- editors and stream tools on a one-file scope -------------------------------------

/// `sed -i`, `perl -pi`, vim with its default swap and backup files, Python's `tempfile` +
/// `os.replace`, and `ed`, each editing the one file its intent owns: the edit lands, the
/// tool's temporaries are gone, nothing else in the directory changed, and blame has the
/// changed line (a rename-over edit carries its line ranges).
#[test]
fn editors_and_stream_tools_on_a_one_file_scope() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .files(&[
            ("src/middleware/jwt.ts", "line 1\nline 2\nline 3\n"),
            ("src/middleware/other.ts", "other\n"),
        ])
        .mount();
    let listing = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(tm.w("src/middleware"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let steps: Vec<(&str, String, &str)> = vec![
        ("sed", "sed -i 's/line 2/sed 2/' src/middleware/jwt.ts".into(), "sed 2"),
        ("perl", "perl -pi -e 's/line 3/perl 3/' src/middleware/jwt.ts".into(), "perl 3"),
        (
            "python",
            format!(
                "{} -c \"import os, tempfile\np = 'src/middleware/jwt.ts'\nt = open(p).read().replace('line 1', 'py 1')\nfd, tmp = tempfile.mkstemp(dir='src/middleware')\nos.write(fd, t.encode()); os.close(fd); os.replace(tmp, p)\"",
                python()
            ),
            "py 1",
        ),
        ("ed", "printf ',s/sed 2/ed 2/\\nw\\nq\\n' | ed -s src/middleware/jwt.ts".into(), "ed 2"),
    ];
    for (name, script, want) in &steps {
        agent_ok(
            &tm,
            "INT-001",
            &format!("cat src/middleware/jwt.ts >/dev/null && {script}"),
        );
        let now = String::from_utf8_lossy(&tm.ws_bytes("src/middleware/jwt.ts")).into_owned();
        assert!(now.contains(want), "{name}: {now}");
        assert_eq!(
            listing(),
            ["jwt.ts", "other.ts"],
            "{name} left something behind"
        );
    }
    if have("vim") {
        agent_ok(
            &tm,
            "INT-001",
            "cat src/middleware/jwt.ts >/dev/null && vim -E -s -N -u DEFAULTS -c 'set swapfile writebackup' \
             -c '%s/perl 3/vim 3/' -c 'wq' src/middleware/jwt.ts",
        );
        let now = String::from_utf8_lossy(&tm.ws_bytes("src/middleware/jwt.ts")).into_owned();
        assert!(now.contains("vim 3"), "vim: {now}");
        assert_eq!(
            listing(),
            ["jwt.ts", "other.ts"],
            "vim left something behind"
        );
    } else {
        eprintln!("SKIPPED (vim part): vim is not installed");
    }
    assert_eq!(tm.ws_bytes("src/middleware/other.ts"), b"other\n");
    assert!(denials(&tm).is_empty(), "{:#?}", denials(&tm));
    // The rename-over edits carry ranges: blame attributes the edited lines to the agent.
    let b = intentfs()
        .args(["blame", "--json"])
        .arg(&tm.ws)
        .arg("src/middleware/jwt.ts")
        .output()
        .unwrap();
    let b: Value = serde_json::from_slice(&b.stdout).unwrap();
    let lines = b["lines"].as_array().unwrap();
    assert_eq!(lines[0]["text"], "py 1");
    assert_eq!(lines[0]["origin"], "ledger", "{b:#}");
    assert_eq!(lines[0]["agent"], "tool", "{b:#}");
    ledger_verifies(&tm);
}

// ----- archives and copies --------------------------------------------------------------

#[test]
fn archives_and_copies_into_scope() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .files(&[("docs/index.md", "docs\n")])
        .setup(|ws| {
            let src = ws.parent().unwrap().join("src-tree");
            for (p, c) in [("a/one.txt", "1\n"), ("a/b/two.txt", "2\n"), ("three.txt", "3\n")] {
                put(&src.join(p), c);
            }
            ok(sh_in(&src, "tar cf ../t.tar . && (command -v zip >/dev/null && zip -qr ../t.zip . || true)"), "archives");
        })
        .mount();
    let root = tm.root.display().to_string();
    let mut script = format!(
        "mkdir -p src/auth && tar xf {root}/t.tar -C src/auth && rsync -a {root}/src-tree/ src/auth/r/ && cp -a {root}/src-tree src/auth/c"
    );
    if have("unzip") && tm.root.join("t.zip").exists() {
        script.push_str(&format!(" && unzip -q {root}/t.zip -d src/auth/z"));
    }
    agent_ok(&tm, "INT-001", &script);
    for d in ["src/auth", "src/auth/r", "src/auth/c"] {
        assert_eq!(
            std::fs::read_to_string(tm.w(&format!("{d}/a/b/two.txt"))).unwrap(),
            "2\n",
            "{d}"
        );
    }
    assert_eq!(tm.ws_bytes("docs/index.md"), b"docs\n");
    assert!(denials(&tm).is_empty(), "{:#?}", denials(&tm));
    ledger_verifies(&tm);
}

/// An identity is never stale against its own writes, however it made them: truncate then
/// fill through a shared mapping and rename over (rust-lld), `fallocate`,
/// `copy_file_range`, plain writes — after it read the file being replaced.
#[test]
fn own_writes_never_make_an_identity_stale() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .files(&[("out/app", "old binary\n"), ("src.txt", "copied bytes\n")])
        .mount();
    let script = format!(
        r#"{py} -c "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
old = open('out/app', 'rb').read()
# rust-lld: O_CREAT|O_EXCL temp, ftruncate, fill through MAP_SHARED (the same fd, no dup
# whose close would flush), munmap, rename over.
fd = os.open('out/app.tmp1234', os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o755)
n = 1 << 20
os.ftruncate(fd, n)
p = libc.mmap(None, n, 3, 1, fd, 0)
ctypes.memmove(p, b'new image', 9)
ctypes.memset(p + 4096, 7, n - 4096)
libc.munmap(p, n)
os.rename('out/app.tmp1234', 'out/app')
os.close(fd)
# fallocate and copy_file_range on a file it read, then rename it over.
open('out/b', 'w').write('b')
open('out/b').read()
fd = os.open('out/b', os.O_RDWR)
os.posix_fallocate(fd, 0, 8192)
src = os.open('src.txt', os.O_RDONLY)
os.copy_file_range(src, fd, 13, 0, 0)
os.close(fd)
os.rename('out/b', 'out/app')
print('own-writes-ok')
""#,
        py = python()
    );
    let out = agent_ok(&tm, "ALL", &script);
    assert!(out.contains("own-writes-ok"), "{out}");
    assert!(denials(&tm).is_empty(), "{:#?}", denials(&tm));
    assert!(tm.ws_bytes("out/app").starts_with(b"copied bytes"));
    ledger_verifies(&tm);
}
