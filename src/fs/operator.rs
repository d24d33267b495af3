//! The operator's requests on the control socket that the filesystem serves: granting an
//! identity to an `intentfs run` process, and recording a verification's lesson. The
//! socket (in `approval`) has already checked that the caller is the mount's owner or root.

use std::sync::{Arc, Weak};

use super::Fs;
use crate::approval::{
    AckRequest, LessonRequest, Operator, RegisterRequest, Registered, RestoreRequest,
};
use crate::guard::tracking::Grant;
use crate::guard::Intents;
use crate::ledger::{Draft, MutationType};

/// Serves [`Operator`] requests for one mount. Holds the filesystem weakly: the broker it is
/// installed in is owned by the filesystem.
pub struct FsOperator(pub Weak<Fs>);

impl FsOperator {
    fn fs(&self) -> Result<Arc<Fs>, String> {
        self.0
            .upgrade()
            .ok_or_else(|| "the mount is shutting down".to_string())
    }
}

/// The operator's bound on intents, checked against the policy: every id must exist, and a
/// locked one must be selectable now.
fn intents_of(fs: &Fs, req: &RegisterRequest) -> Result<Intents, String> {
    let rules = fs.gate.guard.rules();
    let policy = &rules.policy;
    let selectable: Vec<&str> = policy
        .intents()
        .iter()
        .filter(|i| i.selectable())
        .map(|i| i.id.as_str())
        .collect();
    let hint = || {
        format!(
            "hint: selectable intents: {}",
            if selectable.is_empty() {
                "(none)".into()
            } else {
                selectable.join(", ")
            }
        )
    };
    let bound = match (&req.intent, &req.intents) {
        (Some(_), Some(_)) => return Err("give --intent or --intents, not both".into()),
        (Some(id), None) => Intents::Locked(id.clone()),
        (None, Some(v)) if v.iter().any(|x| x == "all") => Intents::All,
        (None, Some(v)) if !v.is_empty() => Intents::Among(v.clone()),
        (None, _) => Intents::Among(Vec::new()),
    };
    let named: Vec<&String> = match &bound {
        Intents::Locked(x) => vec![x],
        Intents::Among(v) => v.iter().collect(),
        Intents::All => Vec::new(),
    };
    for id in named {
        match policy.intent(id) {
            None => return Err(format!("intent {id:?} is not in the policy\n{}", hint())),
            Some(it) if !it.selectable() && matches!(bound, Intents::Locked(_)) => {
                return Err(format!(
                    "intent {id} is {}, not IN_PROGRESS\n{}",
                    it.status.as_str(),
                    hint()
                ))
            }
            Some(_) => {}
        }
    }
    Ok(bound)
}

impl Operator for FsOperator {
    fn register(&self, peer: u32, req: RegisterRequest) -> Result<Registered, String> {
        let fs = self.fs()?;
        if req.agent.trim().is_empty()
            || req.agent.len() > 128
            || req.agent.chars().any(char::is_control)
        {
            return Err("the agent name must be 1 to 128 printable characters".into());
        }
        let intents = intents_of(&fs, &req)?;
        let (ident, anchor) = fs.gate.ids.grant(
            peer,
            Grant {
                name: req.agent.clone(),
                intents,
                require_read: req.require_read,
                uid: req.uid,
            },
        )?;
        tracing::info!(
            identity = %ident.key, agent = %ident.name, tracking = anchor.kind(),
            intents = %ident.allowed.describe(), "identity granted"
        );
        if let Some(l) = &fs.gate.ledger {
            let draft = Draft {
                intent_id: ident.intent(),
                agent: Some(fs.gate.agent(
                    &ident,
                    &super::Caller {
                        uid: req.uid.unwrap_or(0),
                        gid: 0,
                        pid: peer,
                    },
                )),
                mutation_type: Some(MutationType::Identity),
                detail: Some(serde_json::json!({
                    "intents": ident.allowed.describe(),
                    "tracking": anchor.kind(),
                    "require_read": ident.require_read,
                    "run_as_uid": req.uid,
                })),
                ..Default::default()
            };
            l.record(draft)
                .map_err(|e| format!("the ledger cannot be written: {e}"))?;
        }
        Ok(Registered {
            identity: ident.key.clone(),
            tracking: anchor.kind().into(),
            intent: ident.intent(),
        })
    }

    fn lesson(&self, req: LessonRequest) -> Result<String, String> {
        let fs = self.fs()?;
        fs.append_lesson(&req)
    }

    fn ack(&self, uid: u32, req: AckRequest) -> Result<usize, String> {
        let fs = self.fs()?;
        let Some(l) = &fs.gate.ledger else {
            return Err("this mount has no ledger".into());
        };
        let drafts =
            crate::ledger::ack_drafts(&fs.cfg.workspace, &req.paths, req.note.as_deref(), uid)?;
        let n = drafts.len();
        for mut d in drafts {
            // The acknowledged content is a version like any other: kept, so a diff or a
            // blame can compare against it later.
            if let (Some(rel), Some(h)) = (d.path.clone(), d.content_hash.as_deref()) {
                let known = h
                    .strip_prefix("sha256:")
                    .and_then(|x| hex::decode(x).ok())
                    .and_then(|b| <[u8; 32]>::try_from(b).ok());
                if let Ok(f) = std::fs::File::open(fs.cfg.workspace.join(&rel)) {
                    fs.keep_file(&rel, &f, known, false);
                }
                fs.note_versions(&rel, &mut d);
            }
            l.record(d)
                .map_err(|e| format!("the ledger cannot be written: {e}"))?;
        }
        Ok(n)
    }

    fn restore(
        &self,
        pid: u32,
        uid: u32,
        req: RestoreRequest,
    ) -> Result<serde_json::Value, String> {
        let fs = self.fs()?;
        let report = fs.restore(pid, uid, &req)?;
        serde_json::to_value(report).map_err(|e| e.to_string())
    }
}
