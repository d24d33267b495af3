//! The desktop approval channel against a real notification daemon on a real bus.
//!
//! One private desktop per test process: `Xvfb` on a free display, a `dbus-daemon` with no
//! service directories (so nothing gets auto-activated behind our back), and `dunst` with
//! a config whose `dmenu` is a script that picks the action the test asks for. The test
//! then acts as the person: `dunstctl context` opens dunst's action menu through that
//! script, `dunstctl close` closes the newest notification. The broker finds the bus the
//! way the daemon does: through `DBUS_SESSION_BUS_ADDRESS` in its environment.
//!
//! Skipped (passing, with a reason) only when Xvfb, dunst or dbus-daemon is not installed
//! (`apt-get install -y dbus xvfb dunst`).

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver};
use intentfs::approval::{
    desktop_available, Ask, AskKind, Broker, BrokerConfig, Decision, Grant, Mode,
};

/// How long any single step may take before the test fails.
const STEP: Duration = Duration::from_secs(15);

/// The private desktop: where its files are and the bus address.
struct Desk {
    /// Holds the dmenu script, its `want` file and logs.
    dir: PathBuf,
    /// The session bus address (also exported in this process's environment).
    bus: String,
}

static DESK: OnceLock<Result<Desk, String>> = OnceLock::new();
/// One notification daemon for all tests: they take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// The desktop, started on first use, with no notification left open; `None`: skip.
fn desk() -> Option<(MutexGuard<'static, ()>, &'static Desk)> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for bin in ["Xvfb", "dunst", "dunstctl", "dbus-daemon", "dbus-send"] {
        if !on_path(bin) {
            eprintln!("skipped: `{bin}` is not installed (apt-get install -y dbus xvfb dunst)");
            return None;
        }
    }
    let d = match DESK.get_or_init(start_desk) {
        Ok(d) => d,
        Err(e) => panic!("cannot start the test desktop: {e}"),
    };
    dunstctl(&["close-all"]);
    wait_displayed(0);
    std::fs::write(d.dir.join("want"), "").unwrap();
    Some((guard, d))
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

/// Reads the first line a child prints on stdout (Xvfb's display, dbus-daemon's address).
fn first_line(child: &mut std::process::Child, what: &str) -> Result<String, String> {
    let out = child.stdout.take().ok_or(format!("{what}: no stdout"))?;
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| format!("{what}: {e}"))?;
    let line = line.trim().to_string();
    if line.is_empty() {
        return Err(format!("{what} exited without printing its address"));
    }
    Ok(line)
}

fn start_desk() -> Result<Desk, String> {
    let dir = tempfile::Builder::new()
        .prefix("intentfs-desk-")
        .tempdir()
        .map_err(|e| e.to_string())?
        .keep();
    let mut pids = Vec::new();

    // Xvfb picks a free display itself and tells us which on fd 1.
    let mut x = Command::new("Xvfb")
        .args([
            "-displayfd",
            "1",
            "-nolisten",
            "tcp",
            "-screen",
            "0",
            "1024x768x24",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("Xvfb: {e}"))?;
    pids.push(x.id());
    let display = format!(":{}", first_line(&mut x, "Xvfb")?);

    let conf = dir.join("bus.conf");
    std::fs::write(
        &conf,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
            dir.join("bus").display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut bus = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", conf.display()))
        .args(["--nofork", "--print-address=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("dbus-daemon: {e}"))?;
    pids.push(bus.id());
    let address = first_line(&mut bus, "dbus-daemon")?;

    // dunst's action menu: picks the line whose text contains the wanted pattern (the
    // file's path is in the summary) and whose action key is the wanted key. Each menu
    // line is "#<label> (<summary>) [<notification id>,<action key>]".
    let script = dir.join("dmenu.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nwant='{want}'\npat=$(sed -n 1p \"$want\")\nkey=$(sed -n 2p \"$want\")\n: > \"$want\"\n\
             menu=$(cat)\nprintf '%s\\n---\\n' \"$menu\" >> '{log}'\n\
             printf '%s\\n' \"$menu\" | grep -F -e \"$pat\" | grep -F -e \",$key]\" | head -n 1\n",
            want = dir.join("want").display(),
            log = dir.join("menus.log").display(),
        ),
    )
    .map_err(|e| e.to_string())?;
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    std::fs::write(dir.join("want"), "").map_err(|e| e.to_string())?;
    let rc = dir.join("dunstrc");
    std::fs::write(
        &rc,
        format!(
            "[global]\n    dmenu = {} -p dunst\n    browser = /bin/true\n    notification_limit = 0\n    idle_threshold = 0\n\
             [urgency_low]\n    timeout = 0\n[urgency_normal]\n    timeout = 0\n[urgency_critical]\n    timeout = 0\n",
            script.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let log = std::fs::File::create(dir.join("dunst.log")).map_err(|e| e.to_string())?;
    let dunst = Command::new("dunst")
        .arg("-config")
        .arg(&rc)
        .env("DISPLAY", &display)
        .env("DBUS_SESSION_BUS_ADDRESS", &address)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("dunst: {e}"))?;
    pids.push(dunst.id());

    // Nothing outlives the test process: a watchdog tears the desktop down after it.
    let pid_list: Vec<String> = pids.iter().map(u32::to_string).collect();
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill {pids} 2>/dev/null; sleep 0.5; rm -rf '{dir}'",
            me = std::process::id(),
            pids = pid_list.join(" "),
            dir = dir.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("watchdog: {e}"))?;

    // The broker (zbus), dunstctl and this test all find the bus through the environment,
    // exactly as the daemon started from a desktop session would. Set once, before any
    // broker exists, while holding SERIAL.
    std::env::set_var("DBUS_SESSION_BUS_ADDRESS", &address);

    let start = Instant::now();
    while try_dunstctl(&["count", "displayed"]).is_none() {
        if start.elapsed() > STEP {
            let log = std::fs::read_to_string(dir.join("dunst.log")).unwrap_or_default();
            return Err(format!("dunst did not come up on {address}: {log}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Desk { dir, bus: address })
}

fn try_dunstctl(args: &[&str]) -> Option<String> {
    let out = Command::new("dunstctl")
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn dunstctl(args: &[&str]) -> String {
    try_dunstctl(args).unwrap_or_else(|| panic!("dunstctl {args:?} failed"))
}

fn displayed() -> usize {
    dunstctl(&["count", "displayed"])
        .trim()
        .parse()
        .expect("dunstctl count displayed")
}

/// Waits until dunst shows exactly `n` notifications.
fn wait_displayed(n: usize) {
    let start = Instant::now();
    loop {
        let now = displayed();
        if now == n {
            return;
        }
        assert!(
            start.elapsed() < STEP,
            "dunst shows {now} notifications, expected {n}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Waits until `n` prompts are on screen and their threads listen for actions. The
/// listening starts a few D-Bus round trips after the notification appears; a person is
/// never that fast, a script is.
fn wait_prompts(n: usize) {
    wait_displayed(n);
    std::thread::sleep(Duration::from_millis(400));
}

/// Acts as the person: opens dunst's action menu and picks `key` on the notification
/// whose summary contains `pattern`.
fn choose(d: &Desk, pattern: &str, key: &str) {
    std::fs::write(d.dir.join("want"), format!("{pattern}\n{key}\n")).unwrap();
    dunstctl(&["context"]);
}

/// The last action menu dunst showed.
fn last_menu(d: &Desk) -> String {
    let log = std::fs::read_to_string(d.dir.join("menus.log")).unwrap_or_default();
    log.trim_end()
        .trim_end_matches("---")
        .rsplit("---")
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

fn broker(timeout: Duration, ws: &Path) -> Arc<Broker> {
    Broker::start(BrokerConfig {
        mode: Mode::Desktop,
        timeout,
        socket_path: None,
        owner_uid: 0,
        mountpoint: "/mnt/agent".into(),
        workspace: ws.to_path_buf(),
    })
    .unwrap()
}

fn ask(kind: AskKind, path: &str) -> Ask {
    Ask {
        kind,
        identity: "session:4242".into(),
        agent: "claude".into(),
        intent: Some("INT-001".into()),
        op: match kind {
            AskKind::OutOfScope => "open-write",
            AskKind::SensitiveRead => "read",
            AskKind::Delete => "unlink",
        }
        .into(),
        path: path.into(),
        suggested_glob: "src/db/**".into(),
        reason: None,
    }
}

fn asked(b: &Broker, a: Ask) -> (u64, Receiver<Decision>) {
    let (tx, rx) = unbounded();
    let id = b.ask(a, Box::new(move |d| drop(tx.send(d))));
    (id, rx)
}

fn desktop(grant: Grant) -> Decision {
    Decision::Approved {
        grant,
        by: "desktop".into(),
    }
}

#[test]
fn approve_once() {
    let Some((_g, d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(60), ws.path());
    let (_, rx) = asked(&b, ask(AskKind::OutOfScope, "src/db/approve-me.rs"));
    wait_prompts(1);
    choose(d, "approve-me.rs", "approve");
    assert_eq!(rx.recv_timeout(STEP).unwrap(), desktop(Grant::Once));
    let menu = last_menu(d);
    for key in ["approve", "approve-file", "expand-scope", "reject"] {
        assert!(
            menu.contains(&format!(",{key}]")),
            "out-of-scope prompt offers {key}: {menu}"
        );
    }
    assert!(
        menu.contains("intentfs: approve write outside scope? src/db/approve-me.rs"),
        "{menu}"
    );
    // Decided: the broker closes the notification.
    wait_displayed(0);
    assert!(b.pending().is_empty());
}

#[test]
fn approve_for_the_file() {
    let Some((_g, d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(60), ws.path());
    let (_, rx) = asked(&b, ask(AskKind::SensitiveRead, "config/.env"));
    wait_prompts(1);
    choose(d, "config/.env", "approve-file");
    assert_eq!(rx.recv_timeout(STEP).unwrap(), desktop(Grant::File));
    let menu = last_menu(d);
    assert!(
        menu.contains(",approve-file]") && !menu.contains(",expand-scope]"),
        "{menu}"
    );
    wait_displayed(0);
}

#[test]
fn expand_scope_is_recorded() {
    let Some((_g, d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(60), ws.path());
    let (_, rx) = asked(&b, ask(AskKind::OutOfScope, "src/db/pool.rs"));
    wait_prompts(1);
    choose(d, "src/db/pool.rs", "expand-scope");
    assert_eq!(rx.recv_timeout(STEP).unwrap(), desktop(Grant::ExpandScope));
    let text = std::fs::read_to_string(ws.path().join(".orchestration/pending_scope_updates.json"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v[0]["glob"], "src/db/**", "{text}");
    assert_eq!(v[0]["intent"], "INT-001", "{text}");
    wait_displayed(0);
}

#[test]
fn reject() {
    let Some((_g, d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(60), ws.path());
    let (_, rx) = asked(&b, ask(AskKind::Delete, "src/keep.rs"));
    wait_prompts(1);
    choose(d, "src/keep.rs", "reject");
    assert_eq!(
        rx.recv_timeout(STEP).unwrap(),
        Decision::Rejected {
            by: "desktop".into()
        }
    );
    let menu = last_menu(d);
    assert!(
        !menu.contains(",approve-file]"),
        "a delete has no per-file grant: {menu}"
    );
    wait_displayed(0);
}

#[test]
fn closing_the_notification_rejects() {
    let Some((_g, _d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(60), ws.path());
    let (_, rx) = asked(&b, ask(AskKind::OutOfScope, "src/close-me.rs"));
    wait_prompts(1);
    dunstctl(&["close"]);
    assert_eq!(
        rx.recv_timeout(STEP).unwrap(),
        Decision::Rejected {
            by: "desktop".into()
        }
    );
    assert!(b.pending().is_empty());
}

#[test]
fn timeout_rejects_and_closes_the_notification() {
    let Some((_g, _d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_millis(1500), ws.path());
    let (_, rx) = asked(&b, ask(AskKind::SensitiveRead, ".env"));
    wait_displayed(1);
    assert_eq!(rx.recv_timeout(STEP).unwrap(), Decision::TimedOut);
    wait_displayed(0);
}

#[test]
fn ten_prompts_at_once() {
    let Some((_g, d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(120), ws.path());
    let asks: Vec<(u64, Receiver<Decision>)> = (0..10)
        .map(|i| asked(&b, ask(AskKind::OutOfScope, &format!("many/f{i}.rs"))))
        .collect();
    wait_prompts(10);
    assert_eq!(b.pending().len(), 10);

    // Meanwhile the broker keeps serving everything else: another request is decided
    // from the CLI side at once.
    let (other, other_rx) = asked(&b, ask(AskKind::Delete, "elsewhere.txt"));
    let t = Instant::now();
    assert!(b.decide(
        other,
        Decision::Rejected {
            by: "cli:uid=0".into()
        }
    ));
    assert_eq!(
        other_rx.recv_timeout(STEP).unwrap(),
        Decision::Rejected {
            by: "cli:uid=0".into()
        }
    );
    assert!(t.elapsed() < STEP);

    // Answer them out of order, half approved, half rejected.
    for i in [3, 0, 9, 1, 8, 2, 7, 4, 6, 5] {
        let key = if i % 2 == 0 { "approve" } else { "reject" };
        choose(d, &format!("many/f{i}.rs"), key);
        let got = asks[i]
            .1
            .recv_timeout(STEP)
            .unwrap_or_else(|e| panic!("prompt {i}: {e}; menu: {}", last_menu(d)));
        let want = if i % 2 == 0 {
            desktop(Grant::Once)
        } else {
            Decision::Rejected {
                by: "desktop".into(),
            }
        };
        assert_eq!(got, want, "prompt {i}");
    }
    for (i, (_, rx)) in asks.iter().enumerate() {
        assert!(rx.try_recv().is_err(), "prompt {i} decided twice");
    }
    assert!(b.pending().is_empty());
    wait_displayed(0);
}

#[test]
fn the_cli_answering_first_closes_the_notification() {
    let Some((_g, d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(60), ws.path());
    let (id, rx) = asked(&b, ask(AskKind::OutOfScope, "src/race.rs"));
    wait_prompts(1);
    assert!(b.decide(
        id,
        Decision::Approved {
            grant: Grant::Once,
            by: "cli:uid=0".into()
        }
    ));
    assert_eq!(
        rx.recv_timeout(STEP).unwrap(),
        Decision::Approved {
            grant: Grant::Once,
            by: "cli:uid=0".into()
        }
    );
    wait_displayed(0);
    // Nothing left for the person to answer, and nothing decides twice.
    choose(d, "src/race.rs", "reject");
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err());
}

#[test]
fn unmount_rejects_and_closes_every_prompt() {
    let Some((_g, _d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(60), ws.path());
    let (_, rx1) = asked(&b, ask(AskKind::OutOfScope, "src/u1.rs"));
    let (_, rx2) = asked(&b, ask(AskKind::Delete, "src/u2.rs"));
    wait_prompts(2);
    b.shutdown();
    let unmount = Decision::Rejected {
        by: "unmount".into(),
    };
    assert_eq!(rx1.try_recv().unwrap(), unmount);
    assert_eq!(rx2.try_recv().unwrap(), unmount);
    wait_displayed(0);
}

#[test]
fn approving_the_trip_notice_resets_the_breaker() {
    let Some((_g, d)) = desk() else { return };
    let ws = tempfile::tempdir().unwrap();
    let b = broker(Duration::from_secs(60), ws.path());
    let (tx, rx) = unbounded();
    b.set_reset_hook(Box::new(move |identity| {
        let _ = tx.send(identity.to_string());
        true
    }));
    b.announce_trip("session:77", "looper", 20);
    wait_prompts(1);
    choose(d, "looper", "approve");
    assert_eq!(rx.recv_timeout(STEP).unwrap(), "session:77");
    wait_displayed(0);
}

#[test]
fn the_bus_comes_from_the_environment() {
    let Some((_g, d)) = desk() else { return };
    assert_eq!(std::env::var("DBUS_SESSION_BUS_ADDRESS").unwrap(), d.bus);
    assert!(desktop_available(), "bus {} is reachable", d.bus);
    std::env::set_var(
        "DBUS_SESSION_BUS_ADDRESS",
        "unix:path=/nonexistent/intentfs-test-bus",
    );
    let unreachable = !desktop_available();
    std::env::set_var("DBUS_SESSION_BUS_ADDRESS", &d.bus);
    assert!(unreachable, "a dead address is not reachable");
}
