//! The query control files: `.intentfs/check` (may I?) and `.intentfs/approval` (ask a
//! human ahead). The agent writes a JSON request to an open file and reads the answer back
//! from offset 0 of the same file, so the question is asked and answered for the identity
//! of the process that asks (never one it names), like every other control file.
//!
//! `check` foresees what the operation would meet ([`Gate::dry_run`](crate::fs::Gate::dry_run)):
//! nothing is spent, counted, remembered or recorded.
//!
//! `approval` files the request with the same broker, channels and ledger as an operation
//! that stops to ask. The write only states the request; reading the answer (from offset
//! 0) asks, and the read is parked like an operation that asks (no worker waits) until a
//! human decided. (Not the write: the kernel holds the file's inode lock during a write, so
//! a parked write would hold every other agent's request to the same file.) Approved, the
//! read answers the grant (`once` waits for the identity's next operation on the path);
//! rejected or timed out, it fails `EACCES` with `APPROVAL_REJECTED`/`APPROVAL_TIMEOUT` in
//! `last_error`, a refusal like any other (it counts for the circuit breaker). What a
//! human could not approve anyway (a protected path, no intent, an open breaker, a policy
//! that does not ask) is answered at once without asking; so is a path already allowed.
//! One request per identity waits for a human at a time.

use serde::Deserialize;
use serde_json::{json, Value};

use super::*;
use crate::fs::approve::{Approver, AskSpec};
use crate::fs::gate::Verdict;
use crate::fs::AskAhead;
use crate::guard::identity::{GrantKind, Run};
use crate::guard::Denial;

/// Most characters of an agent's reason shown to the human.
const MAX_REASON: usize = 300;

/// What an agent writes to `check` or `approval`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    /// Workspace-relative (the mount root's) path.
    path: String,
    /// The operation (default `write`).
    #[serde(default)]
    operation: Option<String>,
    /// Why (for `approval`, required): shown to the human.
    #[serde(default)]
    reason: Option<String>,
}

/// An operation's name as a request gives it: the names of `last_error` and the ledger,
/// plus the words agents use for them.
fn operation(name: &str) -> Option<Operation> {
    Some(match name.trim().to_ascii_lowercase().as_str() {
        "write" | "edit" | "modify" | "open-write" | "overwrite" => Operation::Write,
        "create" | "new" => Operation::Create,
        "delete" | "unlink" | "remove" | "rm" => Operation::Unlink,
        "rmdir" => Operation::Rmdir,
        "mkdir" => Operation::Mkdir,
        "rename" | "move" | "mv" => Operation::Rename,
        "read" => Operation::Read,
        "truncate" => Operation::Truncate,
        "chmod" => Operation::Chmod,
        "chown" => Operation::Chown,
        "utimes" | "touch" => Operation::Utimes,
        "symlink" => Operation::Symlink,
        "link" => Operation::Link,
        "mknod" => Operation::Mknod,
        "setxattr" => Operation::Setxattr,
        "removexattr" => Operation::Removexattr,
        _ => return None,
    })
}

const OPERATIONS: &str = "write, create, delete, rmdir, mkdir, rename, read, truncate, chmod, chown, utimes, symlink, link";

/// A request's path as the guard knows paths: relative to the workspace root, no `.` or
/// `..` components, no trailing slash.
fn workspace_rel(p: &str) -> std::result::Result<PathBuf, String> {
    use std::path::Component;
    let path = Path::new(p.trim());
    if path.is_absolute() {
        return Err(format!(
            "{p:?} is absolute: give the path relative to the mount's root"
        ));
    }
    let mut rel = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => rel.push(n),
            Component::CurDir => {}
            _ => return Err(format!("{p:?} leaves the mount (`..`)")),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err("the path is empty".into());
    }
    Ok(rel)
}

/// An answer as JSON text (one line, then a newline).
fn answer(v: Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s.into_bytes()
}

/// The fields of a refusal in an answer.
fn refusal(d: &Denial) -> Value {
    json!({
        "code": d.code,
        "message": d.message,
        "remedy": d.remedy,
        "rule": d.rule,
    })
}

/// Merge `extra` into the object `base`.
fn with(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}

/// The agent's reason as the human sees it: control characters out, capped.
fn clean_reason(r: &str) -> String {
    let mut s: String = r
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if s.chars().count() > MAX_REASON {
        s = s.chars().take(MAX_REASON).collect::<String>() + "…";
    }
    s
}

impl Fs {
    /// Answer the request written so far to a query file. An unparsable request is
    /// answered as such (the writer may not be done: the next write re-reads it all).
    pub(super) fn query_ctl(&self, caller: &Caller, c: &mut CtlHandle, text: &str) -> Result<()> {
        let verb = if c.file == CtlFile::Check {
            "decision"
        } else {
            "status"
        };
        let invalid = |message: String, remedy: &str| {
            answer(json!({
                verb: "invalid",
                "code": "INVALID_REQUEST",
                "message": message,
                "remedy": remedy,
            }))
        };
        let example = if c.file == CtlFile::Check {
            r#"{"path": "src/app.rs", "operation": "write"}"#
        } else {
            r#"{"path": "src/app.rs", "operation": "write", "reason": "the fix needs this file"}"#
        };
        let req: Request = match serde_json::from_str(text.trim()) {
            Ok(r) => r,
            Err(e) => {
                c.content = invalid(
                    format!("not a request: {e}"),
                    &format!("Write one JSON object such as {example} to a newly opened file."),
                );
                return Ok(());
            }
        };
        let op_name = req.operation.as_deref().unwrap_or("write");
        let Some(op) = operation(op_name) else {
            c.content = invalid(
                format!("unknown operation {op_name:?}"),
                &format!("Use one of: {OPERATIONS}."),
            );
            return Ok(());
        };
        let rel = match workspace_rel(&req.path) {
            Ok(r) => r,
            Err(e) => {
                c.content = invalid(e, &format!("Write a request such as {example}."));
                return Ok(());
            }
        };
        let base = json!({ "path": rel.to_string_lossy(), "operation": op.as_str() });
        let ident = self.gate.ids.resolve(caller.pid);
        let is_dir = matches!(op, Operation::Mkdir | Operation::Rmdir);
        let verdict = if rel.starts_with(control::DIR_NAME) {
            let intent = ident.intent();
            Verdict::Deny(Denial::new(
                crate::guard::Code::ProtectedPath,
                op,
                &rel,
                intent.as_deref(),
                "the control directory .intentfs/ only takes requests: only .intentfs/intent selects, and check and approval ask".into(),
                "Select an intent by writing its id to .intentfs/intent; nothing else there can be changed.".into(),
            ))
        } else {
            self.gate.dry_run(&ident, op, &rel, is_dir)
        };
        if c.file == CtlFile::Check {
            c.content = answer(match verdict {
                Verdict::Allow { rule, by } => with(
                    base,
                    json!({ "decision": "allow", "allowed": true, "rule": rule, "by": by }),
                ),
                Verdict::Ask(_, d) => with(
                    base,
                    with(
                        json!({ "decision": "ask", "allowed": false }),
                        with(
                            refusal(&d),
                            json!({
                                "remedy": format!(
                                    "Doing this would stop and ask a human, who may refuse. If it is really needed, \
                                     ask first with the request_approval tool (or .intentfs/approval), giving your \
                                     reason. Otherwise: {}",
                                    d.remedy
                                ),
                            }),
                        ),
                    ),
                ),
                Verdict::Deny(d) => with(
                    base,
                    with(json!({ "decision": "deny", "allowed": false }), refusal(&d)),
                ),
            });
            return Ok(());
        }
        // `approval`.
        let reason = req
            .reason
            .as_deref()
            .map(clean_reason)
            .filter(|r| !r.is_empty());
        let Some(reason) = reason else {
            c.content = invalid(
                "an approval request needs a reason".into(),
                &format!("Say why, for the human who decides: {example}."),
            );
            return Ok(());
        };
        // A new request on this file replaces one not asked yet.
        c.request = None;
        c.asked = false;
        match verdict {
            Verdict::Allow { rule, by } => {
                c.content = answer(with(
                    base,
                    json!({
                        "status": "not_needed",
                        "rule": rule,
                        "by": by,
                        "message": format!("already allowed ({by}): no human was asked"),
                        "remedy": "Go ahead.",
                    }),
                ));
            }
            Verdict::Deny(d) => {
                let mut v = with(base, with(json!({ "status": "refused" }), refusal(&d)));
                v["remedy"] = json!(format!(
                    "A human cannot approve this through intentfs (only out-of-scope writes, sensitive reads and \
                     deletes the policy asks about can be). {}",
                    d.remedy
                ));
                c.content = answer(v);
            }
            Verdict::Ask(kind, _) => {
                // Asked when the answer is read (see `ask_ahead`).
                c.request = Some(AskAhead {
                    kind,
                    op,
                    rel,
                    reason,
                });
                c.content = answer(with(
                    base,
                    json!({
                        "status": "pending",
                        "message": "read this file from offset 0 to ask the human and wait for the answer",
                    }),
                ));
            }
        }
        Ok(())
    }

    /// The answer to the request on `.intentfs/approval` is read: ask a human, parking the
    /// read ([`FsError::Ask`]); its re-run once a human approved answers the grant. A
    /// rejection or timeout fails the read (`EACCES`, the refusal in `last_error`).
    pub(crate) fn ask_ahead(&self, caller: &Caller, c: &mut CtlHandle) -> Result<()> {
        let Some(req) = c.request.as_ref() else {
            return Ok(());
        };
        let ident = self.gate.ids.resolve(caller.pid);
        let base = json!({ "path": req.rel.to_string_lossy(), "operation": req.op.as_str() });
        let is_dir = matches!(req.op, Operation::Mkdir | Operation::Rmdir);
        if c.asked {
            // The re-run after a human's answer. A `once` approval is carried to this run.
            let rel = req.rel.clone();
            let once = [GrantKind::Write, GrantKind::Read, GrantKind::Delete]
                .into_iter()
                .find(|k| Run::take_carried(*k, &rel));
            c.content = answer(match once {
                Some(kind) => {
                    ident.grants.lock().keep_ahead((kind, rel));
                    with(
                        base,
                        json!({
                            "status": "approved",
                            "grant": "once",
                            "message": "a human approved this once",
                            "remedy": "Do it now: your next operation on this path is allowed once.",
                        }),
                    )
                }
                // A grant for the session (this file, or the scope expanded).
                None => match self.gate.dry_run(&ident, req.op, &rel, is_dir) {
                    Verdict::Allow { .. } => {
                        let file = {
                            let g = ident.grants.lock();
                            [GrantKind::Write, GrantKind::Read, GrantKind::Delete]
                                .iter()
                                .any(|k| g.files.contains(&(*k, rel.clone())))
                        };
                        with(
                            base,
                            json!({
                                "status": "approved",
                                "grant": if file { "file" } else { "expand_scope" },
                                "message": if file {
                                    "a human approved this file for the rest of your session"
                                } else {
                                    "a human expanded your scope to this path for the rest of your session"
                                },
                                "remedy": "Go ahead.",
                            }),
                        )
                    }
                    // Decided before and not approved (a read again after the refusal).
                    Verdict::Ask(..) | Verdict::Deny(_) => with(
                        base,
                        json!({
                            "status": "not_approved",
                            "message": "the human did not approve this request",
                            "remedy": "Read .intentfs/last_error for the answer; do not ask again for the same thing.",
                        }),
                    ),
                },
            });
            c.request = None;
            return Ok(());
        }
        // The rules may have changed since the request was written.
        let denial = match self.gate.dry_run(&ident, req.op, &req.rel, is_dir) {
            Verdict::Ask(_, d) => d,
            Verdict::Allow { by, .. } => {
                c.content = answer(with(
                    base,
                    json!({ "status": "not_needed", "by": by, "message": "already allowed: no human was asked",
                            "remedy": "Go ahead." }),
                ));
                c.request = None;
                return Ok(());
            }
            Verdict::Deny(d) => {
                c.content = answer(with(
                    base,
                    with(json!({ "status": "refused" }), refusal(&d)),
                ));
                c.request = None;
                return Ok(());
            }
        };
        let waiting = match &self.gate.approver {
            Approver::Human(b) => b
                .pending()
                .iter()
                .filter(|p| p.identity == ident.key())
                .count(),
            _ => 0,
        };
        if waiting > 0 {
            c.content = answer(with(
                base,
                json!({
                    "status": "busy",
                    "code": "APPROVAL_PENDING",
                    "message": "a request of yours already waits for a human",
                    "remedy": "Wait for the answer to your pending request before asking again; continue with \
                               work that does not need it meanwhile.",
                }),
            ));
            c.request = None;
            return Ok(());
        }
        c.asked = true;
        Err(FsError::Ask(Box::new(AskSpec {
            kind: req.kind,
            ident,
            caller: *caller,
            op: req.op,
            rel: req.rel.clone(),
            denial,
            reason: Some(req.reason.clone()),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_workspace_relative() {
        assert_eq!(
            workspace_rel("./src/a.rs").unwrap(),
            PathBuf::from("src/a.rs")
        );
        assert_eq!(workspace_rel("docs/").unwrap(), PathBuf::from("docs"));
        assert!(workspace_rel("/etc/passwd").is_err());
        assert!(workspace_rel("src/../../x").is_err());
        assert!(workspace_rel(" ").is_err());
    }

    #[test]
    fn operations_by_name() {
        assert_eq!(operation("Edit"), Some(Operation::Write));
        assert_eq!(operation("delete"), Some(Operation::Unlink));
        assert_eq!(operation("read"), Some(Operation::Read));
        assert_eq!(operation("launch"), None);
    }

    #[test]
    fn reasons_are_cleaned_and_capped() {
        assert_eq!(clean_reason("a\nb\u{1b}[31m c"), "a b [31m c");
        assert!(clean_reason(&"x".repeat(1000)).chars().count() <= MAX_REASON + 1);
    }
}
