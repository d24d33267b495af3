//! Versions (issue 20): `diff`, `restore`, `rewind`, `blame` after outside edits and the
//! audit `report`, on real mounts with agents started by `intentfs run --user` under another
//! uid, tools as agents use them (`sed -i`, Python, `mv`, `rm -r`, `git checkout`), and the
//! content store the daemon fills. Outcomes are checked on the backing files and the ledger.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Output;

use common::deploy::{chown_r, run_agent, text, Layout, AGENT_UID};
use common::*;
use serde_json::Value;

/// Debian's Python (.ci/run installs python3): the agent runs under another uid, which
/// cannot reach an interpreter in root's home.
const PY: &str = "/usr/bin/python3";

fn cli(args: &[&str]) -> Output {
    intentfs().args(args).output().expect("running intentfs")
}

fn ws_str(l: &Layout) -> &str {
    l.ws.to_str().unwrap()
}

/// The workspace is the agent uid's (it writes as itself); git's index is refreshed after
/// the chown (it records owners: a stale one makes the agent's git re-read every file).
fn own(l: &Layout) {
    chown_r(&l.ws, AGENT_UID);
    ok(
        sh_in(
            &l.ws,
            &format!("git -c safe.directory='*' update-index -q --refresh; chown {AGENT_UID}:{AGENT_UID} .git/index"),
        ),
        "refresh the index",
    );
}

/// A workspace the agent uid owns (it writes as itself), a git repository with a `feature`
/// branch, mounted with the allow-all policy; the human (root) uses intent ALL.
fn session(files: &[(&str, &str)]) -> (Layout, common::deploy::Mount) {
    let l = Layout::with(ALLOW_ALL, files);
    ok(
        sh_in(
            &l.ws,
            "git checkout -qb feature && echo feature > f.txt && echo 'readme, feature' > README && git add -A && git commit -qm feature && git checkout -q master 2>/dev/null || git checkout -q main",
        ),
        "feature branch",
    );
    own(&l);
    let (m, _) = l.mount(&["--allow-other", "--intent", "ALL"]);
    (l, m)
}

fn agent(l: &Layout, name: &str, script: &str) {
    let out = run_agent(l, &["--intent", "ALL", "--agent", name], script);
    assert!(
        out.status.success(),
        "agent {name} failed ({}): {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn json(out: Output, what: &str) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: not JSON ({e}), status {}: {}{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// The tree of the workspace without git's and intentfs's own directories.
fn files(ws: &Path) -> Vec<(String, &'static str, String, u32)> {
    tree(ws, &[".git", ".orchestration", ".intentfs"])
}

fn restored_paths(r: &Value, key: &str) -> Vec<String> {
    r[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn rewind_agent_returns_the_tree_byte_for_byte_and_keeps_what_others_did() {
    if !common::deploy::is_root() {
        panic!("this test needs root (an agent under another uid)");
    }
    let (l, _m) = session(&[
        ("src/a.txt", "one\ntwo\nthree\n"),
        ("src/b.py", "x = 1\ny = 2\n"),
        ("m.txt", "moved\n"),
        ("old/keep1.txt", "keep 1\n"),
        ("old/sub/keep2.txt", "keep 2\n"),
        ("old/script.sh", "#!/bin/sh\necho hi\n"),
        ("shared.txt", "shared\n"),
        ("other.txt", "other\n"),
        ("human.txt", "human\n"),
        ("README", "readme\n"),
    ]);
    // Modes and a symlink the removal must bring back.
    common::deploy::chmod(&l.ws.join("old/script.sh"), 0o755);
    common::deploy::chmod(&l.ws.join("old/sub"), 0o750);
    std::os::unix::fs::symlink("keep1.txt", l.ws.join("old/link")).unwrap();
    std::os::unix::fs::lchown(l.ws.join("old/link"), Some(AGENT_UID), Some(AGENT_UID)).unwrap();
    let before = files(&l.ws);

    let py = PY;
    agent(
        &l,
        "alice",
        &format!(
            "set -e
             sed -i s/two/TWO/ src/a.txt
             {py} -c \"open('src/b.py','w').write('x = 10\\ny = 2\\n')\"
             {py} -c \"open('src/new.py','w').write('print(1)\\n')\"
             mkdir newdir && echo n > newdir/n.txt && ln -s ../src/a.txt newdir/l
             mv m.txt moved.txt
             rm -r old
             chmod 600 src/a.txt
             echo alice >> shared.txt
             git checkout -q feature"
        ),
    );
    assert!(l.ws.join("f.txt").exists() && !l.ws.join("old").exists());
    // Later: another agent changes a file alice changed and one she did not; a human edits
    // one outside the mount.
    agent(
        &l,
        "bob",
        "set -e; echo bob >> shared.txt; echo bob >> other.txt",
    );
    std::fs::write(l.ws.join("human.txt"), "human, later\n").unwrap();

    // The kernel holds everything through the mount now (names, attributes, pages): the
    // rewind must make it drop what it changes.
    assert_eq!(files(&l.mnt), files(&l.ws));

    // A dry run changes nothing and reports the conflict.
    let snapshot = files(&l.ws);
    let dry = cli(&[
        "rewind",
        ws_str(&l),
        "--agent",
        "alice",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(dry.status.code(), Some(1), "{}", text(&dry.stderr));
    let dry = json(dry, "rewind --dry-run");
    assert_eq!(files(&l.ws), snapshot, "a dry run changed the workspace");
    assert_eq!(dry["dry_run"], true);

    let out = cli(&["rewind", ws_str(&l), "--agent", "alice", "--json"]);
    assert_eq!(out.status.code(), Some(1), "skipped something: exit 1");
    let r = json(out, "rewind");
    assert_eq!(
        restored_paths(&r, "restored"),
        restored_paths(&dry, "restored"),
        "the dry run said what the run did"
    );
    let skipped = r["skipped"].as_array().unwrap();
    let conflicts: Vec<&Value> = skipped.iter().filter(|s| s["conflict"] == true).collect();
    assert!(
        conflicts.iter().all(|c| c["path"] == "shared.txt") && !conflicts.is_empty(),
        "only shared.txt (bob wrote it after alice) conflicts: {r:#}"
    );
    assert!(
        skipped
            .iter()
            .any(|s| s["reason"].as_str().unwrap().contains("git moved HEAD")),
        "the ref move is named: {r:#}"
    );

    // Byte for byte, modes and symlinks included: everything alice did is undone; bob's
    // and the human's changes stay, and so does the conflicting file.
    let mut want = before.clone();
    for (p, _, c, _) in want.iter_mut() {
        match p.as_str() {
            "shared.txt" => *c = describe(b"shared\nalice\nbob\n"),
            "other.txt" => *c = describe(b"other\nbob\n"),
            "human.txt" => *c = describe(b"human, later\n"),
            _ => {}
        }
    }
    assert_eq!(files(&l.ws), want);
    // The mount shows the same. (That the kernel drops what it cached of a restored name
    // before the command returns is what the restore test checks: it fails without it.)
    assert_eq!(
        files(&l.mnt),
        want,
        "the mount disagrees with the workspace"
    );

    // Every step is on record, by the operator, naming the entry it undid.
    let ledger = l.ledger();
    let steps: Vec<&Value> = ledger
        .iter()
        .filter(|e| e["detail"]["restore"]["command"] == "rewind")
        .collect();
    let done = r["restored"].as_array().unwrap().len() + r["removed"].as_array().unwrap().len();
    assert!(
        steps.len() >= done,
        "{} entries for {done} steps",
        steps.len()
    );
    assert!(steps.iter().all(|e| e["agent"]["name"] == "operator"));
    let ids: Vec<&str> = ledger.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert!(steps
        .iter()
        .all(|e| ids.contains(&e["detail"]["restore"]["entry"].as_str().unwrap())));
    // The chain verifies, and the record matches the disk: every step is on it (the
    // human's file was never written through the mount, so it is no drift).
    let v = json(
        cli(&["ledger", "verify", ws_str(&l), "--json"]),
        "ledger verify",
    );
    assert_eq!(v["ok"], true, "{v:#}");

    // --force overwrites the conflict; the version it overwrote is kept in the store.
    let forced = json(
        cli(&[
            "rewind",
            ws_str(&l),
            "--agent",
            "alice",
            "--force",
            "--json",
        ]),
        "rewind --force",
    );
    assert_eq!(
        std::fs::read_to_string(l.ws.join("shared.txt")).unwrap(),
        "shared\n"
    );
    let kept = forced["restored"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == "shared.txt" && d["forced"] == true)
        .unwrap_or_else(|| panic!("no forced step for shared.txt: {forced:#}"));
    let hash = kept["kept"].as_str().unwrap();
    let store = intentfs::store::Store::open_existing(&l.ws.join(".orchestration/objects"))
        .unwrap()
        .unwrap();
    assert!(
        store.get(hash).unwrap().is_some(),
        "the overwritten version {hash} is not in the store"
    );
}

#[test]
fn restore_brings_a_deleted_file_back_through_the_mount() {
    let (l, _m) = session(&[("notes/plan.md", "step 1\nstep 2\n")]);
    common::deploy::chmod(&l.ws.join("notes/plan.md"), 0o640);
    agent(
        &l,
        "alice",
        "set -e; echo 'step 3' >> notes/plan.md; rm -r notes",
    );
    // The kernel has seen it gone.
    assert!(std::fs::metadata(l.mnt.join("notes/plan.md")).is_err());
    let out = cli(&["restore", ws_str(&l), "notes/plan.md", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = json(out, "restore");
    assert_eq!(restored_paths(&r, "restored"), vec!["notes/plan.md"]);
    // The last version on record: the one deleted, with its mode, visible through the
    // mount at once.
    assert_eq!(
        std::fs::read_to_string(l.mnt.join("notes/plan.md")).unwrap(),
        "step 1\nstep 2\nstep 3\n"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(l.ws.join("notes/plan.md"))
            .unwrap()
            .mode()
            & 0o7777,
        0o640
    );
    // An earlier version by its entry.
    let ledger = l.ledger();
    let first_write = ledger
        .iter()
        .position(|e| {
            e["mutation_type"] == "WRITE"
                && e["path"] == "notes/plan.md"
                && e["agent"]["name"] == "alice"
        })
        .unwrap();
    let line = format!("#{}", first_write + 1);
    // `--to` a WRITE: the version it left (the same here); `--before` it: the original.
    let t = ledger[first_write]["timestamp"].as_str().unwrap();
    ok(
        cli(&["restore", ws_str(&l), "notes/plan.md", "--before", t]),
        "restore --before",
    );
    assert_eq!(
        std::fs::read_to_string(l.mnt.join("notes/plan.md")).unwrap(),
        "step 1\nstep 2\n"
    );
    ok(
        cli(&["restore", ws_str(&l), "notes/plan.md", "--to", &line]),
        "restore --to",
    );
    assert_eq!(
        std::fs::read_to_string(l.mnt.join("notes/plan.md")).unwrap(),
        "step 1\nstep 2\nstep 3\n"
    );
    // Each restore is a WRITE by the operator naming the entry whose version it put back.
    let ledger = l.ledger();
    let restores: Vec<&Value> = ledger
        .iter()
        .filter(|e| e["detail"]["restore"]["command"] == "restore")
        .collect();
    assert!(restores
        .iter()
        .all(|e| e["agent"]["name"] == "operator" && e["agent"]["uid"] == 0));
    // The deleted directory was made again on the way, then the file written three times.
    assert_eq!(restores[0]["mutation_type"], "MKDIR", "{restores:#?}");
    assert_eq!(restores[0]["path"], "notes");
    let writes: Vec<&&Value> = restores
        .iter()
        .filter(|e| e["mutation_type"] == "WRITE")
        .collect();
    assert_eq!(writes.len(), 3, "{restores:#?}");
    assert!(writes.iter().all(|e| e["content_hash"].is_string()));
    assert_eq!(
        restores.last().unwrap()["detail"]["restore"]["entry"],
        ledger[first_write]["id"]
    );
    // Nothing on record for a path that never was.
    let bad = cli(&["restore", ws_str(&l), "nope.txt"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("records no content of nope.txt"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn diff_shows_a_rename_over_edit_and_an_agents_work() {
    let (l, _m) = session(&[("src/a.txt", "one\ntwo\nthree\n")]);
    agent(
        &l,
        "alice",
        &format!(
            "set -e; sed -i s/two/TWO/ src/a.txt; {} -c \"open('src/n.py','w').write('n = 1\\n')\"",
            PY
        ),
    );
    let ledger = l.ledger();
    let rename = ledger
        .iter()
        .position(|e| e["mutation_type"] == "RENAME" && e["path"] == "src/a.txt")
        .expect("sed -i renames over the file");
    let key = format!("#{}", rename + 1);
    let out = ok(cli(&["diff", ws_str(&l), &key]), "diff #N");
    assert!(out.contains("-two\n") && out.contains("+TWO\n"), "{out}");
    assert!(
        out.contains("--- a/src/a.txt") && out.contains("+++ b/src/a.txt"),
        "{out}"
    );
    let j = json(cli(&["diff", ws_str(&l), &key, "--json"]), "diff --json");
    assert_eq!(j[0]["path"], "src/a.txt");
    assert_eq!(
        (j[0]["added"].as_u64(), j[0]["removed"].as_u64()),
        (Some(1), Some(1))
    );
    // The same by an id prefix.
    let id = ledger[rename]["id"].as_str().unwrap();
    // (A prefix of digits only is read as a line number: up to a letter, 8 at least.)
    let n = id
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or(id.len(), |i| (i + 1).max(8));
    let by_id = ok(cli(&["diff", ws_str(&l), &id[..n]]), "diff id");
    assert!(by_id.contains("+TWO"), "{by_id}");
    // Everything alice changed, per file: the edit and the new file, not sed's temporary.
    let stat = ok(
        cli(&["diff", ws_str(&l), "--agent", "alice", "--stat"]),
        "diff --stat",
    );
    assert!(
        stat.contains("src/a.txt") && stat.contains("+1 -1"),
        "{stat}"
    );
    assert!(
        stat.contains("src/n.py") && stat.contains("(new)"),
        "{stat}"
    );
    assert!(stat.contains("2 file(s) changed"), "{stat}");
    // The path over time.
    let p = ok(
        cli(&["diff", ws_str(&l), "--path", "src/a.txt"]),
        "diff --path",
    );
    assert!(p.contains("+TWO"), "{p}");
    // An entry that changed no content says so.
    let mount_line = ledger
        .iter()
        .position(|e| e["mutation_type"] == "MOUNT")
        .unwrap()
        + 1;
    let bad = cli(&["diff", ws_str(&l), &format!("#{mount_line}")]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn blame_after_a_human_append_keeps_the_agents_lines() {
    let (l, _m) = session(&[]);
    agent(
        &l,
        "alice",
        &format!(
            "{} -c \"open('code.rs','w').write('fn a() {{}}\\nfn b() {{}}\\nfn c() {{}}\\n')\"",
            PY
        ),
    );
    // (`--record async`, the suite's third pass: the agent's close is on record before the
    // human edits; an edit that comes first leaves the close's entry without a hash.)
    let _ = std::fs::read(l.mnt.join(".intentfs/status"));
    // A human appends outside the mount.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(l.ws.join("code.rs"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"// human note\n").unwrap();
    drop(f);
    let b = json(cli(&["blame", ws_str(&l), "code.rs", "--json"]), "blame");
    let lines = b["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 4, "{b:#}");
    for l in &lines[..3] {
        assert_eq!(l["origin"], "ledger", "{b:#}");
        assert_eq!(l["agent"], "alice", "{b:#}");
    }
    assert_eq!(lines[3]["origin"], "changed_outside", "{b:#}");
    assert!(
        b["warning"]
            .as_str()
            .unwrap()
            .contains("1 line(s) added or changed"),
        "{b:#}"
    );
}

#[test]
fn report_loads_in_a_headless_browser_and_shows_the_session() {
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| common::deploy::have(c))
        .expect("chromium is needed (apt-get install chromium; .ci/run installs it)");
    let l = Layout::with(&example_deny(), &[("docs/guide.md", "# Guide\nold line\n")]);
    own(&l);
    let (_m, _) = l.mount(&["--allow-other"]);
    let out = run_agent(
        &l,
        &["--intent", "INT-002", "--agent", "writer"],
        "sed -i 's/old line/new line/' docs/guide.md; echo x >> src/auth/session.ts; true",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A human edits it outside the mount; the operator puts the agent's version back.
    std::fs::write(l.ws.join("docs/guide.md"), "# Guide\nhuman line\n").unwrap();
    ok(cli(&["restore", ws_str(&l), "docs/guide.md"]), "restore");
    assert_eq!(
        std::fs::read_to_string(l.ws.join("docs/guide.md")).unwrap(),
        "# Guide\nnew line\n"
    );
    let html = l.root.join("report.html");
    ok(
        cli(&["report", ws_str(&l), "--html", html.to_str().unwrap()]),
        "report --html",
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("http://") && !page.contains("https://") && !page.contains(" src="));
    let j = json(cli(&["report", ws_str(&l), "--json"]), "report --json");
    assert_eq!(j["verification"]["intact"], true);
    assert!(!j["refusals"].as_array().unwrap().is_empty(), "{j:#}");

    let profile = l.root.join("chromium-profile");
    let run = |extra: &[&str]| {
        let mut c = std::process::Command::new(chromium);
        c.args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", html.display()));
        run_timeout(c, std::time::Duration::from_secs(60))
    };
    let dom = run(&["--dump-dom"]);
    assert!(dom.status.success(), "chromium: {}", text(&dom.stderr));
    let d = text(&dom.stdout);
    // The script ran to its end (it marks the body), and the session is on the page.
    assert!(
        d.contains("data-ready=\"1\""),
        "the page's script did not run: {d}"
    );
    for want in [
        "writer",
        "INT-002",
        "docs/guide.md",
        "new line",
        "chain intact",
        "SCOPE_VIOLATION",
        "operator",
    ] {
        assert!(d.contains(want), "{want:?} is not on the page");
    }
    let log = text(&dom.stderr);
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .collect();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    // The screenshot is kept as an artifact: target/report.png.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("report.png");
    let s = run(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=1280,2000",
    ]);
    assert!(s.status.success(), "{}", text(&s.stderr));
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "empty screenshot"
    );
}

#[test]
fn restore_and_rewind_work_unmounted_and_stay_on_the_chain() {
    let (l, m) = session(&[("a.txt", "a\n")]);
    agent(&l, "alice", "set -e; echo more >> a.txt; echo new > b.txt");
    drop(m);
    assert!(!is_mounted(&l.mnt));
    let r = json(
        cli(&["rewind", ws_str(&l), "--agent", "alice", "--json"]),
        "rewind unmounted",
    );
    assert_eq!(r["skipped"].as_array().unwrap().len(), 0, "{r:#}");
    assert_eq!(std::fs::read_to_string(l.ws.join("a.txt")).unwrap(), "a\n");
    assert!(!l.ws.join("b.txt").exists());
    let v = json(cli(&["ledger", "verify", ws_str(&l), "--json"]), "verify");
    assert_eq!(v["chain_intact"], true, "{v:#}");
    assert!(v["drift"].as_array().unwrap().is_empty(), "{v:#}");
    // Nothing to rewind for an agent that did nothing.
    let none = cli(&["rewind", ws_str(&l), "--agent", "nobody"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        text(&none.stderr).contains("nothing to rewind"),
        "{}",
        text(&none.stderr)
    );
}
