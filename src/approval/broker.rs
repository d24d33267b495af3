//! The broker: the table of pending requests, their timeout, and the one place a request
//! is decided. Channels (desktop prompts, the CLI socket) only call [`Decider::decide`];
//! whichever calls it first wins, and the request's callback runs exactly once because
//! deciding removes the request from the table under the lock before anything else happens.
//!
//! A callback re-runs a whole filesystem operation, so it does not run on the thread that
//! decided (a socket client, a desktop prompt, the timeout thread): it is handed to the
//! broker's resume pool, and `intentfs approve` gets its answer as soon as the decision is
//! taken, not after the re-run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex, RwLock};

use super::decider::Decider;
use super::desktop::{self, CancelToken, Prompts};
use super::socket::Server;
use super::{Ask, AskKind, BrokerConfig, Decision, Grant, Mode, OnDecision, Operator, PendingInfo};

/// The filesystem's circuit-breaker reset: identity key -> whether it was known.
type ResetHook = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// How long [`Broker::shutdown`] waits for desktop prompts to close their notifications.
const DESKTOP_CLOSE_GRACE: Duration = Duration::from_secs(3);

/// Threads of the resume pool. A re-run may wait on the disk or on the ledger's queue: a
/// few side by side keep one slow re-run from holding up the next decision's, and a fixed
/// number keeps a burst of decisions (an unmount rejecting hundreds) from becoming as many
/// threads.
const RESUME_THREADS: usize = 4;

/// The human-approval broker of one mount. Cheap to share (`Arc`), `Send + Sync`.
///
/// Dropping the last `Arc` shuts it down like [`Broker::shutdown`].
pub struct Broker {
    /// What the threads share.
    inner: Arc<Inner>,
    /// The timeout thread, joined at shutdown.
    timer: Mutex<Option<JoinHandle<()>>>,
    /// The CLI socket server, stopped at shutdown.
    socket: Mutex<Option<Server>>,
}

/// State shared by the broker, its timeout thread, the socket server and desktop prompts.
pub(crate) struct Inner {
    /// The configuration the broker was started with.
    pub(crate) cfg: BrokerConfig,
    /// The next request id; ids start at 1 and are never reused within a mount.
    next_id: AtomicU64,
    /// Pending requests and the shutdown flag, under one lock so that a request can never
    /// be added after shutdown has taken the table.
    state: Mutex<State>,
    /// Wakes the timeout thread: a new request (new deadline) or shutdown.
    wake_timer: Condvar,
    /// The filesystem's breaker reset, if installed.
    reset_hook: RwLock<Option<ResetHook>>,
    /// What the control socket does besides approvals (grant identities, lessons).
    operator: RwLock<Option<Arc<dyn Operator>>>,
    /// Live desktop notification threads and open circuit-breaker notices.
    pub(crate) prompts: Arc<Prompts>,
    /// Where decided requests' callbacks run.
    resume: ResumePool,
}

/// Questions one identity may have waiting for a human at once; the next is refused at
/// once (`APPROVALS_PENDING`) without asking. An agent that parks question after question
/// would otherwise flood the human, and over FUSE-over-io_uring each waiting request holds
/// one of its CPU's ring entries (32, `src/fuse/mod.rs`): enough of them would stall every
/// agent's requests from that CPU until the questions time out.
pub const MAX_PENDING_PER_IDENTITY: usize = 16;
/// Questions waiting at once from all identities (below a ring queue's 30 spare entries,
/// so waiting questions alone never stall a CPU's requests).
pub const MAX_PENDING: usize = 24;
/// How a refusal by the limits above names its decider (`by`).
pub const LIMIT_PREFIX: &str = "limit: ";

/// What `Inner::state` guards.
struct State {
    /// Pending requests by id.
    pending: BTreeMap<u64, Pending>,
    /// Set once by shutdown; afterwards every ask is rejected at once.
    shutdown: bool,
}

/// A parked request.
struct Pending {
    /// What was asked.
    ask: Ask,
    /// Called once with the decision.
    on: OnDecision,
    /// When it was asked (for `age_ms`).
    created: Instant,
    /// When it times out.
    deadline: Instant,
    /// Cancels its desktop notification, if it has one.
    prompt: Option<Arc<CancelToken>>,
}

impl Broker {
    /// Starts the timeout thread and (if `socket_path`) the socket server thread.
    pub fn start(cfg: BrokerConfig) -> std::io::Result<Arc<Broker>> {
        let socket_path = cfg.socket_path.clone();
        let resume = ResumePool::start(RESUME_THREADS)?;
        let inner = Arc::new(Inner {
            cfg,
            next_id: AtomicU64::new(1),
            state: Mutex::new(State {
                pending: BTreeMap::new(),
                shutdown: false,
            }),
            wake_timer: Condvar::new(),
            reset_hook: RwLock::new(None),
            operator: RwLock::new(None),
            prompts: Arc::default(),
            resume,
        });
        let socket = match socket_path {
            Some(p) => match Server::start(inner.clone(), &p) {
                Ok(s) => Some(s),
                Err(e) => {
                    inner.resume.drain();
                    return Err(e);
                }
            },
            None => None,
        };
        let timer_inner = inner.clone();
        let timer = std::thread::Builder::new()
            .name("intentfs-approval-timeout".into())
            .spawn(move || timer_inner.run_timeouts());
        let timer = match timer {
            Ok(t) => t,
            Err(e) => {
                if let Some(s) = socket {
                    s.stop();
                }
                inner.resume.drain();
                return Err(e);
            }
        };
        tracing::info!(mode = ?inner.cfg.mode, timeout_s = inner.cfg.timeout.as_secs_f64(), "approval broker started");
        Ok(Arc::new(Broker {
            inner,
            timer: Mutex::new(Some(timer)),
            socket: Mutex::new(socket),
        }))
    }

    /// Parks `ask` until a decision, then calls `on` exactly once. Never blocks the caller:
    /// Deny/Allow decide at once (`on` runs inline); Desktop shows a notification and the
    /// request is also pending for the CLI channel; Cli only pends (`on` runs on the resume
    /// pool once decided). Returns the request id.
    pub fn ask(&self, ask: Ask, on: OnDecision) -> u64 {
        self.inner.ask(ask, on)
    }

    /// The pending requests, oldest first.
    pub fn pending(&self) -> Vec<PendingInfo> {
        self.inner.pending()
    }

    /// Decides request `id`. False if it is unknown or already decided (or timed out).
    /// Returns without waiting for the request's callback, which runs on the resume pool.
    pub fn decide(&self, id: u64, d: Decision) -> bool {
        self.inner.decide(id, d)
    }

    /// Install what serves the operator's other requests on the control socket.
    pub fn set_operator(&self, op: Arc<dyn Operator>) {
        *self.inner.operator.write() = Some(op);
    }

    /// Installs the filesystem's circuit-breaker reset: identity key -> false if unknown.
    /// Used by `intentfs reset` and by approving a desktop trip notice.
    pub fn set_reset_hook(&self, f: Box<dyn Fn(&str) -> bool + Send + Sync>) {
        *self.inner.reset_hook.write() = Some(Arc::from(f));
    }

    /// Announces a tripped circuit breaker. In Desktop mode a notification offers to reset
    /// it (approving calls the reset hook); in the other modes it is only logged.
    pub fn announce_trip(&self, identity: &str, agent: &str, denials: u32) {
        tracing::warn!(
            identity,
            agent,
            denials,
            "circuit breaker tripped: mutations refused with CIRCUIT_OPEN until `intentfs reset {identity}`"
        );
        if self.inner.cfg.mode == Mode::Desktop && !self.inner.is_shut_down() {
            desktop::spawn_trip_notice(
                self.inner.clone(),
                &self.inner.prompts,
                identity,
                agent,
                denials,
            );
        }
    }

    /// Unmount: every pending request is decided `Rejected { by: "unmount" }`, desktop
    /// notifications are closed, threads stop and the socket file is removed. The resume
    /// pool is drained: every callback handed to it has run when this returns (unless this
    /// is itself a callback on the pool, which cannot wait for itself: then its own thread
    /// runs what is left once the callback returns). Idempotent.
    pub fn shutdown(&self) {
        let taken = {
            let mut st = self.inner.state.lock();
            if st.shutdown {
                None
            } else {
                st.shutdown = true;
                Some(std::mem::take(&mut st.pending))
            }
        };
        self.inner.wake_timer.notify_all();
        let Some(taken) = taken else { return };
        let n = taken.len();
        for (id, p) in taken {
            self.inner.finish(
                id,
                p,
                Decision::Rejected {
                    by: "unmount".into(),
                },
            );
        }
        if let Some(s) = self.socket.lock().take() {
            s.stop();
        }
        self.inner.prompts.close_all_trip_notices();
        self.inner.prompts.wait_idle(DESKTOP_CLOSE_GRACE);
        if let Some(t) = self.timer.lock().take() {
            // Callbacks no longer run on the timeout thread, but never join oneself anyway.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        // Last: decisions taken by a channel or the timeout thread just before the table was
        // taken are in the pool by now, and run before it stops.
        self.inner.resume.drain();
        tracing::info!(rejected = n, "approval broker stopped");
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn ask(self: &Arc<Self>, ask: Ask, on: OnDecision) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let immediate = match self.cfg.mode {
            Mode::Deny => Some(Decision::Rejected {
                by: "approver:deny".into(),
            }),
            Mode::Allow => Some(Decision::Approved {
                grant: Grant::Once,
                by: "approver:allow".into(),
            }),
            Mode::Desktop | Mode::Cli => None,
        };
        if let Some(d) = immediate {
            tracing::info!(id, kind = ask.kind.as_str(), path = %ask.path.display(), decision = ?d, "approval decided by --approver");
            on(d);
            return id;
        }
        let prompt = (self.cfg.mode == Mode::Desktop).then(|| Arc::new(CancelToken::default()));
        let now = Instant::now();
        let log_ask = ask.clone();
        {
            let mut st = self.state.lock();
            if st.shutdown {
                drop(st);
                on(Decision::Rejected {
                    by: "unmount".into(),
                });
                return id;
            }
            let mine = st
                .pending
                .values()
                .filter(|p| p.ask.identity == ask.identity)
                .count();
            if mine >= MAX_PENDING_PER_IDENTITY || st.pending.len() >= MAX_PENDING {
                let total = st.pending.len();
                drop(st);
                tracing::warn!(
                    id,
                    identity = %ask.identity,
                    path = %ask.path.display(),
                    waiting = mine,
                    total,
                    "approval not asked: too many questions already wait"
                );
                on(Decision::Rejected {
                    by: format!(
                        "{LIMIT_PREFIX}{mine} of this agent's questions ({total} in all) already wait for a human \
                         (at most {MAX_PENDING_PER_IDENTITY} per agent, {MAX_PENDING} in all)"
                    ),
                });
                return id;
            }
            st.pending.insert(
                id,
                Pending {
                    ask,
                    on,
                    created: now,
                    deadline: now + self.cfg.timeout,
                    prompt: prompt.clone(),
                },
            );
        }
        self.wake_timer.notify_one();
        tracing::info!(
            id,
            kind = log_ask.kind.as_str(),
            identity = %log_ask.identity,
            agent = %log_ask.agent,
            op = %log_ask.op,
            path = %log_ask.path.display(),
            "approval requested: `intentfs approvals` lists it"
        );
        if let Some(token) = prompt {
            desktop::spawn_prompt(self.clone(), &self.prompts, id, log_ask, token);
        }
        id
    }

    fn pending(&self) -> Vec<PendingInfo> {
        let now = Instant::now();
        let st = self.state.lock();
        st.pending
            .iter()
            .map(|(&id, p)| PendingInfo {
                id,
                identity: p.ask.identity.clone(),
                agent: p.ask.agent.clone(),
                intent: p.ask.intent.clone(),
                kind: p.ask.kind.as_str().into(),
                op: p.ask.op.clone(),
                path: p.ask.path.to_string_lossy().into_owned(),
                age_ms: u64::try_from(now.saturating_duration_since(p.created).as_millis())
                    .unwrap_or(u64::MAX),
                reason: p.ask.reason.clone(),
            })
            .collect()
    }

    fn peek(&self, id: u64) -> Option<(AskKind, Option<String>)> {
        let st = self.state.lock();
        st.pending
            .get(&id)
            .map(|p| (p.ask.kind, p.ask.intent.clone()))
    }

    fn decide(&self, id: u64, d: Decision) -> bool {
        // Removing under the lock is what makes "first channel wins, callback once" hold.
        let Some(p) = self.state.lock().pending.remove(&id) else {
            tracing::debug!(id, decision = ?d, "approval already decided; ignoring");
            return false;
        };
        self.finish(id, p, d);
        true
    }

    /// Runs the consequences of a decision of a request already removed from the table: the
    /// prompt is closed and a scope grant recorded here, the callback goes to the pool.
    fn finish(&self, id: u64, p: Pending, d: Decision) {
        if let Some(t) = &p.prompt {
            t.cancel();
        }
        if let Decision::Approved {
            grant: Grant::ExpandScope,
            ..
        } = &d
        {
            let intent = p.ask.intent.as_deref().unwrap_or("");
            if let Err(e) = super::record_scope_update(
                &self.cfg.workspace,
                intent,
                &p.ask.suggested_glob,
                &p.ask.identity,
                &p.ask.agent,
                &p.ask.path,
            ) {
                tracing::error!(id, glob = %p.ask.suggested_glob, "cannot record the scope update in {}: {e}", super::SCOPE_UPDATES_FILE);
            }
        }
        let waited_ms = p.created.elapsed().as_millis();
        tracing::info!(id, decision = ?d, waited_ms, path = %p.ask.path.display(), "approval decided");
        let on = p.on;
        self.resume.run(Box::new(move || on(d)));
    }

    fn reset(&self, identity: &str) -> Option<bool> {
        let hook = self.reset_hook.read().clone()?;
        let known = hook(identity);
        if known {
            self.prompts.close_trip_notice(identity);
        }
        tracing::info!(identity, known, "circuit breaker reset requested");
        Some(known)
    }

    fn is_shut_down(&self) -> bool {
        self.state.lock().shutdown
    }

    /// The timeout thread: sleeps until the earliest deadline (or a new request), decides
    /// the expired requests `TimedOut` outside the lock, and exits at shutdown.
    fn run_timeouts(&self) {
        loop {
            let expired: Vec<(u64, Pending)> = {
                let mut st = self.state.lock();
                loop {
                    if st.shutdown {
                        return;
                    }
                    let now = Instant::now();
                    let due: Vec<u64> = st
                        .pending
                        .iter()
                        .filter(|(_, p)| p.deadline <= now)
                        .map(|(&id, _)| id)
                        .collect();
                    if !due.is_empty() {
                        break due
                            .into_iter()
                            .filter_map(|id| st.pending.remove(&id).map(|p| (id, p)))
                            .collect();
                    }
                    match st.pending.values().map(|p| p.deadline).min() {
                        Some(next) => {
                            self.wake_timer.wait_until(&mut st, next);
                        }
                        None => self.wake_timer.wait(&mut st),
                    }
                }
            };
            for (id, p) in expired {
                self.finish(id, p, Decision::TimedOut);
            }
        }
    }
}

impl Decider for Inner {
    fn config(&self) -> &BrokerConfig {
        &self.cfg
    }

    fn decide(&self, id: u64, d: Decision) -> bool {
        Inner::decide(self, id, d)
    }

    fn pending(&self) -> Vec<PendingInfo> {
        Inner::pending(self)
    }

    fn peek(&self, id: u64) -> Option<(AskKind, Option<String>)> {
        Inner::peek(self, id)
    }

    /// Calls the reset hook and closes the identity's trip notice.
    fn reset(&self, identity: &str) -> Option<bool> {
        Inner::reset(self, identity)
    }

    fn operator(&self) -> Option<Arc<dyn Operator>> {
        self.operator.read().clone()
    }
}

/// A callback with its decision, ready to run.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// A few threads that run decided requests' callbacks, fed by a channel. Stopped by
/// [`ResumePool::drain`], which lets them finish everything already handed over.
struct ResumePool {
    /// The feeding end; `None` once drained (later jobs run on the caller's thread).
    tx: Mutex<Option<Sender<Job>>>,
    /// The pool's threads, joined at drain.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl ResumePool {
    fn start(n: usize) -> std::io::Result<ResumePool> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let pool = ResumePool {
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(Vec::with_capacity(n)),
        };
        for i in 0..n {
            let rx = rx.clone();
            let t = std::thread::Builder::new()
                .name(format!("intentfs-resume-{i}"))
                .spawn(move || Self::work(&rx));
            match t {
                Ok(t) => pool.threads.lock().push(t),
                Err(e) => {
                    pool.drain();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    /// Until the channel is closed and empty: run each job. A panicking callback is logged
    /// and does not take its thread down with it (the pool would shrink for good).
    fn work(rx: &Receiver<Job>) {
        for job in rx.iter() {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                tracing::error!("an approval callback panicked");
            }
        }
    }

    /// Runs `job` on the pool; on this thread once the pool is drained, so that a decision
    /// racing with unmount still runs its callback exactly once.
    fn run(&self, job: Job) {
        let tx = self.tx.lock().clone();
        let job = match tx {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(crossbeam_channel::SendError(job)) => job,
            },
            None => job,
        };
        job();
    }

    /// Closes the channel and waits until the threads have run every job handed over
    /// (never for the calling thread, when a callback unmounts). Idempotent.
    fn drain(&self) {
        drop(self.tx.lock().take());
        let threads = std::mem::take(&mut *self.threads.lock());
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
