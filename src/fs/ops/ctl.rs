//! The virtual control files (`.intentfs/`): opening one renders it, writing one is the
//! handshake (see [`crate::control`]).

use super::*;
use crate::guard::{Code, Denial};

impl Fs {
    pub(super) fn open_ctl(
        &self,
        caller: &Caller,
        f: CtlFile,
        flags: i32,
    ) -> Result<(u64, OpenOpts)> {
        let acc = flags & libc::O_ACCMODE;
        if acc != libc::O_RDONLY && !f.writable() {
            return err(libc::EACCES);
        }
        let ident = self.gate.ids.resolve(caller.pid);
        if f == CtlFile::Status {
            // What it says includes every close made before it was opened.
            self.settle_records();
        }
        let rules = self.gate.guard.rules();
        let content = control::render(f, &ident, &self.gate.ids, &rules.policy, &|| {
            self.status_info()
        });
        let h = CtlHandle::new(f, content);
        let fh = self.add_handle(Handle::Control(Arc::new(Mutex::new(h))));
        Ok((
            fh,
            OpenOpts {
                direct_io: true,
                keep_cache: false,
                passthrough: false,
                noflush: true,
            },
        ))
    }

    pub(super) fn status_info(&self) -> control::StatusInfo {
        control::StatusInfo {
            workspace: self.cfg.workspace.display().to_string(),
            mountpoint: self.cfg.mountpoint.display().to_string(),
            policy: self.cfg.policy_path.display().to_string(),
            policy_error: self.gate.guard.reload_error(),
            nodes: self.table.len(),
            open_handles: self.table.open_handles(),
            transport: self.transport.get().cloned(),
            data: self.data_mode(),
            record: self.record_mode().name(),
            lessons_file: self
                .gate
                .guard
                .rules()
                .policy
                .lessons_file()
                .unwrap_or(Path::new(crate::fs::LESSON_FILE))
                .display()
                .to_string(),
            pending: match &self.gate.approver {
                crate::fs::approve::Approver::Human(b) => {
                    serde_json::to_value(b.pending()).unwrap_or_default()
                }
                _ => serde_json::json!([]),
            },
            counters: serde_json::json!({
                "lookups": self.counters.lookups.load(Ordering::Relaxed),
                "listings": self.counters.listings.load(Ordering::Relaxed),
                "opens": self.counters.opens.load(Ordering::Relaxed),
                "mutations": self.gate.counters.mutations.load(Ordering::Relaxed),
                "denials": self.gate.counters.denials.load(Ordering::Relaxed),
                "probe_refusals": self.gate.counters.probes.load(Ordering::Relaxed),
                "hashed_bytes": self.hashes.bytes.load(Ordering::Relaxed),
                "temporaries": self.gate.temps.len(),
                // The content store's work since the mount (no path: agents read this).
                "versions": self.store().map(|s| {
                    let c = &s.counters;
                    serde_json::json!({
                        "written": c.written.load(Ordering::Relaxed),
                        "deduplicated": c.deduplicated.load(Ordering::Relaxed),
                        "cloned": c.cloned.load(Ordering::Relaxed),
                        "bytes_in": c.bytes_in.load(Ordering::Relaxed),
                        "bytes_out": c.bytes_out.load(Ordering::Relaxed),
                    })
                }),
                "requests": self.counters.requests.to_json(),
                // `--record async`: closes recorded after their reply.
                "record": self.recorder.get().map(|r| {
                    let st = &r.stats;
                    serde_json::json!({
                        "queued": st.queued.load(Ordering::Relaxed),
                        "done": st.done.load(Ordering::Relaxed),
                        "failures": st.failures.load(Ordering::Relaxed),
                        "bytes": st.bytes.load(Ordering::Relaxed),
                        "not_deferred": st.not_deferred.load(Ordering::Relaxed),
                        "renames_deferred": self.renames_deferred.load(Ordering::Relaxed),
                    })
                }),
                "otlp": self.otlp.get().map(|s| s.to_json()),
                "low_latency": self.low_latency.get().map(|l| {
                    let (bursts, held_ms) = l.stats();
                    serde_json::json!({"held": l.held(), "bursts": bursts, "held_ms": held_ms})
                }),
            }),
        }
    }

    pub(super) fn write_ctl(
        &self,
        caller: &Caller,
        c: &Mutex<CtlHandle>,
        offset: u64,
        data: &[u8],
    ) -> Result<usize> {
        let mut c = c.lock();
        let off = offset as usize;
        if off + data.len() > 64 * 1024 {
            return err(libc::EFBIG);
        }
        if c.written.len() < off + data.len() {
            c.written.resize(off + data.len(), 0);
        }
        c.written[off..off + data.len()].copy_from_slice(data);
        let text = String::from_utf8_lossy(&c.written).into_owned();
        if c.file.is_query() {
            return self.query_ctl(caller, &mut c, &text).map(|()| data.len());
        }
        let ident = self.gate.ids.resolve(caller.pid);
        if c.file == CtlFile::Intent {
            // `--record async`: the closes made under the intent being left are recorded
            // under it.
            self.settle_records();
        }
        // (Held until the switch is on record: see `Fs::intent_switch`.)
        let _switch = (c.file == CtlFile::Intent && self.data_passthrough())
            .then(|| self.intent_switch.write());
        if _switch.is_some() {
            self.check_no_writes_open(&ident, caller)?;
        }
        let rules = self.gate.guard.rules();
        match control::apply_write(c.file, &ident, &rules.policy, &text) {
            Ok(None) => Ok(data.len()),
            Ok(Some((from, to))) => {
                tracing::info!(agent = %ident.name, identity = %ident.key, "intent {from:?} -> {to:?}");
                if let Some(l) = &self.gate.ledger {
                    let draft = Draft {
                        intent_id: to.clone(),
                        agent: Some(self.gate.agent(&ident, caller)),
                        mutation_type: Some(MutationType::Intent),
                        detail: Some(serde_json::json!({ "from": from, "to": to })),
                        ..Default::default()
                    };
                    if let Err(e) = l.record(draft) {
                        // The switch is undone: a selection that is not on record did not happen.
                        *ident.intent.lock() = from;
                        return Err(self.gate.ledger_denial(
                            &ident,
                            Operation::SelectIntent,
                            Path::new(".intentfs/intent"),
                            &e.to_string(),
                        ));
                    }
                }
                Ok(data.len())
            }
            Err(control::WriteError { errno, denial }) => {
                tracing::info!(agent = %ident.name, "handshake refused: {}", denial.message);
                let _ = self.gate.deny(&ident, caller, *denial);
                err(errno)
            }
        }
    }
}

impl Fs {
    /// With kernel passthrough of data, an identity's writes through handles it holds
    /// open never reach the daemon to be re-checked, so it cannot switch intent while it
    /// holds any: the writes would land under the old intent's decision but be recorded
    /// under the new one.
    fn check_no_writes_open(&self, ident: &Arc<Identity>, caller: &Caller) -> Result<()> {
        let open = self.write_handles_of(&ident.key);
        if open.is_empty() {
            return Ok(());
        }
        let mut names: Vec<String> = open
            .iter()
            .map(|h| {
                let rel = self.display_rel(&h.node);
                format!("{} (pid {})", rel.display(), h.caller.pid)
            })
            .collect();
        names.sort();
        names.dedup();
        let shown = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = names.len().saturating_sub(5);
        let list = if more > 0 {
            format!("{shown} and {more} more")
        } else {
            shown
        };
        let d = Denial::new(
            Code::WritesOpen,
            Operation::SelectIntent,
            Path::new(".intentfs/intent"),
            ident.intent().as_deref(),
            format!("this agent holds files open for writing: {list}"),
            "Close the files you have open for writing (finish or stop the commands writing \
             them), then select the new intent."
                .to_string(),
        );
        Err(self.gate.deny(ident, caller, d))
    }
}
