//! The desktop channel: a freedesktop notification per request (notify-rust over zbus),
//! waited on by a dedicated thread, plus the circuit-breaker notice.
//!
//! Each prompt thread shows its notification, then waits for whichever comes first: an
//! action from the person, or its [`CancelToken`] (the request was decided elsewhere, timed
//! out, or the mount is going away), and then closes the notification so no stale prompt
//! lingers. notify-rust's blocking `wait_for_action` and `close` both consume the handle,
//! so a thread blocked in one could never do the other: we use the `&self` async versions
//! and drive them with futures-lite's `block_on` (zbus runs its own socket-reading thread,
//! so a park/unpark executor on the prompt thread is all it needs).
//!
//! The channel decides through [`Decider`]; it never sees the broker.

use crate::text::visible;
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use futures_lite::future::{block_on, or};
use notify_rust::{CloseReason, Notification, NotificationResponse, Timeout, Urgency};
use parking_lot::{Condvar, Mutex};

use super::decider::Decider;
use super::{Ask, AskKind, Decision, Grant};

/// At most this many notifications are waited on at once (each costs our thread and a
/// zbus connection thread); beyond it a request is pending for the CLI channel only.
pub(crate) const MAX_DESKTOP_PROMPTS: usize = 64;

/// Action keys. `approve`/`reject` are what the issue names; the test harness picks them.
const ACT_APPROVE: &str = "approve";
const ACT_APPROVE_FILE: &str = "approve-file";
const ACT_EXPAND: &str = "expand-scope";
const ACT_REJECT: &str = "reject";

/// Live prompt threads, and open circuit-breaker notices by identity.
#[derive(Default)]
pub(crate) struct Prompts {
    /// Number of live desktop threads (prompts and trip notices).
    live: Mutex<usize>,
    /// Signalled when `live` drops to zero.
    idle: Condvar,
    /// Open trip notices, so a reset from the CLI (or unmount) can close them.
    trips: Mutex<HashMap<String, Arc<CancelToken>>>,
}

impl Prompts {
    fn try_acquire(&self) -> bool {
        let mut n = self.live.lock();
        if *n >= MAX_DESKTOP_PROMPTS {
            return false;
        }
        *n += 1;
        true
    }

    fn release(&self) {
        let mut n = self.live.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.idle.notify_all();
        }
    }

    /// Number of live desktop threads.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        *self.live.lock()
    }

    /// Waits (at most `max`) until every desktop thread has closed its notification.
    pub(crate) fn wait_idle(&self, max: Duration) {
        let deadline = Instant::now() + max;
        let mut n = self.live.lock();
        while *n > 0 {
            if self.idle.wait_until(&mut n, deadline).timed_out() {
                tracing::warn!(live = *n, "desktop notifications still closing at shutdown");
                return;
            }
        }
    }

    pub(crate) fn close_trip_notice(&self, identity: &str) {
        if let Some(t) = self.trips.lock().remove(identity) {
            t.cancel();
        }
    }

    pub(crate) fn close_all_trip_notices(&self) {
        for (_, t) in self.trips.lock().drain() {
            t.cancel();
        }
    }
}

/// A prompt thread's broker and prompt table; releases its slot when the thread ends, even
/// by panic.
struct Slot {
    decider: Arc<dyn Decider>,
    prompts: Arc<Prompts>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.prompts.release();
    }
}

/// Shows request `id` as a notification on its own thread. Beyond the cap, or if a
/// thread cannot be spawned, the request stays pending for the CLI channel only.
pub(crate) fn spawn_prompt(
    decider: Arc<dyn Decider>,
    prompts: &Arc<Prompts>,
    id: u64,
    ask: Ask,
    token: Arc<CancelToken>,
) {
    if !prompts.try_acquire() {
        tracing::warn!(id, "{MAX_DESKTOP_PROMPTS} desktop prompts already open: request {id} is pending for `intentfs approve {id}` only");
        return;
    }
    let slot = Slot {
        decider,
        prompts: prompts.clone(),
    };
    let spawned = std::thread::Builder::new()
        .name(format!("intentfs-prompt-{id}"))
        .spawn(move || run_prompt(slot, id, ask, token));
    if let Err(e) = spawned {
        tracing::warn!(
            id,
            "cannot start a desktop prompt thread ({e}): request {id} is pending for the CLI only"
        );
    }
}

fn run_prompt(slot: Slot, id: u64, ask: Ask, token: Arc<CancelToken>) {
    let decider = &slot.decider;
    let cfg = decider.config();
    let n = request_notification(id, &ask, &cfg.mountpoint, cfg.timeout);
    let handle = match block_on(n.show_async()) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(id, "desktop notification failed ({e}): request {id} is pending for `intentfs approve {id}` only");
            return;
        }
    };
    loop {
        let mut response = None;
        if cancelled_first(
            handle.wait_for_action_async(|r| response = Some(r.clone())),
            &token,
        ) {
            break; // decided elsewhere: close below
        }
        let d = match response {
            // The D-Bus connection ended without a signal: nothing more will come.
            None => break,
            Some(NotificationResponse::Action(key)) => match action_decision(&ask, &key) {
                Some(d) => d,
                None => {
                    tracing::debug!(id, key, "ignoring notification action");
                    continue;
                }
            },
            Some(NotificationResponse::Default | NotificationResponse::Reply(_)) => continue,
            Some(NotificationResponse::Closed(CloseReason::Expired)) => {
                // The daemon expired it despite Timeout::Never: that is not a person's no.
                tracing::info!(id, "desktop notification expired: request {id} stays pending for `intentfs approve {id}`");
                return;
            }
            Some(NotificationResponse::Closed(_)) => {
                decider.decide(
                    id,
                    Decision::Rejected {
                        by: "desktop".into(),
                    },
                );
                return; // already closed
            }
        };
        decider.decide(id, d);
        break;
    }
    block_on(handle.close_async());
}

/// The decision an action key means, or `None` for a key this request does not offer.
fn action_decision(ask: &Ask, key: &str) -> Option<Decision> {
    let by = || "desktop".to_string();
    let grant = match key {
        ACT_REJECT => return Some(Decision::Rejected { by: by() }),
        ACT_APPROVE => Grant::Once,
        ACT_APPROVE_FILE => Grant::File,
        ACT_EXPAND if ask.intent.is_some() => Grant::ExpandScope,
        _ => return None,
    };
    ask.kind
        .allows(grant)
        .then(|| Decision::Approved { grant, by: by() })
}

/// The notification for one request: summary names the question and the file (dunst and
/// other daemons list actions by summary, so a person with many prompts open can tell them
/// apart), body says who, which intent, which operation, and how to answer from a terminal.
fn request_notification(id: u64, ask: &Ask, mountpoint: &Path, timeout: Duration) -> Notification {
    let path = visible(&ask.path.to_string_lossy());
    let question = match ask.kind {
        AskKind::OutOfScope => "approve write outside scope?",
        AskKind::SensitiveRead => "approve reading a sensitive file?",
        AskKind::Delete => "approve delete?",
    };
    let summary = format!("intentfs: {question} {}", shorten(&path, 60));
    let intent = ask
        .intent
        .as_deref()
        .map(visible)
        .unwrap_or_else(|| "none selected".into());
    let reason = ask
        .reason
        .as_deref()
        .map(|r| format!("the agent says: \"{}\"\n", shorten(&visible(r), 200)))
        .unwrap_or_default();
    let body = format!(
        "agent: {agent} ({identity})\nintent: {intent}\noperation: {op} {path}\nmount: {mount}\n{reason}\
         request #{id}: rejected after {secs}s without an answer; `intentfs approve {id}` works too",
        agent = visible(&ask.agent),
        identity = visible(&ask.identity),
        op = visible(&ask.op),
        mount = visible(&mountpoint.to_string_lossy()),
        secs = timeout.as_secs(),
    );
    let mut n = Notification::new();
    n.appname("intentfs")
        .summary(&summary)
        .body(&escape_markup(&body))
        .urgency(Urgency::Critical)
        .timeout(Timeout::Never)
        .action(ACT_APPROVE, "Approve once");
    if ask.kind.allows(Grant::File) {
        n.action(ACT_APPROVE_FILE, "Approve this file for the session");
    }
    if ask.kind.allows(Grant::ExpandScope) && ask.intent.is_some() && !ask.suggested_glob.is_empty()
    {
        n.action(
            ACT_EXPAND,
            &format!(
                "Expand scope: {}",
                shorten(&visible(&ask.suggested_glob), 40)
            ),
        );
    }
    n.action(ACT_REJECT, "Reject");
    n
}

/// Shows the circuit-breaker notice for `identity`; approving it resets the breaker.
pub(crate) fn spawn_trip_notice(
    decider: Arc<dyn Decider>,
    prompts: &Arc<Prompts>,
    identity: &str,
    agent: &str,
    denials: u32,
) {
    if !prompts.try_acquire() {
        tracing::warn!(
            identity,
            "too many desktop prompts: use `intentfs reset {identity}`"
        );
        return;
    }
    let token = Arc::new(CancelToken::default());
    if let Some(old) = prompts
        .trips
        .lock()
        .insert(identity.to_string(), token.clone())
    {
        old.cancel();
    }
    let slot = Slot {
        decider,
        prompts: prompts.clone(),
    };
    let (identity, agent) = (identity.to_string(), agent.to_string());
    let spawned = std::thread::Builder::new()
        .name("intentfs-trip-notice".into())
        .spawn(move || run_trip_notice(slot, identity, agent, denials, token));
    if let Err(e) = spawned {
        tracing::warn!("cannot start the trip notice thread: {e}");
    }
}

fn run_trip_notice(
    slot: Slot,
    identity: String,
    agent: String,
    denials: u32,
    token: Arc<CancelToken>,
) {
    let (decider, prompts) = (&slot.decider, &slot.prompts);
    let body = format!(
        "agent {} ({}) was refused {denials} times and is stopped: its mutations fail with \
         CIRCUIT_OPEN.\nmount: {}\nApprove to let it continue, or run `intentfs reset {}`.",
        visible(&agent),
        visible(&identity),
        visible(&decider.config().mountpoint.to_string_lossy()),
        visible(&identity),
    );
    let mut n = Notification::new();
    n.appname("intentfs")
        .summary(&format!(
            "intentfs: agent {} stopped (circuit breaker)",
            shorten(&visible(&agent), 40)
        ))
        .body(&escape_markup(&body))
        .urgency(Urgency::Critical)
        .timeout(Timeout::Never)
        .action(ACT_APPROVE, "Reset: let it continue")
        .action(ACT_REJECT, "Keep it stopped");
    let handle = match block_on(n.show_async()) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(
                identity,
                "desktop notification failed ({e}): use `intentfs reset {identity}`"
            );
            return;
        }
    };
    loop {
        let mut response = None;
        if cancelled_first(
            handle.wait_for_action_async(|r| response = Some(r.clone())),
            &token,
        ) {
            break;
        }
        match response {
            Some(NotificationResponse::Action(key)) if key == ACT_APPROVE => {
                prompts.trips.lock().remove(&identity);
                match decider.reset(&identity) {
                    Some(true) => {}
                    Some(false) => {
                        tracing::warn!(identity, "reset from the desktop: unknown identity")
                    }
                    None => {
                        tracing::warn!(identity, "reset from the desktop: no reset hook installed")
                    }
                }
                break;
            }
            Some(NotificationResponse::Action(key)) if key == ACT_REJECT => break,
            Some(NotificationResponse::Closed(_)) | None => return,
            Some(_) => continue,
        }
    }
    // Only the notice we registered: a newer trip may have replaced it.
    let mut trips = prompts.trips.lock();
    if trips.get(&identity).is_some_and(|t| Arc::ptr_eq(t, &token)) {
        trips.remove(&identity);
    }
    drop(trips);
    block_on(handle.close_async());
}

/// Keeps the end of a long path (the file name matters most).
fn shorten(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n - (max - 1)).collect();
    format!("…{tail}")
}

/// Bodies may be interpreted as markup (`body-markup`): a file named `<b>` must show as is.
fn escape_markup(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Whether a D-Bus session bus looks reachable: `DBUS_SESSION_BUS_ADDRESS` (or, unset,
/// `$XDG_RUNTIME_DIR/bus`) names a unix socket that accepts a connection. Used for the
/// default of `mount --approver`.
pub fn desktop_available() -> bool {
    match std::env::var("DBUS_SESSION_BUS_ADDRESS") {
        Ok(addr) if !addr.trim().is_empty() => addr.split(';').any(address_reachable),
        _ => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) => std::os::unix::net::UnixStream::connect(Path::new(&d).join("bus")).is_ok(),
            None => false,
        },
    }
}

/// One D-Bus address (`unix:path=...`, `unix:abstract=...`): can we connect?
fn address_reachable(addr: &str) -> bool {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};
    let Some(params) = addr.trim().strip_prefix("unix:") else {
        // tcp: and friends: we cannot cheaply tell; let zbus try.
        return !addr.trim().is_empty();
    };
    for kv in params.split(',') {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let v = unescape_dbus(v);
        match k {
            "path" => return UnixStream::connect(Path::new(&v)).is_ok(),
            "abstract" => {
                return SocketAddr::from_abstract_name(v.as_bytes())
                    .and_then(|a| UnixStream::connect_addr(&a))
                    .is_ok()
            }
            _ => {}
        }
    }
    false
}

/// D-Bus addresses escape bytes as `%xx`.
fn unescape_dbus(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Wakes a prompt thread when its request is decided elsewhere.
#[derive(Default)]
pub(crate) struct CancelToken {
    /// Cancelled yet, and the waker of the thread waiting for it.
    state: Mutex<(bool, Option<Waker>)>,
}

impl CancelToken {
    pub(crate) fn cancel(&self) {
        let waker = {
            let mut st = self.state.lock();
            st.0 = true;
            st.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn cancelled(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            let mut st = self.state.lock();
            if st.0 {
                Poll::Ready(())
            } else {
                st.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        })
    }
}

/// Waits on this thread for `wait` (a notification's action) or `token`, whichever comes
/// first; true when the token was (the action wins a tie, as it was the person's answer).
fn cancelled_first(wait: impl Future<Output = ()>, token: &CancelToken) -> bool {
    block_on(or(
        async {
            wait.await;
            false
        },
        async {
            token.cancelled().await;
            true
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(kind: AskKind, intent: Option<&str>) -> Ask {
        Ask {
            kind,
            identity: "default".into(),
            agent: "claude".into(),
            intent: intent.map(String::from),
            op: "open-write".into(),
            path: "src/a.rs".into(),
            suggested_glob: "src/**".into(),
            reason: None,
        }
    }

    #[test]
    fn action_keys_map_to_decisions_the_request_allows() {
        let oos = ask(AskKind::OutOfScope, Some("INT-1"));
        let approved = |g| {
            Some(Decision::Approved {
                grant: g,
                by: "desktop".into(),
            })
        };
        assert_eq!(action_decision(&oos, "approve"), approved(Grant::Once));
        assert_eq!(action_decision(&oos, "approve-file"), approved(Grant::File));
        assert_eq!(
            action_decision(&oos, "expand-scope"),
            approved(Grant::ExpandScope)
        );
        assert_eq!(
            action_decision(&oos, "reject"),
            Some(Decision::Rejected {
                by: "desktop".into()
            })
        );
        assert_eq!(action_decision(&oos, "default"), None);
        let del = ask(AskKind::Delete, Some("INT-1"));
        assert_eq!(action_decision(&del, "approve-file"), None);
        assert_eq!(action_decision(&del, "expand-scope"), None);
        let no_intent = ask(AskKind::OutOfScope, None);
        assert_eq!(action_decision(&no_intent, "expand-scope"), None);
    }

    #[test]
    fn prompt_text_cannot_be_forged_by_file_names() {
        let mut a = ask(AskKind::SensitiveRead, None);
        a.path = "x\n\nintent: APPROVED <b>&".into();
        let n = request_notification(7, &a, Path::new("/mnt"), Duration::from_secs(60));
        assert!(!n.summary.contains('\n'), "{}", n.summary);
        assert!(
            n.body.contains("x\\n\\nintent: APPROVED &lt;b&gt;&amp;"),
            "{}",
            n.body
        );
        assert!(n.body.contains("intent: none selected"), "{}", n.body);
        let keys: Vec<&String> = n.actions.iter().step_by(2).collect();
        assert_eq!(keys, ["approve", "approve-file", "reject"]);
    }

    #[test]
    fn bus_address_probe() {
        assert_eq!(unescape_dbus("/tmp/a%2cb"), "/tmp/a,b");
        assert_eq!(unescape_dbus("abc%"), "abc%");
        assert!(!address_reachable("unix:path=/nonexistent/intentfs-bus"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bus");
        let _l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        assert!(address_reachable(&format!(
            "unix:path={},guid=00",
            p.display()
        )));
    }
}
