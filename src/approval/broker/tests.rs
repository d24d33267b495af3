//! Broker tests without any channel: the table, the timeout, shutdown, the unattended modes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver};

use super::*;
use crate::approval::SCOPE_UPDATES_FILE;

pub(crate) fn config(mode: Mode, timeout: Duration, ws: &std::path::Path) -> BrokerConfig {
    BrokerConfig {
        mode,
        timeout,
        socket_path: None,
        owner_uid: 0,
        mountpoint: PathBuf::from("/mnt/agent"),
        workspace: ws.to_path_buf(),
    }
}

pub(crate) fn ask(kind: AskKind, path: &str) -> Ask {
    Ask {
        kind,
        identity: "session:42".into(),
        agent: "claude".into(),
        intent: Some("INT-001".into()),
        op: "open-write".into(),
        path: path.into(),
        suggested_glob: "src/db/**".into(),
        reason: None,
    }
}

/// A callback that sends its decision to the returned channel.
pub(crate) fn on() -> (OnDecision, Receiver<Decision>) {
    let (tx, rx) = unbounded();
    (Box::new(move |d| drop(tx.send(d))), rx)
}

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn timeout_decides_timed_out() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_millis(150), ws.path())).unwrap();
    let (cb, rx) = on();
    let id = b.ask(ask(AskKind::OutOfScope, "src/db/x.rs"), cb);
    assert_eq!(b.pending().len(), 1);
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), Decision::TimedOut);
    assert!(b.pending().is_empty());
    assert!(
        !b.decide(id, Decision::Rejected { by: "late".into() }),
        "a timed-out request is gone"
    );
    assert!(rx.try_recv().is_err(), "callback ran once");
}

#[test]
fn each_request_times_out_on_its_own_deadline() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_millis(400), ws.path())).unwrap();
    let (cb1, rx1) = on();
    let (cb2, rx2) = on();
    b.ask(ask(AskKind::Delete, "a"), cb1);
    std::thread::sleep(Duration::from_millis(250));
    b.ask(ask(AskKind::Delete, "b"), cb2);
    assert_eq!(rx1.recv_timeout(WAIT).unwrap(), Decision::TimedOut);
    // The second was asked 250 ms later: it is still pending when the first times out.
    assert_eq!(
        b.pending()
            .iter()
            .map(|p| p.path.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    assert_eq!(rx2.recv_timeout(WAIT).unwrap(), Decision::TimedOut);
}

#[test]
fn decide_twice_runs_the_callback_once() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_secs(60), ws.path())).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let (ran, ran_rx) = unbounded();
    let id = b.ask(
        ask(AskKind::OutOfScope, "x"),
        Box::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            let _ = ran.send(());
        }),
    );
    let approve = Decision::Approved {
        grant: Grant::Once,
        by: "test".into(),
    };
    assert!(b.decide(id, approve.clone()));
    assert!(!b.decide(id, approve));
    assert!(!b.decide(id, Decision::Rejected { by: "test".into() }));
    assert!(!b.decide(9999, Decision::TimedOut), "unknown id");
    // The callback runs on the resume pool: wait for it, then make sure of no second run.
    ran_rx.recv_timeout(WAIT).unwrap();
    b.shutdown();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(b.pending().is_empty());
}

#[test]
fn pending_describes_each_request() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_secs(60), ws.path())).unwrap();
    let (cb, _rx) = on();
    let id1 = b.ask(ask(AskKind::SensitiveRead, ".env"), cb);
    let (cb, _rx2) = on();
    let mut a = ask(AskKind::Delete, "old.txt");
    a.intent = None;
    a.op = "unlink".into();
    let id2 = b.ask(a, cb);
    assert!(id2 > id1);
    std::thread::sleep(Duration::from_millis(20));
    let p = b.pending();
    assert_eq!(p.len(), 2);
    assert_eq!(
        (p[0].id, p[0].kind.as_str(), p[0].path.as_str()),
        (id1, "sensitive_read", ".env")
    );
    assert_eq!(p[0].identity, "session:42");
    assert_eq!(p[0].agent, "claude");
    assert_eq!(p[0].intent.as_deref(), Some("INT-001"));
    assert!(p[0].age_ms >= 20, "{}", p[0].age_ms);
    assert_eq!(
        (
            p[1].id,
            p[1].kind.as_str(),
            p[1].op.as_str(),
            p[1].intent.clone()
        ),
        (id2, "delete", "unlink", None)
    );
}

#[test]
fn shutdown_rejects_every_pending_request() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_secs(60), ws.path())).unwrap();
    let rxs: Vec<_> = (0..3)
        .map(|i| {
            let (cb, rx) = on();
            b.ask(ask(AskKind::OutOfScope, &format!("f{i}")), cb);
            rx
        })
        .collect();
    b.shutdown();
    for rx in &rxs {
        assert_eq!(
            rx.try_recv().unwrap(),
            Decision::Rejected {
                by: "unmount".into()
            },
            "decided before shutdown returns"
        );
    }
    assert!(b.pending().is_empty());
    // Asking after unmount is refused at once; shutting down again is harmless.
    let (cb, rx) = on();
    b.ask(ask(AskKind::OutOfScope, "late"), cb);
    assert_eq!(
        rx.try_recv().unwrap(),
        Decision::Rejected {
            by: "unmount".into()
        }
    );
    b.shutdown();
}

#[test]
fn dropping_the_broker_rejects_pending_requests() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_secs(60), ws.path())).unwrap();
    let (cb, rx) = on();
    b.ask(ask(AskKind::OutOfScope, "x"), cb);
    drop(b);
    assert_eq!(
        rx.try_recv().unwrap(),
        Decision::Rejected {
            by: "unmount".into()
        }
    );
}

#[test]
fn a_callback_may_unmount_from_the_timeout_thread() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_millis(50), ws.path())).unwrap();
    let weak = Arc::downgrade(&b);
    let (tx, rx) = unbounded();
    b.ask(
        ask(AskKind::OutOfScope, "x"),
        Box::new(move |d| {
            if let Some(b) = weak.upgrade() {
                b.shutdown();
            }
            tx.send(d).unwrap();
        }),
    );
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), Decision::TimedOut);
}

#[test]
fn deny_and_allow_decide_at_once() {
    let ws = tempfile::tempdir().unwrap();
    for (mode, want) in [
        (
            Mode::Deny,
            Decision::Rejected {
                by: "approver:deny".into(),
            },
        ),
        (
            Mode::Allow,
            Decision::Approved {
                grant: Grant::Once,
                by: "approver:allow".into(),
            },
        ),
    ] {
        let b = Broker::start(config(mode, Duration::from_secs(60), ws.path())).unwrap();
        let (cb, rx) = on();
        b.ask(ask(AskKind::SensitiveRead, ".env"), cb);
        // Inline: the decision is there when `ask` returns.
        assert_eq!(rx.try_recv().unwrap(), want, "{mode:?}");
        assert!(b.pending().is_empty());
    }
}

#[test]
fn expand_scope_is_recorded_in_the_workspace() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_secs(60), ws.path())).unwrap();
    let (cb, rx) = on();
    let id = b.ask(ask(AskKind::OutOfScope, "src/db/pool.rs"), cb);
    assert!(b.decide(
        id,
        Decision::Approved {
            grant: Grant::ExpandScope,
            by: "cli:uid=0".into()
        }
    ));
    assert_eq!(
        rx.recv_timeout(WAIT).unwrap(),
        Decision::Approved {
            grant: Grant::ExpandScope,
            by: "cli:uid=0".into()
        }
    );
    let v: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(ws.path().join(SCOPE_UPDATES_FILE)).unwrap())
            .unwrap();
    assert_eq!(v.len(), 1);
    assert_eq!(
        (
            v[0]["intent"].as_str(),
            v[0]["glob"].as_str(),
            v[0]["path"].as_str()
        ),
        (Some("INT-001"), Some("src/db/**"), Some("src/db/pool.rs"))
    );
    // Other grants record nothing.
    let (cb, _rx) = on();
    let id = b.ask(ask(AskKind::OutOfScope, "src/other.rs"), cb);
    assert!(b.decide(
        id,
        Decision::Approved {
            grant: Grant::File,
            by: "t".into()
        }
    ));
    let v: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(ws.path().join(SCOPE_UPDATES_FILE)).unwrap())
            .unwrap();
    assert_eq!(v.len(), 1);
}

#[test]
fn trip_announcements_outside_desktop_mode_only_log() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_secs(60), ws.path())).unwrap();
    b.announce_trip("session:42", "claude", 20);
    assert_eq!(b.inner.prompts.live(), 0);
}

/// A callback waits on the channel it returns; dropping or sending on the sender lets it go.
fn blocking_on() -> (
    OnDecision,
    Receiver<Decision>,
    crossbeam_channel::Sender<()>,
) {
    let (release, released) = unbounded::<()>();
    let (tx, rx) = unbounded();
    let cb: OnDecision = Box::new(move |d| {
        let _ = released.recv();
        drop(tx.send(d));
    });
    (cb, rx, release)
}

#[test]
fn deciding_does_not_wait_for_the_callback() {
    let ws = tempfile::tempdir().unwrap();
    let b = Broker::start(config(Mode::Cli, Duration::from_secs(60), ws.path())).unwrap();
    let (slow_cb, slow_rx, release) = blocking_on();
    let slow = b.ask(ask(AskKind::OutOfScope, "slow"), slow_cb);
    let (quick_cb, quick_rx) = on();
    let quick = b.ask(ask(AskKind::Delete, "quick"), quick_cb);

    // Decide from another thread, as a socket client does, so that a decide that waits
    // for the callback shows as a timeout here rather than hanging the test.
    let approve = Decision::Approved {
        grant: Grant::Once,
        by: "cli:uid=0".into(),
    };
    let (done_tx, done_rx) = unbounded();
    {
        let (b, d) = (b.clone(), approve.clone());
        std::thread::spawn(move || {
            let _ = done_tx.send(b.decide(slow, d));
        });
    }
    assert_eq!(
        done_rx.recv_timeout(Duration::from_secs(2)),
        Ok(true),
        "decide returned while its callback is still blocked"
    );
    assert!(slow_rx.try_recv().is_err(), "the callback is still blocked");
    // Another decision's callback runs meanwhile: a blocked callback holds one thread only.
    assert!(b.decide(quick, Decision::Rejected { by: "t".into() }));
    assert_eq!(
        quick_rx.recv_timeout(WAIT).unwrap(),
        Decision::Rejected { by: "t".into() }
    );

    // Unmount with the slow callback still running and three requests pending: shutdown
    // waits for all of them, and each runs exactly once.
    let counts: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    for (i, c) in counts.iter().enumerate() {
        let c = c.clone();
        b.ask(
            ask(AskKind::OutOfScope, &format!("p{i}")),
            Box::new(move |d| {
                assert_eq!(
                    d,
                    Decision::Rejected {
                        by: "unmount".into()
                    }
                );
                c.fetch_add(1, Ordering::SeqCst);
            }),
        );
    }
    let (stopped_tx, stopped_rx) = unbounded();
    {
        let b = b.clone();
        std::thread::spawn(move || {
            b.shutdown();
            let _ = stopped_tx.send(());
        });
    }
    assert!(
        stopped_rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "shutdown waits for the blocked callback"
    );
    release.send(()).unwrap();
    stopped_rx.recv_timeout(WAIT).unwrap();
    assert_eq!(slow_rx.try_recv().unwrap(), approve);
    for (i, c) in counts.iter().enumerate() {
        assert_eq!(c.load(Ordering::SeqCst), 1, "pending request {i}");
    }
    assert!(slow_rx.try_recv().is_err() && quick_rx.try_recv().is_err());
}
