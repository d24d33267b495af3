//! The CLI channel: a Unix stream socket in the mount's runtime directory (outside the
//! workspace and the mount), one JSON request per line, one JSON response per line.
//!
//! ```text
//! {"cmd":"list"}                                  -> {"ok":true,"pending":[PendingInfo...]}
//! {"cmd":"approve","id":N,"grant":"once|file|expand_scope"}   -> {"ok":true}
//! {"cmd":"reject","id":N}                         -> {"ok":true}
//! {"cmd":"reset","identity":"run:123"}            -> {"ok":true}
//! {"cmd":"register","agent":"claude","intent":"INT-001"}  -> {"ok":true,"registered":{...}}
//! {"cmd":"lesson","identity":"run:123","command":"cargo test","status":101,"output":"..."}
//!                                                 -> {"ok":true,"file":"CLAUDE.md"}
//! {"cmd":"restore","command":"rewind","agent":"claude","force":false}
//!                                                 -> {"ok":true,"restored":{"restored":[...],"removed":[...],"skipped":[...]}}
//! any failure                                     -> {"ok":false,"error":"..."}
//! ```
//!
//! It is the mount's one control channel: approvals, breaker resets, identities
//! (`intentfs run` registers here, and the daemon moves the registering process into the new
//! identity) and lessons. Only the mount owner's uid and root may use it, so an agent running
//! under another uid can neither approve its own requests nor grant itself an identity: the socket file is mode 0600, and every connection's
//! `SO_PEERCRED` is checked anyway (a mode can be changed; the kernel's word cannot).
//!
//! A refused peer gets its answer from one of at most [`MAX_REFUSING`] short-lived threads;
//! beyond that its connection is closed unanswered, so another uid cannot make the daemon
//! spawn a thread per connection it opens.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use serde::{Deserialize, Serialize};

use super::decider::Decider;
use super::{
    AckRequest, Decision, Grant, LessonRequest, PendingInfo, RegisterRequest, Registered,
    RestoreRequest,
};

/// A client that sends nothing for this long is disconnected.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest request line accepted.
const MAX_LINE: u64 = 64 * 1024;
/// How long a refused peer has to send its request before it is answered anyway.
const REFUSE_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Refused connections answered at once; beyond this they are closed without an answer.
/// A person who mistyped the mount gets the explanation; a peer opening connections in a
/// loop gets no more than this many threads out of the daemon.
pub(crate) const MAX_REFUSING: usize = 4;

/// One request line.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// List pending requests.
    List,
    /// Approve request `id` with `grant` (default `once`).
    Approve {
        id: u64,
        #[serde(default = "once")]
        grant: Grant,
    },
    /// Reject request `id`.
    Reject { id: u64 },
    /// Reset the circuit breaker of `identity`.
    Reset { identity: String },
    /// Grant the calling process an identity of its own (`intentfs run`).
    Register(RegisterRequest),
    /// Record a failed verification's lesson (`intentfs run --verify`).
    Lesson(LessonRequest),
    /// Acknowledge files as they are on disk (`intentfs ledger ack`).
    Ack(AckRequest),
    /// Put recorded versions back (`intentfs restore`, `intentfs rewind`).
    Restore(RestoreRequest),
    /// Unmount as SIGTERM does: reject every pending request, then unmount (lazily if busy).
    /// `intentfs umount` sends it when the mount is busy with prompts pending, and it works
    /// where a signal cannot reach (a daemon in another pid namespace).
    Unmount,
}

fn once() -> Grant {
    Grant::Once
}

/// One response line.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Response {
    /// Whether the request succeeded.
    pub ok: bool,
    /// For `list`: the pending requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Vec<PendingInfo>>,
    /// Why it failed, for a person (lower-case, with a hint where one helps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// For `register`: the identity granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered: Option<Registered>,
    /// For `lesson`: the file it was appended to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// For `ack`: how many files were acknowledged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked: Option<usize>,
    /// For `restore`: what was restored, removed and skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<serde_json::Value>,
}

impl Response {
    fn ok() -> Response {
        Response {
            ok: true,
            ..Default::default()
        }
    }
    fn err(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            ..Default::default()
        }
    }
}

/// Sends one request to the socket at `path` and reads the response.
pub fn call(path: &Path, req: &Request) -> io::Result<Response> {
    let mut s = UnixStream::connect(path)?;
    // The daemon is the mount's owner: our own uid, or root. Anyone else listening here
    // took the socket's place, and must not receive an approval or a grant.
    let (_, server_uid) = peer_cred(&s)?;
    let me = nix::unistd::geteuid().as_raw();
    if server_uid != me && server_uid != 0 {
        return Err(io::Error::other(
            format!(
                "{} is served by uid {server_uid}, not by this user ({me}) or root: refusing to talk to it\n\
                 hint: another user may have taken the runtime directory; see `intentfs mount --help` (RUNTIME DIRECTORY)",
                path.display()
            ),
        ));
    }
    // A rewind writes a file per step and records each: it may take a while.
    let wait = if matches!(req, Request::Restore(_)) {
        600
    } else {
        30
    };
    s.set_read_timeout(Some(Duration::from_secs(wait)))?;
    let mut line = serde_json::to_string(req).map_err(io::Error::other)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(&s).take(16 << 20).read_line(&mut reply)?;
    if reply.trim().is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the daemon closed the approval socket without answering",
        ));
    }
    serde_json::from_str(&reply).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad answer from the daemon: {e}"),
        )
    })
}

/// The running socket server.
pub(crate) struct Server {
    /// The socket file, removed at stop.
    path: PathBuf,
    /// The listening socket, shared with the accept loop so its fd stays open (and is never
    /// reused) until both are done; shut down at stop to wake `accept`.
    listener: Arc<UnixListener>,
    /// Tells the accept loop to exit.
    stop: Arc<AtomicBool>,
    /// The accept loop.
    thread: JoinHandle<()>,
}

impl Server {
    /// Binds `path` (mode 0600, replacing a stale socket) and serves it on a thread.
    pub(crate) fn start(decider: Arc<dyn Decider>, path: &Path) -> io::Result<Server> {
        if let Some(dir) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket: refusing to replace it",
                        path.display()
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = Arc::new(UnixListener::bind(path)?);
        // Between bind and chmod the file has the umask's mode; the peer check below is
        // what actually guards every connection.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (l2, stop2) = (listener.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("intentfs-approval-socket".into())
            .spawn(move || accept_loop(&l2, decider, &stop2))?;
        tracing::info!(socket = %path.display(), "approval socket listening");
        Ok(Server {
            path: path.to_path_buf(),
            listener,
            stop,
            thread,
        })
    }

    /// Stops accepting, joins the accept loop and removes the socket file.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        // shutdown(2) on a listening socket makes a blocked accept(2) return on Linux. The
        // fd is `self.listener`'s, open for as long as we hold it.
        let _ =
            nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        let _ = self.thread.join();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Counts the refusing threads; a slot is given back when its thread ends.
struct RefuseSlot(Arc<AtomicUsize>);

impl RefuseSlot {
    fn try_take(n: &Arc<AtomicUsize>) -> Option<RefuseSlot> {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| {
            (k < MAX_REFUSING).then_some(k + 1)
        })
        .ok()
        .map(|_| RefuseSlot(n.clone()))
    }
}

impl Drop for RefuseSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn accept_loop(listener: &UnixListener, decider: Arc<dyn Decider>, stop: &AtomicBool) {
    let owner_uid = decider.config().owner_uid;
    let refusing = Arc::new(AtomicUsize::new(0));
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match conn {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and friends: do not spin.
                tracing::warn!("approval socket accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let (pid, uid) = match peer_cred(&stream) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("approval socket: cannot read the peer's credentials: {e}");
                continue;
            }
        };
        if uid != 0 && uid != owner_uid {
            tracing::warn!(
                uid,
                "approval socket: refused a connection from another uid"
            );
            let Some(slot) = RefuseSlot::try_take(&refusing) else {
                tracing::debug!(uid, "{MAX_REFUSING} refusals under way: closed unanswered");
                continue;
            };
            let r = Response::err(format!(
                "permission denied: uid {uid} may not use the approval socket of this mount \
                 (owner uid {owner_uid}); only the mount's owner and root decide approvals"
            ));
            // Read the client's request before answering and closing: a close with unread
            // data resets the connection, and the client would see EPIPE instead of this.
            let _ = std::thread::Builder::new()
                .name("intentfs-refuse".into())
                .spawn(move || {
                    let _slot = slot;
                    let _ = stream.set_read_timeout(Some(REFUSE_READ_TIMEOUT));
                    let mut line = String::new();
                    let _ = BufReader::new(&stream).take(MAX_LINE).read_line(&mut line);
                    let _ = write_response(&stream, &r);
                    let _ = stream.shutdown(std::net::Shutdown::Write);
                });
            continue;
        }
        let decider = decider.clone();
        let spawned = std::thread::Builder::new()
            .name("intentfs-approval-client".into())
            .spawn(move || serve_client(stream, decider.as_ref(), pid, uid));
        if let Err(e) = spawned {
            tracing::warn!("approval socket: cannot start a client thread: {e}");
        }
    }
}

/// `(pid, uid)` of the process at the other end, from the kernel (the pid as this process's
/// pid namespace sees it; 0 when it is not visible here).
pub fn peer_cred(s: &UnixStream) -> io::Result<(u32, u32)> {
    let cred = getsockopt(s, PeerCredentials)?;
    Ok((cred.pid().max(0) as u32, cred.uid()))
}

fn write_response(mut s: &UnixStream, r: &Response) -> io::Result<()> {
    let mut line = serde_json::to_string(r).map_err(io::Error::other)?;
    line.push('\n');
    s.write_all(line.as_bytes())
}

fn serve_client(stream: UnixStream, decider: &dyn Decider, pid: u32, uid: u32) {
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let mut reader = BufReader::new(&stream);
    loop {
        let mut line = String::new();
        match (&mut reader).take(MAX_LINE).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.trim().is_empty() {
            continue;
        }
        let r = match serde_json::from_str::<Request>(&line) {
            Ok(req) => handle(decider, req, pid, uid),
            Err(e) => Response::err(format!("bad request: {e}")),
        };
        if write_response(&stream, &r).is_err() {
            return;
        }
    }
}

/// Executes one request for a peer already known to be the owner or root.
fn handle(decider: &dyn Decider, req: Request, pid: u32, uid: u32) -> Response {
    let by = format!("cli:uid={uid}");
    let gone = |id: u64| {
        Response::err(format!("no pending request {id}: already decided or timed out\nhint: `intentfs approvals` lists pending requests"))
    };
    match req {
        Request::List => Response { ok: true, pending: Some(decider.pending()), ..Default::default() },
        Request::Approve { id, grant } => {
            let Some((kind, intent)) = decider.peek(id) else { return gone(id) };
            if !kind.allows(grant) {
                return Response::err(format!(
                    "request {id} is a {} request: grant {} does not apply\nhint: {}",
                    kind.as_str(),
                    grant.as_str(),
                    if kind.allows(Grant::File) { "--for-file or no flag" } else { "approve it without --for-file/--expand-scope" }
                ));
            }
            if grant == Grant::ExpandScope && intent.is_none() {
                return Response::err(format!(
                    "request {id} has no intent selected: there is no scope to expand\nhint: approve with --for-file or no flag"
                ));
            }
            if decider.decide(id, Decision::Approved { grant, by }) {
                Response::ok()
            } else {
                gone(id)
            }
        }
        Request::Reject { id } => {
            if decider.decide(id, Decision::Rejected { by }) {
                Response::ok()
            } else {
                gone(id)
            }
        }
        Request::Reset { identity } => match decider.reset(&identity) {
            Some(true) => Response::ok(),
            Some(false) => Response::err(format!(
                "no identity {identity:?} on this mount\nhint: identities are `default` or `run:<pid>`; `cat MOUNT/.intentfs/status` lists them"
            )),
            None => Response::err("this mount has no circuit breaker to reset"),
        },
        Request::Register(r) => with_operator(decider, |op| {
            op.register(pid, r).map(|reg| Response {
                ok: true,
                registered: Some(reg),
                ..Default::default()
            })
        }),
        Request::Lesson(l) => with_operator(decider, |op| {
            op.lesson(l).map(|file| Response {
                ok: true,
                file: Some(file),
                ..Default::default()
            })
        }),
        Request::Ack(r) => with_operator(decider, |op| {
            op.ack(uid, r).map(|n| Response {
                ok: true,
                acked: Some(n),
                ..Default::default()
            })
        }),
        Request::Restore(r) => with_operator(decider, |op| {
            op.restore(pid, uid, r).map(|v| Response {
                ok: true,
                restored: Some(v),
                ..Default::default()
            })
        }),
        Request::Unmount => {
            tracing::info!(uid, "approval socket: unmount requested");
            // The daemon's signal thread does the unmount (see `cli::mount::serve`).
            use nix::sys::signal::{kill, Signal};
            match kill(nix::unistd::getpid(), Signal::SIGTERM) {
                Ok(()) => Response::ok(),
                Err(e) => Response::err(format!(
                    "cannot signal the daemon: {}",
                    io::Error::from(e)
                )),
            }
        }
    }
}

/// Serve a request of the operator's (identities, lessons, acknowledgements) with the
/// filesystem's handler, once it is installed.
fn with_operator(
    decider: &dyn Decider,
    f: impl FnOnce(&dyn super::Operator) -> Result<Response, String>,
) -> Response {
    let Some(op) = decider.operator() else {
        return Response::err("the mount is still starting: try again in a moment");
    };
    f(op.as_ref()).unwrap_or_else(Response::err)
}

#[cfg(test)]
mod tests;
