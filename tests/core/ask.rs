//! The ask/park path: an operation that needs a human answers `FsError::Ask`; the caller
//! parks it with a continuation (as the FUSE adapter's `governed` does); the decision runs
//! the continuation, which re-runs the operation or answers the refusal.

use crossbeam_channel::Receiver;
use intentfs::approval::{Decision, Grant};
use intentfs::guard::Code;
use intentfs::ledger::MutationType;

use super::*;

const ASK: &str = r#"
intents:
  - id: INT-001
    name: Source work
    status: IN_PROGRESS
    owned_scope: ["src/**"]
approval:
  out_of_scope: ask
  delete: ask
"#;

const FILES: &[(&str, &str)] = &[("src/a.rs", "fn a() {}\n"), ("lib/util.rs", "util\n")];

/// What the continuation was called with, and the operation's result when it re-ran.
type Outcome = Result<(), FsError>;

/// Run `op` as the adapter does (`Fs::drive`: on `Ask`, park it; the continuation re-runs
/// it, a later question in the re-run is parked again) and send the final result.
fn drive(c: &Core, op: impl Fn(&Core) -> Outcome + Send + Sync + 'static) -> Receiver<Outcome> {
    let (tx, rx) = crossbeam_channel::unbounded();
    // The re-run gets a `Core` view over the `Fs` it is handed (the same one).
    let view = c.clone();
    c.fs.drive(
        move |_fs| op(&view),
        move |r| {
            let _ = tx.send(r);
        },
    );
    rx
}

impl Core {
    fn broker(&self) -> &Broker {
        self.broker.as_deref().unwrap()
    }

    /// The one pending request (panics unless exactly one).
    /// The one pending request, once there is one: an approval's re-run runs on the
    /// broker's resume pool, so the question it asks next comes a moment after `decide`.
    fn pending_one(&self) -> intentfs::approval::PendingInfo {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let p = self.broker().pending();
            if !p.is_empty() || std::time::Instant::now() > deadline {
                assert_eq!(p.len(), 1, "{p:?}");
                return p.into_iter().next().unwrap();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn human(files: &'static [(&'static str, &'static str)]) -> Core {
    Core::build(
        ASK,
        Opts {
            who: Who::Human,
            files,
            ..Default::default()
        },
    )
}

fn approvals(c: &Core) -> Vec<intentfs::ledger::Entry> {
    c.of(MutationType::Approval)
}

#[test]
fn out_of_scope_asks_and_an_approval_once_reruns_the_operation() {
    let c = human(FILES);
    c.select("INT-001");
    // The bare operation only asks: nothing is made, nothing parked yet.
    match c.create("lib/new.rs", "x") {
        Err(FsError::Ask(spec)) => {
            assert_eq!(spec.rel, Path::new("lib/new.rs"));
            assert_eq!(spec.op.as_str(), "create");
            assert_eq!(spec.denial.code, Code::ScopeViolation);
        }
        other => panic!("expected Ask, got {other:?}"),
    }
    assert!(c.broker().pending().is_empty());
    let rx = drive(&c, |c| c.create("lib/new.rs", "new\n"));
    let p = c.pending_one();
    assert_eq!(
        (p.kind.as_str(), p.op.as_str(), p.path.as_str()),
        ("out_of_scope", "create", "lib/new.rs")
    );
    assert_eq!(p.intent.as_deref(), Some("INT-001"));
    assert!(rx.try_recv().is_err(), "answered before a decision");
    assert!(!c.exists("lib/new.rs"));
    assert!(c.broker().decide(
        p.id,
        Decision::Approved {
            grant: Grant::Once,
            by: "cli:uid=0".into()
        }
    ));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(c.backing("lib/new.rs"), "new\n");
    let a = approvals(&c);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].outcome, "approved");
    assert_eq!(a[0].path.as_deref(), Some("lib/new.rs"));
    assert_eq!(a[0].code.as_deref(), Some("SCOPE_VIOLATION"));
    let d = a[0].detail.as_ref().unwrap();
    assert_eq!(
        (
            d["grant"].as_str(),
            d["decided_by"].as_str(),
            d["op"].as_str()
        ),
        (Some("once"), Some("cli:uid=0"), Some("create"))
    );
    assert_eq!(c.at(MutationType::Create, "lib/new.rs").len(), 1);
    assert_eq!(c.at(MutationType::Write, "lib/new.rs").len(), 1);
    // "Once" was used up by the create: the next change there asks again.
    assert!(matches!(
        c.overwrite("lib/new.rs", "again"),
        Err(FsError::Ask(_))
    ));
    c.assert_ledger_clean();
}

#[test]
fn a_rejection_answers_the_refusal_and_changes_nothing() {
    let c = human(FILES);
    c.select("INT-001");
    let before = tree(&c.ws);
    let rx = drive(&c, |c| c.overwrite("lib/util.rs", "mine\n"));
    let p = c.pending_one();
    assert_eq!(p.op, "open-write");
    assert!(c.broker().decide(
        p.id,
        Decision::Rejected {
            by: "cli:uid=0".into()
        }
    ));
    let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(code(r), Code::ApprovalRejected);
    assert_eq!(tree(&c.ws), before);
    let a = approvals(&c);
    assert_eq!((a.len(), a[0].outcome.as_str()), (1, "rejected"));
    c.assert_denial("lib/util.rs", Code::ApprovalRejected, "open-write");
    // A second decision of the same request is refused: the continuation ran once.
    assert!(!c.broker().decide(
        p.id,
        Decision::Rejected {
            by: "cli:uid=0".into()
        }
    ));
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_file_grant_lasts_for_the_session_and_covers_later_operations() {
    let c = human(FILES);
    c.select("INT-001");
    let rx = drive(&c, |c| c.overwrite("lib/util.rs", "one\n"));
    let p = c.pending_one();
    assert!(c.broker().decide(
        p.id,
        Decision::Approved {
            grant: Grant::File,
            by: "desktop".into()
        }
    ));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    // No question any more for this file, but still for its neighbour.
    c.overwrite("lib/util.rs", "two\n").unwrap();
    c.setattr("lib/util.rs", chmod(0o600)).unwrap();
    assert_eq!(c.backing("lib/util.rs"), "two\n");
    assert!(matches!(c.create("lib/other.rs", ""), Err(FsError::Ask(_))));
    assert_eq!(approvals(&c).len(), 1);
    assert_eq!(c.at(MutationType::Write, "lib/util.rs").len(), 2);
}

fn once(c: &Core, id: u64) {
    let d = Decision::Approved {
        grant: Grant::Once,
        by: "cli:uid=0".into(),
    };
    assert!(c.broker().decide(id, d));
}

#[test]
fn a_rename_asks_for_each_name_in_turn() {
    let c = human(FILES);
    c.select("INT-001");
    // Both names are outside: one question per run of the operation. The first is granted
    // for the file, so the re-run after the second question finds it still granted.
    let rx = drive(&c, |c| c.rename("lib/util.rs", "lib/util2.rs"));
    let first = c.pending_one();
    assert_eq!(
        (first.path.as_str(), first.op.as_str()),
        ("lib/util.rs", "rename")
    );
    let d = Decision::Approved {
        grant: Grant::File,
        by: "cli:uid=0".into(),
    };
    assert!(c.broker().decide(first.id, d));
    let second = c.pending_one();
    assert_eq!(second.path, "lib/util2.rs");
    assert!(rx.try_recv().is_err());
    once(&c, second.id);
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(c.backing("lib/util2.rs"), "util\n");
    assert!(!c.exists("lib/util.rs"));
    assert_eq!(approvals(&c).len(), 2);
    let r = c.at(MutationType::Rename, "lib/util2.rs");
    assert_eq!(r[0].from.as_deref(), Some("lib/util.rs"));
}

/// Both names of a rename approved `once`: the re-run that asks for the second name used
/// the grant of the first, so without giving it back (`guard::identity::Run`) the next
/// re-run asked for the first again, and after four questions the rename failed with
/// EACCES although the human approved each.
/// A rename of two names outside the scope, its first question approved `once`: the
/// core, the rename's result to come, and the second question (pending).
fn rename_of_two_outside_names_approved_once_first(
) -> (Core, Receiver<Outcome>, intentfs::approval::PendingInfo) {
    let c = human(FILES);
    c.select("INT-001");
    let rx = drive(&c, |c| c.rename("lib/util.rs", "lib/util2.rs"));
    let first = c.pending_one();
    assert_eq!(first.path, "lib/util.rs");
    once(&c, first.id);
    let second = c.pending_one();
    assert_eq!(second.path, "lib/util2.rs");
    (c, rx, second)
}

#[test]
fn a_rename_approved_once_for_each_name_goes_through() {
    let (c, rx, second) = rename_of_two_outside_names_approved_once_first();
    once(&c, second.id);
    // The rename completes with no third question (one came, again for `lib/util.rs`,
    // before a run carried its grants to the next).
    let r = rx.recv_timeout(Duration::from_secs(10));
    assert!(
        c.broker().pending().is_empty(),
        "{:?}",
        c.broker().pending()
    );
    r.expect("the rename never completed").unwrap();
    assert_eq!(c.backing("lib/util2.rs"), "util\n");
}

#[test]
fn nobody_answering_in_time_refuses_with_approval_timeout() {
    let c = Core::build(
        ASK,
        Opts {
            who: Who::Human,
            files: FILES,
            timeout: Duration::from_millis(100),
            ..Default::default()
        },
    );
    c.select("INT-001");
    let rx = drive(&c, |c| c.create("lib/late.rs", ""));
    let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(code(r), Code::ApprovalTimeout);
    assert!(!c.exists("lib/late.rs"));
    assert_eq!(approvals(&c)[0].outcome, "timeout");
    c.assert_denial("lib/late.rs", Code::ApprovalTimeout, "create");
    assert!(c.broker().pending().is_empty());
}

#[test]
fn deletes_ask_when_the_policy_says_so() {
    let c = human(FILES);
    c.select("INT-001");
    let rx = drive(&c, |c| c.unlink("src/a.rs"));
    let p = c.pending_one();
    assert_eq!((p.kind.as_str(), p.op.as_str()), ("delete", "unlink"));
    assert!(c.exists("src/a.rs"));
    once(&c, p.id);
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert!(!c.exists("src/a.rs"));
    let del = c.at(MutationType::Delete, "src/a.rs");
    assert_eq!(del.len(), 1);
    assert_eq!(del[0].size, Some(10));
    assert_eq!(approvals(&c)[0].detail.as_ref().unwrap()["asked"], "delete");
}

#[test]
fn the_unattended_approvers_decide_at_once() {
    // Deny: the continuation runs before `park` returns, with the original refusal.
    let c = Core::build(
        ASK,
        Opts {
            who: Who::Deny,
            files: FILES,
            ..Default::default()
        },
    );
    c.select("INT-001");
    let rx = drive(&c, |c| c.create("lib/no.rs", ""));
    let r = rx.try_recv().expect("decided inline");
    assert_eq!(code(r), Code::ScopeViolation);
    assert!(!c.exists("lib/no.rs"));
    let a = approvals(&c);
    assert_eq!(a[0].outcome, "rejected");
    assert_eq!(a[0].detail.as_ref().unwrap()["decided_by"], "approver:deny");
    c.assert_denial("lib/no.rs", Code::ScopeViolation, "create");

    // Allow: granted once, the re-run succeeds inline.
    let c = Core::build(
        ASK,
        Opts {
            who: Who::Allow,
            files: FILES,
            ..Default::default()
        },
    );
    c.select("INT-001");
    let rx = drive(&c, |c| c.create("lib/yes.rs", "y"));
    rx.try_recv().expect("decided inline").unwrap();
    assert_eq!(c.backing("lib/yes.rs"), "y");
    let a = approvals(&c);
    assert_eq!(a[0].outcome, "approved");
    assert_eq!(
        a[0].detail.as_ref().unwrap()["decided_by"],
        "approver:allow"
    );
    assert!(c.of(MutationType::Denial).is_empty());
    c.assert_ledger_clean();
}

/// The single-use grant a rename's run spent before stopping to ask about its second name
/// is carried to the rename's next run only: nothing else the agent does meanwhile can
/// spend it, and when the human then says no, no grant is left behind.
#[test]
fn a_grant_carried_between_runs_serves_that_operation_only() {
    let (c, rx, second) = rename_of_two_outside_names_approved_once_first();
    // Meanwhile, another operation on the first name asks for itself.
    match c.overwrite("lib/util.rs", "mine\n") {
        Err(FsError::Ask(spec)) => assert_eq!(spec.rel, Path::new("lib/util.rs")),
        other => panic!("the carried grant was spent by another operation: {other:?}"),
    }
    assert_eq!(c.backing("lib/util.rs"), "util\n");
    let no = Decision::Rejected {
        by: "cli:uid=0".into(),
    };
    assert!(c.broker().decide(second.id, no));
    let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(code(r), Code::ApprovalRejected);
    assert!(c.exists("lib/util.rs") && !c.exists("lib/util2.rs"));
    assert!(matches!(
        c.overwrite("lib/util.rs", "mine\n"),
        Err(FsError::Ask(_))
    ));
}

/// "Expand scope" of a path with glob metacharacters (Next.js' `app/[id]/page.tsx`): the
/// glob recorded for the human, like the grant in force for the session, names that file
/// only. (The record used the raw path as a glob, which matched `app/i/page.tsx` and not
/// the approved file.)
#[test]
fn an_expanded_scope_names_the_approved_path_literally() {
    let c = human(FILES);
    c.select("INT-001");
    std::fs::create_dir_all(c.w("lib/[id]")).unwrap();
    std::fs::create_dir_all(c.w("lib/i")).unwrap();
    let rx = drive(&c, |c| c.create("lib/[id]/page.tsx", "page\n"));
    let p = c.pending_one();
    assert_eq!(p.path, "lib/[id]/page.tsx");
    let d = Decision::Approved {
        grant: Grant::ExpandScope,
        by: "cli:uid=0".into(),
    };
    assert!(c.broker().decide(p.id, d));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(c.backing("lib/[id]/page.tsx"), "page\n");
    let text = std::fs::read_to_string(c.w(".orchestration/pending_scope_updates.json")).unwrap();
    let v: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    let glob = v[0]["glob"].as_str().unwrap().to_owned();
    let m = globset::Glob::new(&glob).unwrap().compile_matcher();
    assert!(
        m.is_match("lib/[id]/page.tsx"),
        "{glob} does not match the approved file"
    );
    assert!(!m.is_match("lib/i/page.tsx"), "{glob} matches another file");
    // The session's grant is as narrow: a sibling the raw glob would match still asks.
    assert!(matches!(
        c.create("lib/i/page.tsx", "other\n"),
        Err(FsError::Ask(_))
    ));
}

/// A single-use approval serves the operation that asked, and no other: when that
/// operation's re-run fails before it reaches the check (the agent renamed its in-scope
/// source away while the human read the question), the grant must not stay with the
/// identity for a later, different operation on the approved path to spend silently.
#[test]
fn a_once_grant_whose_operation_failed_is_not_left_for_another() {
    let c = human(FILES);
    c.select("INT-001");
    let rx = drive(&c, |c| c.rename("src/a.rs", "lib/moved.rs"));
    let p = c.pending_one();
    assert_eq!((p.path.as_str(), p.op.as_str()), ("lib/moved.rs", "rename"));
    // Meanwhile the agent moves its source away (in scope: no question).
    c.rename("src/a.rs", "src/b.rs").unwrap();
    once(&c, p.id);
    let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(matches!(r, Err(FsError::Os(libc::ENOENT))), "{r:?}");
    // The approval was for that rename: anything else at that path still asks.
    match c.create("lib/moved.rs", "anything the agent likes\n") {
        Err(FsError::Ask(spec)) => assert_eq!(spec.rel, Path::new("lib/moved.rs")),
        other => panic!("a grant outlived its operation and served another: {other:?}"),
    }
    assert!(!c.exists("lib/moved.rs"));
}
