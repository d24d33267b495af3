//! Socket round trips, and the refusal of a peer with another uid.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::approval::broker::tests::{ask, config, on};
use crate::approval::{AskKind, Broker, Mode};

fn broker_with_socket(dir: &Path) -> (Arc<Broker>, PathBuf) {
    let sock = dir.join("run").join("approvals.sock");
    let mut cfg = config(Mode::Cli, Duration::from_secs(60), dir);
    cfg.socket_path = Some(sock.clone());
    // SAFETY: no preconditions.
    cfg.owner_uid = unsafe { libc::geteuid() };
    (Broker::start(cfg).unwrap(), sock)
}

fn my_uid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

#[test]
fn list_approve_reject_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let (b, sock) = broker_with_socket(dir.path());
    let by = format!("cli:uid={}", my_uid());
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let (cb1, rx1) = on();
    let id1 = b.ask(ask(AskKind::OutOfScope, "src/db/x.rs"), cb1);
    let (cb2, rx2) = on();
    let id2 = b.ask(ask(AskKind::Delete, "old.txt"), cb2);

    let r = call(&sock, &Request::List).unwrap();
    assert!(r.ok, "{r:?}");
    let p = r.pending.unwrap();
    assert_eq!(
        p.iter()
            .map(|p| (p.id, p.path.as_str()))
            .collect::<Vec<_>>(),
        [(id1, "src/db/x.rs"), (id2, "old.txt")]
    );

    // A grant the request does not offer is refused, and the request stays pending.
    let r = call(
        &sock,
        &Request::Approve {
            id: id2,
            grant: Grant::File,
        },
    )
    .unwrap();
    assert!(!r.ok);
    assert!(r.error.unwrap().contains("grant file does not apply"));
    assert_eq!(b.pending().len(), 2);

    let r = call(
        &sock,
        &Request::Approve {
            id: id1,
            grant: Grant::File,
        },
    )
    .unwrap();
    assert_eq!(
        r,
        Response {
            ok: true,
            ..Default::default()
        }
    );
    assert_eq!(
        rx1.recv_timeout(Duration::from_secs(5)).unwrap(),
        Decision::Approved {
            grant: Grant::File,
            by: by.clone()
        }
    );

    let r = call(&sock, &Request::Reject { id: id2 }).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(
        rx2.recv_timeout(Duration::from_secs(5)).unwrap(),
        Decision::Rejected { by }
    );

    for req in [
        Request::Reject { id: id2 },
        Request::Approve {
            id: 777,
            grant: Grant::Once,
        },
    ] {
        let r = call(&sock, &req).unwrap();
        assert!(!r.ok);
        assert!(r.error.unwrap().contains("already decided or timed out"));
    }
    b.shutdown();
    assert!(!sock.exists(), "socket file removed at shutdown");
}

#[test]
fn raw_protocol_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (b, sock) = broker_with_socket(dir.path());
    let (cb, rx) = on();
    let id = b.ask(ask(AskKind::OutOfScope, "a.rs"), cb);
    let s = UnixStream::connect(&sock).unwrap();
    let text = format!(
        "{{\"cmd\":\"list\"}}\n{{\"cmd\":\"nope\"}}\n{{\"cmd\":\"approve\",\"id\":{id},\"grant\":\"expand_scope\"}}\n"
    );
    (&s).write_all(text.as_bytes()).unwrap();
    let mut lines = BufReader::new(&s).lines();
    let list: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(list["ok"], true);
    assert_eq!(list["pending"][0]["id"], id);
    assert_eq!(list["pending"][0]["path"], "a.rs");
    assert_eq!(list["pending"][0]["kind"], "out_of_scope");
    let bad: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(bad["ok"], false);
    assert!(
        bad["error"].as_str().unwrap().starts_with("bad request"),
        "{bad}"
    );
    assert_eq!(lines.next().unwrap().unwrap(), "{\"ok\":true}");
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        Decision::Approved {
            grant: Grant::ExpandScope,
            ..
        }
    ));
    // An approve without a grant is a plain "once".
    let (cb, rx) = on();
    let id = b.ask(ask(AskKind::Delete, "b"), cb);
    (&s).write_all(format!("{{\"cmd\":\"approve\",\"id\":{id}}}\n").as_bytes())
        .unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "{\"ok\":true}");
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        Decision::Approved {
            grant: Grant::Once,
            ..
        }
    ));
}

#[test]
fn reset_calls_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let (b, sock) = broker_with_socket(dir.path());
    let r = call(
        &sock,
        &Request::Reset {
            identity: "session:1".into(),
        },
    )
    .unwrap();
    assert!(!r.ok);
    assert!(r.error.unwrap().contains("no circuit breaker"));
    let (tx, rx) = crossbeam_channel::unbounded();
    b.set_reset_hook(Box::new(move |id| {
        tx.send(id.to_string()).unwrap();
        id == "session:1"
    }));
    let r = call(
        &sock,
        &Request::Reset {
            identity: "session:1".into(),
        },
    )
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(rx.try_recv().unwrap(), "session:1");
    let r = call(
        &sock,
        &Request::Reset {
            identity: "session:2".into(),
        },
    )
    .unwrap();
    assert!(!r.ok);
    assert!(r.error.unwrap().contains("no identity \"session:2\""));
}

/// Forks a child that becomes uid/gid 65534 (nobody), connects to `sock`, sends
/// `request` and returns what it read; `Err(errno)` if it could not connect.
fn as_nobody(sock: &Path, request: &[u8]) -> Result<Vec<u8>, i32> {
    let cpath = CString::new(sock.as_os_str().as_bytes()).unwrap();
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(cpath.as_bytes_with_nul()) {
        *d = *s as libc::c_char;
    }
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes async-signal-safe libc calls on memory prepared before
    // the fork, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: in the forked child, as said above.
        unsafe {
            libc::close(fds[0]);
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                libc::_exit(120);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(s, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                libc::_exit(*libc::__errno_location());
            }
            libc::write(s, request.as_ptr().cast(), request.len());
            let mut buf = [0u8; 1024];
            loop {
                let n = libc::read(s, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                libc::write(fds[1], buf.as_ptr().cast(), n as usize);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: fds[0] is ours, fds[1] is the child's.
    unsafe { libc::close(fds[1]) };
    let mut out = Vec::new();
    // SAFETY: fds[0] is an open pipe we own from here on.
    unsafe { std::fs::File::from_raw_fd(fds[0]) }
        .read_to_end(&mut out)
        .unwrap();
    let mut status = 0;
    // SAFETY: pid is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    match libc::WEXITSTATUS(status) {
        0 => Ok(out),
        120 => panic!("child could not become uid 65534"),
        e => Err(e),
    }
}

#[test]
fn another_uid_is_refused() {
    if my_uid() != 0 {
        eprintln!("skipped: needs root to setuid a child");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (b, sock) = broker_with_socket(dir.path());
    let (cb, _rx) = on();
    let id = b.ask(ask(AskKind::OutOfScope, "x"), cb);
    let req = format!("{{\"cmd\":\"approve\",\"id\":{id}}}\n{{\"cmd\":\"list\"}}\n");

    // Layer 1: the socket file's mode (and the private runtime dir) keep others out.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        sock.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    assert_eq!(as_nobody(&sock, req.as_bytes()), Err(libc::EACCES));

    // Layer 2: with the mode opened up, the peer's uid from SO_PEERCRED still refuses it.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = String::from_utf8(as_nobody(&sock, req.as_bytes()).unwrap()).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one refusal line, then the connection is closed: {out:?}"
    );
    let r: Response = serde_json::from_str(lines[0]).unwrap();
    assert!(!r.ok);
    let e = r.error.unwrap();
    assert!(e.contains("permission denied: uid 65534"), "{e}");
    assert_eq!(b.pending().len(), 1, "the request is still pending");
}

/// Threads of this process, from the kernel.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Forks a child that becomes uid/gid 65534 and opens `n` connections to `sock`, sending
/// nothing. Returns once they are all connected; they stay open until the returned
/// guard is dropped (which also reaps the child).
fn idle_connections_as_nobody(sock: &Path, n: usize) -> impl Drop {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use nix::unistd::{fork, pipe2, read, setgid, setgroups, setuid, write, ForkResult, Gid, Uid};

    struct Held(Option<std::os::fd::OwnedFd>, nix::unistd::Pid);
    impl Drop for Held {
        fn drop(&mut self) {
            drop(self.0.take()); // EOF: the child closes its connections and exits
            let _ = nix::sys::wait::waitpid(self.1, None);
        }
    }

    let addr = UnixAddr::new(sock).unwrap();
    let (ready_rd, ready_wr) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (hold_rd, hold_wr) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    // SAFETY: the child makes only async-signal-safe syscalls on values prepared before the
    // fork (no allocation, no locks), then _exits.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            drop((ready_rd, hold_wr));
            let code = (|| {
                setgroups(&[]).ok()?;
                setgid(Gid::from_raw(65534)).ok()?;
                setuid(Uid::from_raw(65534)).ok()?;
                for _ in 0..n {
                    let s = socket(
                        AddressFamily::Unix,
                        SockType::Stream,
                        SockFlag::empty(),
                        None,
                    )
                    .ok()?;
                    connect(s.as_raw_fd(), &addr).ok()?;
                    std::mem::forget(s); // held open until _exit
                }
                write(&ready_wr, b"k").ok()?;
                let mut b = [0u8; 1];
                let _ = read(&hold_rd, &mut b);
                Some(0)
            })()
            .unwrap_or(1);
            // SAFETY: _exit ends the forked child without running the parent's handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop((ready_wr, hold_rd));
            let mut b = [0u8; 1];
            assert_eq!(
                read(&ready_rd, &mut b).unwrap(),
                1,
                "the child could not open its connections as uid 65534"
            );
            Held(Some(hold_wr), child)
        }
    }
}

#[test]
fn refused_connections_do_not_each_get_a_thread() {
    if my_uid() != 0 {
        eprintln!("skipped: needs root to setuid a child");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (b, sock) = broker_with_socket(dir.path());
    for d in [dir.path(), sock.parent().unwrap()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let before = thread_count();
    // 64 connections that never send: each refusal would wait for its request (2 s).
    let held = idle_connections_as_nobody(&sock, 64);
    // Let the accept loop see all of them.
    std::thread::sleep(Duration::from_millis(300));
    let during = thread_count();
    assert!(
        during <= before + MAX_REFUSING,
        "{} threads more while 64 refused connections are open (at most {MAX_REFUSING})",
        during.saturating_sub(before)
    );
    // The owner is still served at once.
    let r = call(&sock, &Request::List).unwrap();
    assert!(r.ok, "{r:?}");
    drop(held);
    b.shutdown();
}

#[test]
fn approve_answers_before_the_operation_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (b, sock) = broker_with_socket(dir.path());
    let (release, released) = crossbeam_channel::unbounded::<()>();
    let (tx, rx) = crossbeam_channel::unbounded();
    // A continuation that takes as long as the test wants (a slow re-run of the operation).
    let id = b.ask(
        ask(AskKind::OutOfScope, "slow.rs"),
        Box::new(move |d| {
            let _ = released.recv();
            let _ = tx.send(d);
        }),
    );
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    let s2 = sock.clone();
    std::thread::spawn(move || {
        let _ = done_tx.send(call(
            &s2,
            &Request::Approve {
                id,
                grant: Grant::Once,
            },
        ));
    });
    let r = done_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("`intentfs approve` waited for the re-run")
        .unwrap();
    assert!(r.ok, "{r:?}");
    assert!(rx.try_recv().is_err(), "the continuation is still running");
    release.send(()).unwrap();
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        Decision::Approved { .. }
    ));
}
