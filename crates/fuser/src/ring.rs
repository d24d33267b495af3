//! intentfs addition: the FUSE-over-io_uring transport (FUSE ABI 7.42, Linux 6.14+).
//!
//! After FUSE_INIT (over /dev/fuse) negotiated `FUSE_OVER_IO_URING`, each kernel queue (one
//! per possible CPU) gets `entries` ring entries, registered with an `IORING_OP_URING_CMD`
//! SQE128 `FUSE_IO_URING_CMD_REGISTER` that hands the kernel two buffers: a 288-byte header
//! (`struct fuse_uring_req_header`: the in/out header, the op-specific header, the entry's
//! `fuse_uring_ent_in_out`) and a payload buffer. A request arrives as the completion of
//! that entry's command; its reply is written back into the same buffers and returned with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which is also the entry's wait for its next request.
//! The kernel still sends FORGET and INTERRUPT over /dev/fuse (and everything until every
//! queue has an entry), so the /dev/fuse threads keep running beside the rings.
//!
//! Requests are reassembled into the contiguous /dev/fuse layout and go through fuser's own
//! decoder and `dispatch`, so a `Filesystem` sees no difference; the reply path differs only
//! in `ReplySender::Ring`.
//!
//! Each queue has a primary serving thread and `threads - 1` standby threads (same ring,
//! same CPU). The primary takes one completion at a time and waits in `io_uring_enter`; a
//! standby serves the queue only while the primary has been inside one request for a
//! whole tick (a slow one: hashing a large file at close, an fsync), so that request holds
//! up the next ones from its CPU for a tick or two, not its whole duration. Why not simply
//! have every thread wait on the ring? A completion wakes every waiter
//! (`__io_cqring_wake`: `__wake_up(.., 0, ..)`, no exclusive wake), so each request would
//! wake the idle threads for nothing (it doubled `tar x`'s time). Why not one io_uring per
//! thread, each registering its share of the entries on the same queue (the kernel allows
//! it: an entry is tied only to the command that last fetched with it)? Because the kernel
//! hands a request to the queue's most recently freed entry, whichever io_uring that is
//! (`fuse_uring_ent_avail` puts it at the head of `ent_avail_queue`,
//! `fuse_uring_queue_fuse_req` takes the first), and its completion is posted on that
//! io_uring (`io_uring_cmd_done`): very often the one whose thread has just started the
//! slow request, and nobody else reads it.
//!
//! References: the kernel's `fs/fuse/dev_uring.c` and
//! `include/uapi/linux/fuse.h`, libfuse 3.18 `lib/fuse_uring.c`.

use std::cell::Cell;
use std::cell::UnsafeCell;
use std::fmt;
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::ll::Operation;
use crate::ll::fuse_abi as abi;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `enum fuse_uring_cmd` (include/uapi/linux/fuse.h).
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_URING_IOV_SEGS`: the header and the payload buffer.
const IOV_SEGS: u32 = 2;
const IN_HEADER: usize = size_of::<abi::fuse_in_header>();
/// `user_data` of the NOPs that wake a queue's threads when it closes (entries use indices).
const WAKE: u64 = u64::MAX;
/// How often a standby thread looks at its queue's primary while requests flow: a request
/// waits at most about two of these behind a slow one. 3 ms: at 1 ms the standby's
/// wake-ups cost 5-8% of `tar x` and the edit loop (the thread shares the CPU it watches).
const TICK: Duration = Duration::from_millis(3);
/// Quiet ticks after which a standby thread parks until the next request (no wake-ups on
/// an idle mount).
const QUIET_TICKS: u32 = 50;
const OUT_HEADER: usize = size_of::<abi::fuse_out_header>();

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct EntInOut {
    flags: u64,
    /// The request's `unique`, to be given back with the commit.
    commit_id: u64,
    /// Bytes of the payload buffer used (request: after the op header; reply: the body).
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`.
#[repr(C, align(64))]
struct Header {
    /// `fuse_in_header` of a request, `fuse_out_header` of its reply.
    in_out: [u8; 128],
    /// The op-specific header of a request (`fuse_read_in`, ...); empty for name-only ops.
    op_in: [u8; 128],
    ent_in_out: EntInOut,
}

/// `struct fuse_uring_cmd_req`, the 80-byte command area of the SQE128.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    // flags (u64) stays 0.
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

/// One ring entry's buffers. The kernel writes them while the entry waits for a request;
/// after its completion only the dispatching thread and then the reply (one at a time)
/// touch them until the commit is pushed.
struct Entry {
    header: Box<UnsafeCell<Header>>,
    payload: Box<[UnsafeCell<u8>]>,
    iov: Box<[libc::iovec; 2]>,
}

/// One kernel queue: its own io_uring, its entries, `threads` serving threads.
pub(crate) struct RingQueue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Pushes to the submission queue come from the serving threads and from replies sent
    /// later by other threads (a parked approval): one at a time.
    sq_lock: Mutex<()>,
    /// The serving threads take completions one at a time, under this lock.
    cq_lock: Mutex<()>,
    entries: Vec<Entry>,
    /// How many threads serve this queue (`run` starts them).
    pub(crate) threads: usize,
    dev: Channel,
    /// Completions seen while checking the registrations: served first.
    early: Mutex<Vec<(u64, i32)>>,
    /// Set by the first serving thread to stop (unmount, DESTROY, an error); the others
    /// stop at their next completion (the one that sets it posts one for each) or wake.
    closed: AtomicBool,
    /// Requests the primary thread has started, and whether it is running one now: what
    /// the standby threads watch.
    started: AtomicU64,
    busy: AtomicBool,
    /// Standby threads parked after a quiet spell, unparked by the next request.
    standby: Mutex<Vec<std::thread::Thread>>,
    standby_parked: AtomicBool,
}

// SAFETY: the entries' buffers are shared with the kernel and handed from the serving thread
// that took the entry's completion to the reply by the protocol above (never two writers at
// once); the submission queue is behind `sq_lock`, the completion queue behind `cq_lock`.
unsafe impl Sync for RingQueue {}
// SAFETY: as above; nothing is tied to the creating thread.
unsafe impl Send for RingQueue {}

impl fmt::Debug for RingQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RingQueue({}, {} entries)", self.qid, self.entries.len())
    }
}

thread_local! {
    /// The queue whose serving thread this is: its replies need no `io_uring_enter` of
    /// their own, the thread's next wait submits them.
    static SERVING: Cell<*const RingQueue> = const { Cell::new(std::ptr::null()) };
}

/// The number of kernel queues: one per possible CPU (`nr_cpu_ids`), all of which must have
/// an entry before the kernel uses the ring.
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let last = s
        .trim()
        .split(',')
        .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
        .max()
        .ok_or_else(|| io::Error::other(format!("cannot parse cpu/possible: {s:?}")))?;
    Ok(last + 1)
}

/// Registers `entries` entries on every queue of the connection behind `dev`, each with a
/// payload buffer of `payload` bytes, to be served by `threads` threads per queue. An error
/// means the kernel refused (the caller keeps serving over /dev/fuse, which the kernel uses
/// until every queue has an entry).
pub(crate) fn register(
    dev: &Channel,
    entries: usize,
    threads: usize,
    payload: usize,
) -> io::Result<Vec<Arc<RingQueue>>> {
    let nq = possible_cpus()?;
    let mut queues = Vec::with_capacity(nq);
    for qid in 0..nq {
        // Room for every entry's command plus the closing NOPs, twice over.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(((entries + threads) as u32 * 2).next_power_of_two())?;
        let mut ents = Vec::with_capacity(entries);
        for _ in 0..entries {
            let header = Box::new(UnsafeCell::new(Header {
                in_out: [0; 128],
                op_in: [0; 128],
                ent_in_out: EntInOut::default(),
            }));
            // Zeroed by the allocator (fresh pages for a large buffer): resident only once
            // a request uses them.
            let raw =
                Box::into_raw(vec![0u8; payload].into_boxed_slice()) as *mut [UnsafeCell<u8>];
            // SAFETY: `UnsafeCell<u8>` is `repr(transparent)` over `u8`: same layout.
            let payload = unsafe { Box::from_raw(raw) };
            let iov = Box::new([
                libc::iovec {
                    iov_base: header.get().cast(),
                    iov_len: size_of::<Header>(),
                },
                libc::iovec {
                    iov_base: payload.as_ptr() as *mut libc::c_void,
                    iov_len: payload.len(),
                },
            ]);
            ents.push(Entry {
                header,
                payload,
                iov,
            });
        }
        let q = Arc::new(RingQueue {
            qid: qid as u16,
            ring,
            sq_lock: Mutex::new(()),
            cq_lock: Mutex::new(()),
            entries: ents,
            threads: threads.max(1),
            dev: dev.clone(),
            early: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            started: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            standby: Mutex::new(Vec::new()),
            standby_parked: AtomicBool::new(false),
        });
        for (i, e) in q.entries.iter().enumerate() {
            let sqe = opcode::UringCmd80::new(
                types::Fd(q.dev.as_fd().as_raw_fd()),
                FUSE_IO_URING_CMD_REGISTER,
            )
            .cmd(cmd_req(0, q.qid))
            .addr(Some(e.iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
            q.push(with_len(sqe, IOV_SEGS))?;
        }
        q.ring.submit()?;
        // A refused registration completes at once with its errno; an accepted one stays
        // pending until a request arrives (which may already have happened).
        // SAFETY: no serving thread exists yet: this is the only reader of the queue.
        let mut cq = unsafe { q.ring.completion_shared() };
        for c in &mut cq {
            if c.result() < 0 {
                return Err(io::Error::from_raw_os_error(-c.result()));
            }
            q.early.lock().push((c.user_data(), c.result()));
        }
        drop(cq);
        queues.push(q);
    }
    Ok(queues)
}

/// `UringCmd80` sets no `len`; REGISTER wants the iovec count there (`sqe->len`, bytes
/// 24..28 of the SQE).
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `repr(C)`: the 64-byte `io_uring_sqe` then its 64-byte tail;
    // any byte pattern is a valid one.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute(raw) }
}

impl RingQueue {
    fn push(&self, sqe: squeue::Entry128) -> io::Result<()> {
        let _g = self.sq_lock.lock();
        // SAFETY: pushes are serialized by `sq_lock`; the buffers the SQE points at live as
        // long as the queue.
        let mut sq = unsafe { self.ring.submission_shared() };
        // SAFETY: as above.
        unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("io_uring submission queue full"))?;
        sq.sync();
        Ok(())
    }

    /// Serving thread `t` of the queue: the primary (`t == 0`) serves requests with `se`
    /// until the connection ends or the queue stops; the others stand by (see
    /// [`RingQueue::stand_by`]). On its way out each wakes the others so they stop too.
    pub(crate) fn serve<FS: Filesystem>(
        self: &Arc<Self>,
        t: usize,
        se: &SessionEventLoop<FS>,
    ) -> io::Result<()> {
        SERVING.with(|s| s.set(Arc::as_ptr(self)));
        self.pin();
        let mut buf: Vec<u64> = Vec::new();
        let r = if t == 0 {
            self.serve_loop(&mut buf, se, None).map(|_| ())
        } else {
            self.standby.lock().push(std::thread::current());
            self.stand_by(&mut buf, se)
        };
        self.close();
        r
    }

    /// Takes and serves completions; waits on the ring when there are none. The primary
    /// (`stuck` is `None`) returns only when the queue closes (`Ok(false)`); a standby
    /// thread, standing in while the primary is inside its request number `stuck`, returns
    /// `Ok(true)` once nothing waits and the primary has left that request.
    fn serve_loop<FS: Filesystem>(
        self: &Arc<Self>,
        buf: &mut Vec<u64>,
        se: &SessionEventLoop<FS>,
        stuck: Option<u64>,
    ) -> io::Result<bool> {
        let primary = stuck.is_none();
        loop {
            if self.closed.load(Ordering::Acquire) {
                return Ok(false);
            }
            // One completion at a time: a thread that took two and started a slow request
            // with the first would hold up the second.
            let Some((idx, res)) = self.take() else {
                if stuck.is_some_and(|n| !self.primary_inside(n)) {
                    // Back to watching; what this thread's replies pushed goes now.
                    self.submit_pending()?;
                    return Ok(true);
                }
                // Nothing to serve: submit what this thread's replies pushed and wait.
                match self.ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                    Err(e) => return Err(e),
                }
                continue;
            };
            if idx == WAKE {
                continue;
            }
            // The previous request's reply (pushed, not yet submitted when another
            // completion was waiting) goes to the kernel before this request runs, which
            // may take long.
            self.submit_pending()?;
            if res < 0 {
                // ENOTCONN: the connection was aborted (unmount); ECANCELED: the ring was
                // torn down.
                if res == -libc::ENOTCONN || res == -libc::ECANCELED || res == -libc::ENODEV {
                    debug!("ring queue {}: closed ({res})", self.qid);
                    return Ok(false);
                }
                error!("ring queue {}: entry {idx} failed: {res}", self.qid);
                return Err(io::Error::from_raw_os_error(-res));
            }
            if primary {
                self.started.fetch_add(1, Ordering::SeqCst);
                self.busy.store(true, Ordering::SeqCst);
                if self.standby_parked.swap(false, Ordering::SeqCst) {
                    for t in self.standby.lock().iter() {
                        t.unpark();
                    }
                }
            }
            let more = self.handle(idx as usize, buf, se);
            if primary {
                self.busy.store(false, Ordering::SeqCst);
            }
            if !more {
                return Ok(false);
            }
        }
    }

    /// A standby thread: while requests flow, it looks at the primary every [`TICK`]; when
    /// the primary has been inside one request for a whole tick (a slow one: hashing a
    /// large file, an fsync), it serves the queue's completions itself until the primary
    /// is free again. So a slow request holds up the next ones from its CPU by at most
    /// about two ticks, and the fast path costs nothing: completions wake every thread
    /// waiting on the ring (`__io_cqring_wake` wakes all waiters whose wait is satisfied),
    /// so a second thread always waiting there would add a wake-up to every request (it
    /// doubled `tar x`'s time). After [`QUIET_TICKS`] quiet ticks it parks until the
    /// primary's next request.
    fn stand_by<FS: Filesystem>(
        self: &Arc<Self>,
        buf: &mut Vec<u64>,
        se: &SessionEventLoop<FS>,
    ) -> io::Result<()> {
        let mut quiet = 0u32;
        loop {
            if self.closed.load(Ordering::Acquire) {
                return Ok(());
            }
            let seen = self.started.load(Ordering::SeqCst);
            if quiet >= QUIET_TICKS {
                // SeqCst with the primary's increment then swap: either it sees the flag
                // and unparks (a token `park` consumes), or this sees its increment.
                self.standby_parked.store(true, Ordering::SeqCst);
                if self.started.load(Ordering::SeqCst) == seen
                    && !self.closed.load(Ordering::Acquire)
                {
                    std::thread::park();
                }
                self.standby_parked.store(false, Ordering::SeqCst);
                quiet = 0;
                continue;
            }
            std::thread::sleep(TICK);
            let now = self.started.load(Ordering::SeqCst);
            if now == seen && self.primary_inside(now) {
                quiet = 0;
                if !self.serve_loop(buf, se, Some(now))? {
                    return Ok(());
                }
            } else if now == seen {
                quiet += 1;
            } else {
                quiet = 0;
            }
        }
    }

    /// Whether the primary is still inside its request number `n`.
    fn primary_inside(&self, n: u64) -> bool {
        self.busy.load(Ordering::SeqCst) && self.started.load(Ordering::SeqCst) == n
    }

    /// The next completion (`user_data`, result), if one is ready.
    fn take(&self) -> Option<(u64, i32)> {
        if let Some(c) = self.early.lock().pop() {
            return Some(c);
        }
        let _g = self.cq_lock.lock();
        // SAFETY: completions are taken under `cq_lock`, one reader at a time.
        let mut cq = unsafe { self.ring.completion_shared() };
        cq.next().map(|c| (c.user_data(), c.result()))
    }

    /// Submits what is in the submission queue, if anything.
    fn submit_pending(&self) -> io::Result<()> {
        let pending = {
            let _g = self.sq_lock.lock();
            // SAFETY: under `sq_lock`, as every push.
            !unsafe { self.ring.submission_shared() }.is_empty()
        };
        if pending {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Stops the queue: the first caller posts one NOP per serving thread, so that each
    /// thread waiting for a completion wakes, sees `closed` and returns.
    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        for _ in 0..self.threads {
            let nop = squeue::Entry128::from(opcode::Nop::new().build().user_data(WAKE));
            if self.push(nop).is_err() {
                break;
            }
        }
        let _ = self.ring.submit();
        for t in self.standby.lock().iter() {
            t.unpark();
        }
    }

    /// Runs the thread on its queue's CPU, as libfuse does: the kernel queues a request on
    /// the submitting CPU's queue and completes it there, so the caller, the kernel and
    /// the server stay on one CPU's caches instead of bouncing a wake-up across CPUs.
    /// Best effort (a cpuset may forbid it).
    fn pin(&self) {
        // SAFETY: `cpu_set_t` is plain data; CPU_SET writes inside it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(self.qid as usize, &mut set);
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                debug!(
                    "ring queue {}: cannot pin to its CPU: {}",
                    self.qid,
                    io::Error::last_os_error()
                );
            }
        }
    }

    /// Decodes the request in entry `idx` and dispatches it; false after DESTROY.
    fn handle<FS: Filesystem>(
        self: &Arc<Self>,
        idx: usize,
        buf: &mut Vec<u64>,
        se: &SessionEventLoop<FS>,
    ) -> bool {
        let e = &self.entries[idx];
        // SAFETY: the kernel finished writing this entry (its completion arrived) and
        // nothing else touches it until the commit is pushed.
        let h = unsafe { &*e.header.get() };
        let ent = h.ent_in_out;
        let len = u32::from_ne_bytes([h.in_out[0], h.in_out[1], h.in_out[2], h.in_out[3]]) as usize;
        let payload = ent.payload_sz as usize;
        // The kernel sets `len` to the header plus every argument (`fuse_send_one`): what is
        // not payload is the op header, in `op_in`.
        let op = len.checked_sub(IN_HEADER + payload);
        let Some(op) = op.filter(|&op| op <= h.op_in.len() && payload <= e.payload.len()) else {
            error!(
                "ring queue {}: malformed entry {idx}: len {len}, payload {payload}",
                self.qid
            );
            return self.fail(idx, ent.commit_id, libc::EIO);
        };
        buf.clear();
        buf.resize(len.div_ceil(8), 0);
        // SAFETY: `buf` holds at least `len` bytes; u64s viewed as bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), len) };
        bytes[..IN_HEADER].copy_from_slice(&h.in_out[..IN_HEADER]);
        bytes[IN_HEADER..IN_HEADER + op].copy_from_slice(&h.op_in[..op]);
        // SAFETY: as above for the payload buffer; `payload` is within it.
        let src = unsafe { std::slice::from_raw_parts(e.payload.as_ptr().cast::<u8>(), payload) };
        bytes[IN_HEADER + op..].copy_from_slice(src);
        let reply = RingReply {
            queue: self.clone(),
            idx,
            commit_id: ent.commit_id,
        };
        match RequestWithSender::with_ring(self.dev.sender(), reply, bytes) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                    return false;
                }
                req.dispatch(se);
            }
            None => return self.fail(idx, ent.commit_id, libc::EIO),
        }
        true
    }

    /// Answers entry `idx` with an errno (a request fuser could not decode).
    fn fail(self: &Arc<Self>, idx: usize, commit_id: u64, errno: i32) -> bool {
        let out = abi::fuse_out_header {
            len: OUT_HEADER as u32,
            error: -errno,
            unique: commit_id,
        };
        let r = RingReply {
            queue: self.clone(),
            idx,
            commit_id,
        };
        // SAFETY: `fuse_out_header` is plain data.
        let b = unsafe { std::slice::from_raw_parts((&raw const out).cast::<u8>(), OUT_HEADER) };
        r.send(&[IoSlice::new(b)]).is_ok()
    }
}

/// Where a ring request's reply goes: its entry, committed with its `unique`.
#[derive(Clone)]
pub(crate) struct RingReply {
    queue: Arc<RingQueue>,
    idx: usize,
    commit_id: u64,
}

impl fmt::Debug for RingReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RingReply(q{}, e{}, {})",
            self.queue.qid, self.idx, self.commit_id
        )
    }
}

impl RingReply {
    /// Writes the reply (`fuse_out_header` then the body, as fuser lays it out for writev)
    /// into the entry: the header into `in_out`, the body into the payload buffer; then
    /// commits it and fetches the entry's next request.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let q = &self.queue;
        let e = &q.entries[self.idx];
        // SAFETY: the entry belongs to this request until the commit below is pushed.
        let h = unsafe { &mut *e.header.get() };
        // SAFETY: as above.
        let payload = unsafe {
            std::slice::from_raw_parts_mut(e.payload.as_ptr() as *mut u8, e.payload.len())
        };
        let total: usize = data.iter().map(|d| d.len()).sum();
        let mut at = 0usize;
        if total - OUT_HEADER.min(total) > payload.len() {
            warn!("ring reply of {total} bytes does not fit the entry: EIO");
            let out = abi::fuse_out_header {
                len: OUT_HEADER as u32,
                error: -libc::EIO,
                unique: self.commit_id,
            };
            // SAFETY: plain data.
            let b =
                unsafe { std::slice::from_raw_parts((&raw const out).cast::<u8>(), OUT_HEADER) };
            h.in_out[..OUT_HEADER].copy_from_slice(b);
            at = total;
        } else {
            for d in data {
                let mut s: &[u8] = d;
                if at < OUT_HEADER {
                    let n = (OUT_HEADER - at).min(s.len());
                    h.in_out[at..at + n].copy_from_slice(&s[..n]);
                    at += n;
                    s = &s[n..];
                }
                let off = at - OUT_HEADER.min(at);
                payload[off..off + s.len()].copy_from_slice(s);
                at += s.len();
            }
        }
        h.ent_in_out.payload_sz = (at.saturating_sub(OUT_HEADER)) as u32;
        let sqe = opcode::UringCmd80::new(
            types::Fd(q.dev.as_fd().as_raw_fd()),
            FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
        )
        .cmd(cmd_req(self.commit_id, q.qid))
        .build()
        .user_data(self.idx as u64);
        q.push(sqe)?;
        if SERVING.with(|s| s.get()) != Arc::as_ptr(q) {
            q.ring.submit()?;
        }
        Ok(())
    }
}
