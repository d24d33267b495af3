//! Governance: who may do what, and what is on record. The passthrough core ([`super::Fs`])
//! resolves a request to workspace paths, asks the gate ([`Gate::authorize`]), makes the
//! syscall, and has the gate record it ([`Gate::record`]); refusals, the circuit breaker,
//! approvals and the ledger live here, never next to a syscall.
//!
//! The gate knows nothing of inodes, handles or file descriptors: everything it decides is
//! over an identity, an operation and workspace-relative paths.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::approve::{Approver, AskSpec};
use super::{temps, Caller, FsError, Result};
use crate::guard::identity::{Breaker, GrantKind};
use crate::guard::{Code, Denial, Guard, Identities, Identity, Operation};
use crate::ledger::{Draft, Ledger, MutationType, Outcome};

/// What the gate counts for `.intentfs/status`.
#[derive(Default)]
pub struct GateCounters {
    /// Mutations authorized and completed (recorded or summarized).
    pub mutations: AtomicU64,
    /// Refusals (each a `DENIAL` entry).
    pub denials: AtomicU64,
    /// Refused probes of tools (see [`Gate::deny`]).
    pub probes: AtomicU64,
}

/// What [`Gate::dry_run`] foresees for an operation.
#[derive(Debug)]
pub enum Verdict {
    /// It would go through: the rule that allows it, and what kind of permission that is.
    Allow {
        rule: Option<String>,
        by: &'static str,
    },
    /// A human would be asked (what a grant would have to cover, and the refusal if not).
    Ask(GrantKind, Denial),
    /// It would be refused.
    Deny(Denial),
}

/// The governance of one mount.
pub struct Gate {
    /// The rules in force.
    pub guard: Arc<Guard>,
    /// Who is asking (identities granted by the operator).
    pub ids: Arc<Identities>,
    /// The audit ledger (`None`: `--no-ledger` tests and benchmarks).
    pub ledger: Option<Ledger>,
    /// Who decides when a human is asked.
    pub approver: Approver,
    /// Circuit breaker settings.
    pub breaker: Breaker,
    /// Tools' temporaries next to in-scope files (see [`temps`]).
    pub temps: temps::Temps,
    /// Build output summaries under way (see [`super::output`]).
    pub bursts: super::output::Bursts,
    pub counters: GateCounters,
    /// Process names by pid, briefly (see [`Gate::process_name`]).
    names: crate::guard::identity::RecentByPid<String>,
}

/// How long a process name is reused: a burst of requests from one process (`tar x` sends
/// about 14 per file) names it once instead of reading `/proc/<pid>/comm` for every entry
/// (2.5% of the daemon's CPU during `tar x`). A process that execs another program is
/// named by its new name at most this long after. (The name is what the process says it
/// is, `prctl(PR_SET_NAME)` included: identity and pid are what the ledger vouches for.)
const NAME_TTL: Duration = Duration::from_millis(250);

impl Gate {
    pub fn new(guard: Arc<Guard>, ids: Arc<Identities>, ledger: Option<Ledger>) -> Gate {
        Gate {
            guard,
            ids,
            ledger,
            approver: Approver::Deny,
            breaker: Breaker::default(),
            temps: temps::Temps::default(),
            bursts: super::output::Bursts::default(),
            counters: GateCounters::default(),
            names: crate::guard::identity::RecentByPid::new(NAME_TTL),
        }
    }

    /// The name of process `pid`, read at most every [`NAME_TTL`].
    fn process_name(&self, pid: u32) -> String {
        self.names
            .get_or(pid, || Some(crate::guard::identity::proc_name(pid)))
            .unwrap_or_default()
    }

    /// Refuse: remember it for the identity, count it, ledger it, and answer `EACCES`.
    pub fn deny(&self, ident: &Identity, caller: &Caller, d: Denial) -> FsError {
        // A tool's harmless probe: git refreshing its index (`.git/index.lock`) or writing
        // an object when no intent is selected yet (`git status` before the handshake). It
        // is refused, and shown in last_error, but it is not a refusal an agent loops on:
        // not counted for the breaker, not a DENIAL entry each (counted in `status`).
        if d.code == Code::NoIntent && crate::policy::git::in_git_dir(&d.path) {
            ident.probes.fetch_add(1, Ordering::Relaxed);
            self.counters.probes.fetch_add(1, Ordering::Relaxed);
            *ident.last_error.lock() = Some(d.clone());
            return FsError::Denied(Box::new(d));
        }
        ident.deny(&d);
        // Waiting for another agent's write lease is coordination, not misbehaviour: it
        // does not count toward the breaker.
        if !matches!(d.code, Code::CircuitOpen | Code::WriteLeased)
            && ident.count_refusal(self.breaker)
        {
            self.trip(ident, caller);
        }
        self.counters.denials.fetch_add(1, Ordering::Relaxed);
        tracing::info!(code = %d.code, path = %d.path.display(), agent = %ident.name, "denied: {}", d.message);
        if let Some(l) = &self.ledger {
            let draft = Draft {
                intent_id: d.intent.clone(),
                agent: Some(self.agent(ident, caller)),
                mutation_type: Some(MutationType::Denial),
                path: Some(d.path.clone()),
                outcome: Outcome::Denied,
                code: Some(d.code),
                rule: d.rule.clone(),
                detail: Some(serde_json::json!({ "op": d.op, "message": d.message })),
                ..Default::default()
            };
            if let Err(e) = l.record_nowait(draft) {
                tracing::error!("ledger: cannot record a denial: {e}");
            }
        }
        FsError::Denied(Box::new(d))
    }

    /// May `ident` do `op` to `rel`? Out of scope, a tool's temporary or a grant may still
    /// allow it, or a human may be asked ([`FsError::Ask`]); and nothing changes while the
    /// ledger cannot take its entry.
    pub fn authorize(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        is_dir: bool,
    ) -> Result<()> {
        temps::NEW_TEMP.with(|t| t.set(false));
        let intent = ident.intent();
        if ident.tripped.load(Ordering::Acquire) {
            let d = circuit_open(ident, op, rel);
            return Err(self.deny(ident, caller, d));
        }
        match self.guard.check_write(intent.as_deref(), op, rel, is_dir) {
            Ok(_) => {}
            Err(d) if d.code == Code::ScopeViolation => {
                if self.temp_allowed(ident, op, rel) {
                    return self.ledger_healthy(ident, op, rel);
                }
                if ident.grants.lock().take(GrantKind::Write, rel) {
                    return self.ledger_healthy(ident, op, rel);
                }
                if self.guard.rules().policy.approval().out_of_scope
                    == crate::policy::OutOfScope::Ask
                {
                    return Err(FsError::Ask(Box::new(AskSpec {
                        kind: GrantKind::Write,
                        ident: ident.clone(),
                        caller: *caller,
                        op,
                        rel: rel.to_path_buf(),
                        denial: d,
                        reason: None,
                    })));
                }
                return Err(self.deny(ident, caller, d));
            }
            Err(d) => return Err(self.deny(ident, caller, d)),
        }
        self.ledger_healthy(ident, op, rel)
    }

    /// Outside the scope, but a tool's temporary (see [`temps`]): an existing temporary of
    /// this identity (anything may be done to it but moving it elsewhere, which the rename
    /// checks), a new entry in a companion directory of its intent, or a directory its
    /// scope's globs imply. A new temporary is registered by the operation once it exists.
    pub(super) fn temp_allowed(&self, ident: &Identity, op: Operation, rel: &Path) -> bool {
        if self.temps.covers(&ident.key, rel) {
            return true;
        }
        let made = op.makes_entry();
        let attrs = op.sets_attributes();
        if !made && !attrs {
            return false;
        }
        let rules = self.guard.rules();
        let Some(it) = ident
            .intent()
            .and_then(|i| rules.policy.intent(&i).cloned())
        else {
            return false;
        };
        // A directory the scope implies may be made, and its times and mode set (`tar x
        // -C src/auth` sets them on `src/auth`).
        if (op == Operation::Mkdir || attrs) && it.implies_dir(rel) {
            return true;
        }
        if attrs {
            return false;
        }
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if it.temp_name(parent, name, op == Operation::Mkdir)
            || self.temps.covers(&ident.key, parent)
        {
            temps::NEW_TEMP.with(|t| t.set(true));
            return true;
        }
        false
    }

    /// Whether `to` may take a rename as a temporary: outside the scope only, in a companion
    /// directory of the identity's intent (or a temporary directory of it), and free or
    /// already this identity's temporary.
    pub fn temp_target(&self, ident: &Identity, to: &Path, is_dir: bool, dst_exists: bool) -> bool {
        let intent = ident.intent();
        match self
            .guard
            .check_write(intent.as_deref(), Operation::Rename, to, is_dir)
        {
            Err(d) if d.code == Code::ScopeViolation => {}
            _ => return false,
        }
        if dst_exists && !self.temps.covers(&ident.key, to) {
            return false;
        }
        let rules = self.guard.rules();
        let Some(it) = intent.and_then(|i| rules.policy.intent(&i).cloned()) else {
            return false;
        };
        let parent = to.parent().unwrap_or(Path::new(""));
        let name = to.file_name().and_then(|n| n.to_str()).unwrap_or("");
        it.temp_name(parent, name, is_dir) || self.temps.covers(&ident.key, parent)
    }

    /// A sensitive path is being opened for reading: the policy's `approval.sensitive_read`
    /// says whether to allow, refuse, or ask a human.
    pub fn sensitive_read(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        rel: &Path,
        d: Denial,
    ) -> Result<()> {
        use crate::policy::SensitiveRead;
        match self.guard.rules().policy.approval().sensitive_read {
            SensitiveRead::Allow => Ok(()),
            SensitiveRead::Deny => Err(self.deny(ident, caller, d)),
            SensitiveRead::Ask => {
                if ident.grants.lock().take(GrantKind::Read, rel) {
                    return Ok(());
                }
                Err(FsError::Ask(Box::new(AskSpec {
                    kind: GrantKind::Read,
                    ident: ident.clone(),
                    caller: *caller,
                    op: Operation::Read,
                    rel: rel.to_path_buf(),
                    denial: d,
                    reason: None,
                })))
            }
        }
    }

    /// Deletes need a human when the policy says `approval.delete: ask`.
    pub fn delete_approval(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        rel: &Path,
    ) -> Result<()> {
        if self.guard.rules().policy.approval().delete != crate::policy::DeleteRule::Ask {
            return Ok(());
        }
        if ident.grants.lock().take(GrantKind::Delete, rel) {
            return Ok(());
        }
        let d = Denial::new(
            Code::ApprovalRejected,
            op,
            rel,
            ident.intent().as_deref(),
            format!(
                "deleting {} needs a human's approval (policy approval.delete: ask)",
                rel.display()
            ),
            "Do not delete this; ask the human, or leave the file in place.".into(),
        );
        Err(FsError::Ask(Box::new(AskSpec {
            kind: GrantKind::Delete,
            ident: ident.clone(),
            caller: *caller,
            op,
            rel: rel.to_path_buf(),
            denial: d,
            reason: None,
        })))
    }

    /// Would `ident` be let do `op` to `rel` now, and if not why, or would a human be
    /// asked? The same decisions as [`Gate::authorize`], [`Gate::sensitive_read`] and
    /// [`Gate::delete_approval`], with nothing spent, counted, remembered or recorded: the
    /// answer to `.intentfs/check`, and what `.intentfs/approval` asks a human about.
    /// (What only the operation itself can know is not foreseen: whether the file is
    /// stale for this identity, or a tool's temporary it would create.)
    pub fn dry_run(&self, ident: &Identity, op: Operation, rel: &Path, is_dir: bool) -> Verdict {
        use crate::policy::{DeleteRule, OutOfScope, SensitiveRead};
        let intent = ident.intent();
        let rules = self.guard.rules();
        let approval = rules.policy.approval();
        let grants = ident.grants.lock();
        if op == Operation::Read {
            return match self.guard.check_read(intent.as_deref(), rel) {
                Ok(()) => Verdict::Allow {
                    rule: None,
                    by: "not sensitive",
                },
                Err(d) => match approval.sensitive_read {
                    SensitiveRead::Allow => Verdict::Allow {
                        rule: d.rule,
                        by: "policy approval.sensitive_read: allow",
                    },
                    SensitiveRead::Deny => Verdict::Deny(d),
                    SensitiveRead::Ask if grants.covers(GrantKind::Read, rel) => Verdict::Allow {
                        rule: d.rule,
                        by: "a human's approval",
                    },
                    SensitiveRead::Ask => Verdict::Ask(GrantKind::Read, d),
                },
            };
        }
        if ident.tripped.load(Ordering::Acquire) {
            return Verdict::Deny(circuit_open(ident, op, rel));
        }
        let rule = match self.guard.check_write(intent.as_deref(), op, rel, is_dir) {
            Ok(rule) => rule,
            Err(d) if d.code == Code::ScopeViolation => {
                if grants.covers(GrantKind::Write, rel) {
                    return Verdict::Allow {
                        rule: None,
                        by: "a human's approval",
                    };
                }
                if self.temps.covers(&ident.key, rel) {
                    return Verdict::Allow {
                        rule: None,
                        by: "a temporary of this agent's tool",
                    };
                }
                if approval.out_of_scope == OutOfScope::Ask {
                    return Verdict::Ask(GrantKind::Write, d);
                }
                return Verdict::Deny(d);
            }
            Err(d) => return Verdict::Deny(d),
        };
        if matches!(op, Operation::Unlink | Operation::Rmdir)
            && approval.delete == DeleteRule::Ask
            && !grants.covers(GrantKind::Delete, rel)
        {
            let d = Denial::new(
                Code::ApprovalRejected,
                op,
                rel,
                intent.as_deref(),
                format!(
                    "deleting {} needs a human's approval (policy approval.delete: ask)",
                    rel.display()
                ),
                "Do not delete this; ask the human, or leave the file in place.".into(),
            );
            return Verdict::Ask(GrantKind::Delete, d);
        }
        Verdict::Allow {
            rule: Some(rule),
            by: "the intent's scope",
        }
    }

    /// The breaker tripped: say so loudly (log, ledger, and the human channel).
    fn trip(&self, ident: &Identity, caller: &Caller) {
        if let Approver::Human(b) = &self.approver {
            b.announce_trip(&ident.key(), &ident.name, self.breaker.limit as u32);
        }
        tracing::warn!(agent = %ident.name, identity = %ident.key(), "circuit breaker tripped: mutations refused until reset");
        if let Some(l) = &self.ledger {
            let _ = l.record_nowait(Draft {
                intent_id: ident.intent(),
                agent: Some(self.agent(ident, caller)),
                mutation_type: Some(MutationType::Denial),
                outcome: Outcome::Tripped,
                code: Some(Code::CircuitOpen),
                detail: Some(serde_json::json!({ "limit": self.breaker.limit, "window_s": self.breaker.window.as_secs() })),
                ..Default::default()
            });
        }
    }

    /// The ledger must be writable for a mutation to proceed: fail closed otherwise.
    fn ledger_healthy(&self, ident: &Identity, op: Operation, rel: &Path) -> Result<()> {
        let Some(l) = &self.ledger else { return Ok(()) };
        if let Err(e) = l.health() {
            return Err(self.ledger_denial(ident, op, rel, &e.to_string()));
        }
        Ok(())
    }

    /// The refusal when the ledger cannot take an entry: EACCES, explained in last_error
    /// (not a DENIAL entry: the ledger is what cannot be written).
    pub fn ledger_denial(&self, ident: &Identity, op: Operation, rel: &Path, why: &str) -> FsError {
        let d = Denial::new(
            Code::LedgerUnwritable,
            op,
            rel,
            ident.intent().as_deref(),
            format!(
                "the audit ledger cannot be written ({why}); mutations are refused until it can"
            ),
            "Wait and retry later; tell the human that the ledger's disk is full or failing."
                .into(),
        );
        ident.deny(&d);
        FsError::Denied(Box::new(d))
    }

    /// The ledger's view of the caller.
    pub fn agent(&self, ident: &Identity, caller: &Caller) -> crate::ledger::Agent {
        crate::ledger::Agent {
            name: ident.name.clone(),
            identity: ident.key(),
            pid: caller.pid,
            uid: caller.uid,
            process: self.process_name(caller.pid),
        }
    }

    /// A git ref moved through the mount (`HEAD`, `refs/…`, see `policy::git::ref_name`):
    /// ledgered with its old and new value, so a branch, commit, reset or stash by an agent
    /// is on record although git's internals are not, file by file.
    pub fn record_ref(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        old: Option<String>,
        new: Option<String>,
    ) -> Result<()> {
        let Some(name) = crate::policy::git::ref_name(rel) else {
            return Ok(());
        };
        self.record_ref_named(ident, caller, rel, &name, old, new)
    }

    /// [`Gate::record_ref`] of ref `name`, changed through the file `rel`.
    pub fn record_ref_named(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        name: &str,
        old: Option<String>,
        new: Option<String>,
    ) -> Result<()> {
        let Some(l) = &self.ledger else { return Ok(()) };
        if old == new {
            return Ok(());
        }
        let draft = Draft {
            intent_id: ident.intent(),
            agent: Some(self.agent(ident, caller)),
            mutation_type: Some(MutationType::Ref),
            path: Some(rel.to_path_buf()),
            detail: Some(serde_json::json!({ "ref": name, "old": old, "new": new })),
            ..Default::default()
        };
        if let Err(e) = l.record(draft) {
            return Err(self.ledger_denial(ident, Operation::Ref, rel, &e.to_string()));
        }
        Ok(())
    }

    /// Ledger a completed mutation (durably: the syscall is acknowledged after).
    pub fn record(
        &self,
        ident: &Identity,
        caller: &Caller,
        mt: MutationType,
        rel: &Path,
        draft: Draft,
    ) -> Result<()> {
        self.record_as(ident, caller, mt, rel, draft, ident.intent())
    }

    /// [`Gate::record`] under `intent`: the identity's intent when the change was
    /// answered (`--record async` writes the entry later).
    pub fn record_as(
        &self,
        ident: &Identity,
        caller: &Caller,
        mt: MutationType,
        rel: &Path,
        mut draft: Draft,
        intent: Option<String>,
    ) -> Result<()> {
        ident.mutations.fetch_add(1, Ordering::Relaxed);
        self.counters.mutations.fetch_add(1, Ordering::Relaxed);
        // Git's internals are not ledgered file by file (ref moves are, see `record_ref`).
        // A rename from the workspace into them is: the file (or tree) leaves the ledger's
        // view there, and must not leave it unrecorded.
        if super::stale::untracked(rel) && draft.from.as_deref().is_none_or(super::stale::untracked)
        {
            return Ok(());
        }
        let Some(l) = &self.ledger else { return Ok(()) };
        let rules = self.guard.rules();
        // Build output is summarized; a rename into it from elsewhere stays an entry of its
        // own (what it moves leaves its old name on record).
        let from_output = draft
            .from
            .as_deref()
            .is_none_or(|f| rules.policy.output_match(f).is_some());
        if let Some(rule) = rules.policy.output_match(rel).filter(|_| from_output) {
            // Build output: counted into its burst's summary (a handle's begin is not).
            if mt != MutationType::WriteBegin {
                let root = output_root(&rules.policy, rel);
                self.bursts.add(
                    &ident.key,
                    ident.intent(),
                    self.agent(ident, caller),
                    mt,
                    rel,
                    root,
                    rule,
                    draft.size,
                );
            }
            return Ok(());
        }
        draft.intent_id = intent;
        // (An agent named already was taken when the change was answered: `--record async`.)
        if draft.agent.is_none() {
            draft.agent = Some(self.agent(ident, caller));
        }
        draft.mutation_type = Some(mt);
        draft.path = Some(rel.to_path_buf());
        if let Err(e) = l.record(draft) {
            // The entry stays queued in memory and is retried; the syscall reports the
            // failure so nothing is acknowledged before its entry is durable.
            tracing::error!("ledger: cannot record {mt:?} of {}: {e}", rel.display());
            return Err(self.ledger_denial(ident, mutation_op(mt), rel, &e.to_string()));
        }
        Ok(())
    }
}

/// The operation a mutation type records, for a refusal of its entry.
fn mutation_op(mt: MutationType) -> Operation {
    match mt {
        MutationType::Create => Operation::Create,
        MutationType::Mkdir => Operation::Mkdir,
        MutationType::Rmdir => Operation::Rmdir,
        MutationType::Symlink => Operation::Symlink,
        MutationType::Mknod => Operation::Mknod,
        MutationType::Xattr => Operation::Setxattr,
        MutationType::Delete => Operation::Unlink,
        MutationType::Rename => Operation::Rename,
        MutationType::Link => Operation::Link,
        MutationType::Truncate => Operation::Truncate,
        MutationType::Chmod => Operation::Chmod,
        MutationType::Chown => Operation::Chown,
        MutationType::Utimes => Operation::Utimes,
        MutationType::Ref => Operation::Ref,
        MutationType::Intent => Operation::SelectIntent,
        _ => Operation::Write,
    }
}

/// Whether an error is the refusal of a ledger that cannot be written.
pub fn is_ledger_failure(e: &FsError) -> bool {
    matches!(e, FsError::Denied(d) if d.code == Code::LedgerUnwritable)
}

/// The directory a build output summary is named by: the shortest ancestor of `rel` (or
/// `rel`) under the same `output:` rule (`target` for `target/debug/x` under `target/`).
fn output_root(policy: &crate::policy::Policy, rel: &Path) -> PathBuf {
    let mut up: Vec<&Path> = rel
        .ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .collect();
    up.reverse();
    up.into_iter()
        .find(|a| policy.output_match(a).is_some())
        .unwrap_or(rel)
        .to_path_buf()
}

/// The refusal of anything an identity whose breaker tripped asks to change.
fn circuit_open(ident: &Identity, op: Operation, rel: &Path) -> Denial {
    Denial::new(
        Code::CircuitOpen,
        op,
        rel,
        ident.intent().as_deref(),
        format!("{} was refused too often and is stopped until a human resets it", ident.name),
        format!(
            "Stop and report to the human: this agent looped on refused operations. A human resets it with \
             `intentfs reset {}`.",
            ident.key()
        ),
    )
}
