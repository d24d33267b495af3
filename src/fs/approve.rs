//! Asking a human from inside a filesystem operation, without holding a FUSE worker: the
//! operation answers [`FsError::Ask`]; the adapter parks the reply and calls [`Fs::park`]
//! with a continuation; the decision (now, or later from the approval broker) grants the
//! identity what was asked and re-runs the operation, or answers `EACCES`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::{Caller, Fs, FsError, Gate};
use crate::approval::{Ask, AskKind, Broker, Decision, Grant};
use crate::guard::identity::{GrantKind, OnceGrant, Run};
use crate::guard::{Code, Denial, Identity, Operation};
use crate::ledger::{Draft, MutationType, Outcome};

/// Who decides when a human is asked.
#[derive(Clone)]
pub enum Approver {
    /// Refuse at once (unattended runs); the original code (e.g. `SENSITIVE_READ`) stands.
    Deny,
    /// Allow at once, grant `once` (trusted unattended runs).
    Allow,
    /// A person, through the broker's channels (desktop notification, CLI socket).
    Human(Arc<Broker>),
}

/// A question for a human, raised by an operation.
pub struct AskSpec {
    pub kind: GrantKind,
    pub ident: Arc<Identity>,
    pub caller: Caller,
    pub op: Operation,
    pub rel: PathBuf,
    /// The refusal to answer when nobody approves (its code is kept for `--approver deny`).
    pub denial: Denial,
    /// Why the agent asks, in its words, when it asked ahead (`.intentfs/approval`).
    pub reason: Option<String>,
}

/// What to do once decided: `Ok` re-runs the operation (with the single-use grant the answer
/// gave, if any, for that re-run only), `Err` answers the error.
pub type Continue = Box<dyn FnOnce(Result<Option<OnceGrant>, FsError>) + Send + 'static>;

/// How a question was answered.
pub enum Answer {
    Approved { grant: Grant, by: String },
    Rejected { by: String },
    TimedOut,
}

/// How many times one operation may stop to ask before it is refused (a rename asks for
/// each of its names in turn).
pub const MAX_ASKS: u32 = 4;

impl Fs {
    /// Run an operation that may stop to ask a human: on [`FsError::Ask`] it is parked
    /// ([`Fs::park`]) and re-run once a decision grants what was asked, and `done` gets the
    /// final result (on whichever thread decided). Never blocks the calling worker.
    pub fn drive<T, Op, Done>(self: &Arc<Self>, op: Op, done: Done)
    where
        Op: Fn(&Fs) -> Result<T, FsError> + Send + 'static,
        Done: FnOnce(Result<T, FsError>) + Send + 'static,
    {
        drive_from(self.clone(), op, done, 0, Vec::new())
    }

    /// Ask, and continue with the decision. Never blocks the calling worker: with a human
    /// approver the continuation runs later, on a broker thread.
    pub fn park(self: &Arc<Self>, spec: AskSpec, cont: Continue) {
        let started = Instant::now();
        let broker = match &self.gate.approver {
            Approver::Allow => {
                let a = Answer::Approved {
                    grant: Grant::Once,
                    by: "approver:allow".into(),
                };
                return cont(self.gate.settle(spec, a, started));
            }
            Approver::Deny => {
                let a = Answer::Rejected {
                    by: "approver:deny".into(),
                };
                return cont(self.gate.settle(spec, a, started));
            }
            Approver::Human(b) => b.clone(),
        };
        let ask = Ask {
            kind: match spec.kind {
                GrantKind::Write => AskKind::OutOfScope,
                GrantKind::Read => AskKind::SensitiveRead,
                GrantKind::Delete => AskKind::Delete,
            },
            identity: spec.ident.key(),
            agent: spec.ident.name.clone(),
            intent: spec.ident.intent(),
            op: spec.op.as_str().into(),
            path: spec.rel.clone(),
            // A glob that matches this very path: `app/[id]/page.tsx` is not a character
            // class here.
            suggested_glob: literal_glob(&spec.rel),
            reason: spec.reason.clone(),
        };
        tracing::info!(agent = %spec.ident.name, path = %spec.rel.display(), op = %spec.op, "asking a human");
        let fs = self.clone();
        broker.ask(
            ask,
            Box::new(move |d| {
                let a = match d {
                    Decision::Approved { grant, by } => Answer::Approved { grant, by },
                    Decision::Rejected { by } => Answer::Rejected { by },
                    Decision::TimedOut => Answer::TimedOut,
                };
                cont(fs.gate.settle(spec, a, started))
            }),
        );
    }
}

fn drive_from<T, Op, Done>(fs: Arc<Fs>, op: Op, done: Done, depth: u32, carried: Vec<OnceGrant>)
where
    Op: Fn(&Fs) -> Result<T, FsError> + Send + 'static,
    Done: FnOnce(Result<T, FsError>) + Send + 'static,
{
    let run = Run::begin(carried);
    match op(&fs) {
        Err(FsError::Ask(spec)) if depth < MAX_ASKS => {
            // Single-use grants this run spent go to the re-run only (see `Run`).
            let carried = run.carry();
            let fs2 = fs.clone();
            fs.park(
                *spec,
                Box::new(move |res| match res {
                    Ok(once) => {
                        let mut carried = carried;
                        carried.extend(once);
                        drive_from(fs2, op, done, depth + 1, carried)
                    }
                    Err(e) => done(Err(e)),
                }),
            );
        }
        r => {
            drop(run);
            done(r)
        }
    }
}

/// The glob that matches exactly `rel` (its metacharacters escaped).
pub fn literal_glob(rel: &std::path::Path) -> String {
    globset::escape(&rel.to_string_lossy())
}

impl Gate {
    /// Apply an answer: grant and ledger it, or refuse. `Ok` means "re-run", with the
    /// single-use grant to carry into that re-run (never given to the identity).
    pub(crate) fn settle(
        &self,
        spec: AskSpec,
        answer: Answer,
        started: Instant,
    ) -> Result<Option<OnceGrant>, FsError> {
        let latency_ms = started.elapsed().as_millis() as u64;
        let (outcome, by, grant) = match &answer {
            Answer::Approved { grant, by } => (Outcome::Approved, by.clone(), Some(*grant)),
            Answer::Rejected { by } => (Outcome::Rejected, by.clone(), None),
            Answer::TimedOut => (Outcome::Timeout, "timeout".to_string(), None),
        };
        if let Some(l) = &self.ledger {
            let draft = Draft {
                intent_id: spec.ident.intent(),
                agent: Some(self.agent(&spec.ident, &spec.caller)),
                mutation_type: Some(MutationType::Approval),
                path: Some(spec.rel.clone()),
                outcome,
                code: Some(spec.denial.code),
                rule: spec.denial.rule.clone(),
                detail: Some(serde_json::json!({
                    "asked": format!("{:?}", spec.kind).to_lowercase(),
                    "op": spec.op,
                    "decided_by": by,
                    "grant": grant,
                    "latency_ms": latency_ms,
                    "reason": spec.reason,
                })),
                ..Default::default()
            };
            if let Err(e) = l.record(draft) {
                tracing::error!("ledger: cannot record an approval decision: {e}");
            }
        }
        match answer {
            Answer::Approved { grant, .. } => {
                let mut g = spec.ident.grants.lock();
                match grant {
                    Grant::File => {
                        g.files.insert((spec.kind, spec.rel.clone()));
                    }
                    Grant::ExpandScope => {
                        // The broker recorded it in pending_scope_updates.json; it applies to
                        // this identity for its session.
                        let glob = literal_glob(&spec.rel);
                        match globset::Glob::new(&glob) {
                            Ok(g2) => g.globs.push((glob, g2.compile_matcher())),
                            Err(_) => {
                                g.files.insert((spec.kind, spec.rel.clone()));
                            }
                        }
                    }
                    // A single-use grant is the asking operation's alone: it goes to that
                    // operation's re-run (see `Run`), not to the identity, where a re-run
                    // that failed before reaching its check (a source renamed away
                    // meanwhile) left it for any later operation on the path to spend
                    // without a question, and a concurrent operation could take it first.
                    Grant::Once => return Ok(Some((spec.kind, spec.rel.clone()))),
                }
                Ok(None)
            }
            Answer::Rejected { by } if by.starts_with(crate::approval::LIMIT_PREFIX) => {
                let d = Denial::new(
                    Code::ApprovalsPending,
                    spec.op,
                    &spec.rel,
                    spec.ident.intent().as_deref(),
                    format!(
                        "not asked: {} ({})",
                        &by[crate::approval::LIMIT_PREFIX.len()..],
                        spec.denial.message
                    ),
                    "Your earlier questions still wait for a human: wait for their answers (each blocked \
                     operation returns when decided) before asking more, and continue with work inside your scope."
                        .into(),
                )
                .with_rule(spec.denial.rule.clone());
                Err(self.deny(&spec.ident, &spec.caller, d))
            }
            Answer::Rejected { by } if by.starts_with("approver:") => {
                // Unattended refusal: the original reason stands.
                Err(self.deny(&spec.ident, &spec.caller, spec.denial))
            }
            Answer::Rejected { by } => {
                let d = Denial::new(
                    Code::ApprovalRejected,
                    spec.op,
                    &spec.rel,
                    spec.ident.intent().as_deref(),
                    format!("a human ({by}) rejected: {}", spec.denial.message),
                    "The human said no. Do not retry this operation; continue within your scope or ask the human \
                     what to do instead."
                        .into(),
                )
                .with_rule(spec.denial.rule.clone());
                Err(self.deny(&spec.ident, &spec.caller, d))
            }
            Answer::TimedOut => {
                let d = Denial::new(
                    Code::ApprovalTimeout,
                    spec.op,
                    &spec.rel,
                    spec.ident.intent().as_deref(),
                    format!("nobody approved in time: {}", spec.denial.message),
                    "No human answered. Continue with work that does not need this, and mention the pending need \
                     in your report."
                        .into(),
                )
                .with_rule(spec.denial.rule.clone());
                Err(self.deny(&spec.ident, &spec.caller, d))
            }
        }
    }
}
