//! `--record async`: what a close left is recorded after the close is answered, by a
//! thread of its own, so `close(2)` does not wait for the hash, the kept version and the
//! `WRITE` entry (and a release's work does not hold a serving thread). A change of mode,
//! owner or extended attributes is recorded the same way (`Fs::record_change`).
//!
//! Order is kept by two rules:
//! - jobs run one at a time, in the order they were queued;
//! - a file with an entry owed ([`super::inode::InodeTable::owe`], marked before the
//!   close is answered) is not changed again by any stale-checked operation (rename,
//!   unlink, write open, truncate, a write), nor have its mode, owner, times, links or
//!   extended attributes changed, until that entry is on record. So whatever the agent does
//!   next to the file is judged against, and comes after, the entry of its close.
//!
//! One exception to the second rule, the edit by rename (an editor's save, `os.replace`,
//! `sed -i`): a regular file whose entries owed all record the renaming identity's own
//! changes, and that is exactly as its own last write left it (so those entries change
//! nothing its stale check finds), may be renamed before they are on record. Its `RENAME`
//! entry is then queued behind them ([`Recorder::queue_held`], under the names' stale locks)
//! and owed by the file and both names, and an entry written before its reply that names
//! either path waits for it (`Fs::record`; a request making a name waits for it earlier,
//! `Fs::wait_deferred`). Waiting cost the edit loop the whole of the recorder's job for the
//! temporary (its hash, kept version and entry): about 90 µs a save. Another identity's
//! change, one the stale check must judge, or a release whose entry would name the file
//! where it is when it runs ([`super::inode::InodeTable::owe_now`]'s `named`) waits as
//! before.
//!
//! The entries queued are bounded in bytes too ([`Recorder::take`]), by what the ledger's
//! reserve has room for ([`crate::ledger::Ledger::deferrable_bytes`]): a change whose entry
//! would not fit is recorded before its reply, as with `--record sync`. So when the
//! ledger's disk fills behind its back while entries are queued, every one of them still
//! fits in the space kept for it (see `RESERVE` in the ledger's writer), and the changes
//! answered are all on record.
//!
//! What `--record sync` (the default) guarantees and this mode does not: a returned
//! `close()` is on record. Here a daemon killed with jobs queued (at most [`QUEUE`]) loses
//! their entries; the files' changes are on disk, and `intentfs ledger verify` reports
//! them as drift (changes the ledger does not explain).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// Jobs queued at most: a close that finds the queue full waits (the agent cannot run
/// ahead of the ledger by more than this many closes). A job queued by a caller that holds
/// what the recorder may need ([`Recorder::queue_held`]) never waits: at most one such a
/// request, each after an entry owed by its file.
pub const QUEUE: usize = 256;

/// How long the recorder stays up after its last job for the next one before it sleeps
/// until woken. A job queued meanwhile is not woken for: it runs when the time is up. An
/// agent's closes come in bursts (a save is two), and waking a sleeping thread on another
/// CPU took the serving thread 5–10 µs a close (a futex wake and an inter-processor
/// interrupt, a fifth of a `FLUSH`); the recorder's own timer costs the serving thread
/// nothing. Whoever waits for a job wakes it at once ([`Waker`]).
pub const LINGER: Duration = Duration::from_millis(1);

/// Jobs queued while the recorder lingers before one wakes it all the same.
const BATCH: usize = 32;

/// When a close's entry is written (`intentfs mount --record`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RecordMode {
    /// Before the close is answered: a returned `close()` is on record.
    #[default]
    Sync,
    /// Right after the close is answered, in order, by a thread of its own.
    Async,
}

impl RecordMode {
    pub fn name(self) -> &'static str {
        match self {
            RecordMode::Sync => "sync",
            RecordMode::Async => "async",
        }
    }
}

thread_local! {
    static RECORDER: Cell<bool> = const { Cell::new(false) };
}

/// This thread is the recorder: the entries owed are its own jobs, so it never waits for
/// them.
pub fn is_recorder() -> bool {
    RECORDER.with(Cell::get)
}

pub type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
pub struct Stats {
    /// Jobs queued and not finished.
    pub queued: AtomicU64,
    /// Jobs whose entry could not be written (logged).
    pub failures: AtomicU64,
    /// Jobs done since the mount.
    pub done: AtomicU64,
    /// What the entries of the jobs queued will take at most, in bytes (their estimates).
    pub bytes: AtomicU64,
    /// Changes recorded before their reply because their entry did not fit in what the
    /// queue may take ([`Recorder::take`]).
    pub not_deferred: AtomicU64,
    /// The recorder's thread is gone (a job panicked): nothing waits for room any more,
    /// jobs run where they are queued.
    pub gone: std::sync::atomic::AtomicBool,
}

pub struct Recorder {
    /// Its queue (shared with the thread, and with whoever waits for its jobs).
    waker: Waker,
    pub stats: Arc<Stats>,
    /// Signalled after each job: room in the queue.
    room: Arc<(parking_lot::Mutex<()>, parking_lot::Condvar)>,
}

/// The jobs queued, shared by the threads that queue them and the recorder's.
struct Queue {
    inner: parking_lot::Mutex<Queued>,
    bell: parking_lot::Condvar,
    /// Threads waiting for a job ([`Waker::waiting`]): while there are any, a job queued
    /// wakes the recorder even when it lingers (the job waited for may be queued after
    /// the thread began to wait: a release's, marked owed before it is queued).
    waiting: std::sync::atomic::AtomicUsize,
    /// [`LINGER`] (longer in tests).
    linger: Duration,
}

struct Queued {
    msgs: VecDeque<Msg>,
    state: State,
    /// No more jobs are taken: the recorder's thread is gone, or the recorder dropped.
    closed: bool,
}

/// What the recorder's thread is doing, as the threads that queue see it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Running jobs: it looks at the queue again before it sleeps.
    Running,
    /// Waiting [`LINGER`] for the next job: one queued is run when the time is up.
    Lingering,
    /// Sleeping until woken: a job queued wakes it.
    Asleep,
}

impl Queue {
    /// Queue `msg`, waking the recorder if it sleeps (or lingers with a batch queued, or
    /// `now`); `Err(msg)` when it takes no more.
    fn push(&self, msg: Msg, now: bool) -> Result<(), Msg> {
        let mut q = self.inner.lock();
        if q.closed {
            return Err(msg);
        }
        q.msgs.push_back(msg);
        let wake = match q.state {
            State::Running => false,
            State::Lingering => {
                now || q.msgs.len() >= BATCH || self.waiting.load(Ordering::SeqCst) > 0
            }
            State::Asleep => true,
        };
        drop(q);
        if wake {
            self.bell.notify_one();
        }
        Ok(())
    }
}

/// Wakes the recorder at once, for a thread about to wait for a job queued (the inode
/// table's waiters, a request waiting for a rename's entry).
#[derive(Clone)]
pub struct Waker(Arc<Queue>);

impl Waker {
    /// The recorder woken now, and by every job queued until the guard is dropped: for a
    /// thread about to wait for a job queued or about to be.
    pub fn waiting(&self) -> Waiting<'_> {
        let q = &*self.0;
        q.waiting.fetch_add(1, Ordering::SeqCst);
        if q.inner.lock().state != State::Running {
            q.bell.notify_one();
        }
        Waiting(q)
    }
}

/// Wait on `cv` (`g`: its mutex, held) while `cond` holds, until `until` when given, with
/// the recorder woken for it ([`Waker::waiting`]) when it is waited for at all: for a
/// thread waiting for the recorder's jobs. Whether the time ran out.
pub fn wait_while<T>(
    waker: Option<&Waker>,
    cv: &parking_lot::Condvar,
    g: &mut parking_lot::MutexGuard<'_, T>,
    mut cond: impl FnMut(&T) -> bool,
    until: Option<std::time::Instant>,
) -> bool {
    if !cond(g) {
        return false;
    }
    let _w = waker.map(Waker::waiting);
    while cond(g) {
        match until {
            Some(t) => {
                if cv.wait_until(g, t).timed_out() {
                    return true;
                }
            }
            None => cv.wait(g),
        }
    }
    false
}

/// See [`Waker::waiting`].
pub struct Waiting<'a>(&'a Queue);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Msg {
    /// A job and the bytes its entries take at most.
    Job(Job, u64),
    /// [`Recorder::drain`]: answered once every job before it is done.
    Mark(SyncSender<()>),
}

impl Recorder {
    pub fn start() -> std::io::Result<Recorder> {
        Recorder::start_lingering(LINGER)
    }

    /// [`Recorder::start`], staying up `linger` after its last job.
    fn start_lingering(linger: Duration) -> std::io::Result<Recorder> {
        let queue = Arc::new(Queue {
            inner: parking_lot::Mutex::new(Queued {
                msgs: VecDeque::new(),
                state: State::Running,
                closed: false,
            }),
            bell: parking_lot::Condvar::new(),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            linger,
        });
        let stats = Arc::new(Stats::default());
        let room = Arc::new((parking_lot::Mutex::new(()), parking_lot::Condvar::new()));
        let (theirs, their_room, their_queue) = (stats.clone(), room.clone(), queue.clone());
        std::thread::Builder::new()
            .name("intentfs-record".into())
            .spawn(move || {
                // (Marked gone however the thread ends, a panic's unwinding included, and
                // its queue closed: a job queued from then on runs where it is queued.)
                let _gone = Gone(&theirs, &their_room, &their_queue);
                run(&their_queue, &theirs, &their_room);
            })?;
        Ok(Recorder {
            waker: Waker(queue),
            stats,
            room,
        })
    }

    /// What wakes the recorder for a thread about to wait for its jobs.
    pub fn waker(&self) -> &Waker {
        &self.waker
    }

    /// Count `bytes` more for a job about to be queued, when the jobs queued would then
    /// take at most `limit` bytes together; false (counted in
    /// [`Stats::not_deferred`]) when not: the caller records before its reply instead.
    pub fn take(&self, bytes: u64, limit: u64) -> bool {
        let st = &self.stats;
        let taken = st
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                (owed.saturating_add(bytes) <= limit).then(|| owed + bytes)
            })
            .is_ok();
        if !taken {
            st.not_deferred.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Count `bytes` more for a job about to be queued, whatever the limit (a release,
    /// which seldom writes an entry and has no reply to record before).
    pub fn add(&self, bytes: u64) {
        self.stats.bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Give back `bytes` taken for a job that is not queued after all.
    pub fn give_back(&self, bytes: u64) {
        self.stats.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Queue `job`, whose entries take at most `bytes` (counted by [`Recorder::take`] or
    /// [`Recorder::add`], given back once it has run), or run it here when the thread is
    /// gone (as the recorder would: its own entry owed is not waited for). Waits while
    /// [`QUEUE`] jobs are queued.
    pub fn queue(&self, job: Job, bytes: u64) {
        let st = &self.stats;
        while st
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < QUEUE as u64 || is_recorder() || st.gone.load(Ordering::Acquire))
                    .then_some(q + 1)
            })
            .is_err()
        {
            let mut g = self.room.0.lock();
            if st.queued.load(Ordering::Acquire) >= QUEUE as u64 {
                self.room
                    .1
                    .wait_for(&mut g, std::time::Duration::from_millis(20));
            }
        }
        self.send(job, bytes);
    }

    /// [`Recorder::queue`] without waiting for room: for a caller holding stale locks the
    /// jobs queued before may need.
    pub fn queue_held(&self, job: Job, bytes: u64) {
        self.stats.queued.fetch_add(1, Ordering::AcqRel);
        self.send(job, bytes);
    }

    fn send(&self, job: Job, bytes: u64) {
        if let Err(e) = self.waker.0.push(Msg::Job(job, bytes), false) {
            if let Msg::Job(job, _) = e {
                let was = RECORDER.with(|r| r.replace(true));
                job();
                RECORDER.with(|r| r.set(was));
            }
            self.give_back(bytes);
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Return once every job queued before this call is done.
    pub fn drain(&self) {
        if is_recorder() || self.stats.queued.load(Ordering::Acquire) == 0 {
            return;
        }
        let (tx, rx) = sync_channel::<()>(1);
        if self.waker.0.push(Msg::Mark(tx), true).is_ok() {
            let _ = rx.recv();
        }
    }
}

impl Drop for Recorder {
    /// The thread runs what is queued, then ends.
    fn drop(&mut self) {
        self.waker.0.inner.lock().closed = true;
        self.waker.0.bell.notify_one();
    }
}

/// Sets [`Stats::gone`] when dropped, closes the queue (what is left in it is dropped: a
/// drain waiting for it returns), and wakes whoever waits for room.
struct Gone<'a>(
    &'a Stats,
    &'a (parking_lot::Mutex<()>, parking_lot::Condvar),
    &'a Queue,
);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        self.0.gone.store(true, Ordering::Release);
        let left = {
            let mut q = self.2.inner.lock();
            q.closed = true;
            std::mem::take(&mut q.msgs)
        };
        drop(left);
        let _g = self.1 .0.lock();
        self.1 .1.notify_all();
    }
}

fn run(queue: &Queue, stats: &Stats, room: &(parking_lot::Mutex<()>, parking_lot::Condvar)) {
    RECORDER.with(|r| r.set(true));
    let mut q = queue.inner.lock();
    loop {
        if let Some(msg) = q.msgs.pop_front() {
            q.state = State::Running;
            drop(q);
            match msg {
                Msg::Job(job, bytes) => {
                    job();
                    stats.done.fetch_add(1, Ordering::Relaxed);
                    stats.bytes.fetch_sub(bytes, Ordering::AcqRel);
                    stats.queued.fetch_sub(1, Ordering::Release);
                    let _g = room.0.lock();
                    room.1.notify_all();
                }
                Msg::Mark(tx) => {
                    let _ = tx.send(());
                }
            }
            q = queue.inner.lock();
            continue;
        }
        if q.closed {
            return;
        }
        if q.state == State::Running {
            q.state = State::Lingering;
            queue.bell.wait_for(&mut q, queue.linger);
        } else {
            q.state = State::Asleep;
            queue.bell.wait(&mut q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn jobs_run_in_order_and_drain_waits_for_them() {
        let r = Recorder::start().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..1000 {
            let s = seen.clone();
            r.queue(Box::new(move || s.lock().unwrap().push(i)), 0);
        }
        r.drain();
        assert_eq!(*seen.lock().unwrap(), (0..1000).collect::<Vec<_>>());
        assert_eq!(r.stats.queued.load(Ordering::Relaxed), 0);
        assert!(r.stats.done.load(Ordering::Relaxed) >= 1000);
        // The recorder's own drain (a job that drains) does not wait for itself.
        let (tx, rx) = sync_channel(1);
        let r = Arc::new(r);
        let r2 = r.clone();
        r.queue(
            Box::new(move || {
                assert!(is_recorder());
                r2.drain();
                tx.send(()).unwrap();
            }),
            0,
        );
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("a drain from the recorder itself deadlocked");
        assert!(!is_recorder());
    }

    /// A full queue holds up `queue` until a job is done, never `queue_held` (whose caller
    /// may hold what the jobs before need).
    #[test]
    fn a_full_queue_waits_for_room_except_for_a_held_job() {
        let r = Arc::new(Recorder::start().unwrap());
        let (go_tx, go_rx) = sync_channel::<()>(0);
        r.queue(Box::new(move || go_rx.recv().unwrap()), 0);
        for _ in 1..QUEUE {
            r.queue(Box::new(|| {}), 0);
        }
        assert_eq!(r.stats.queued.load(Ordering::Acquire), QUEUE as u64);
        // Beyond the bound: a held job goes in at once.
        let ran = Arc::new(Mutex::new(false));
        let mark = ran.clone();
        r.queue_held(Box::new(move || *mark.lock().unwrap() = true), 0);
        assert_eq!(r.stats.queued.load(Ordering::Acquire), QUEUE as u64 + 1);
        // A plain one waits until the recorder has made room.
        let (done_tx, done_rx) = sync_channel::<()>(1);
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            r2.queue(Box::new(|| {}), 0);
            done_tx.send(()).unwrap();
        });
        assert!(
            done_rx
                .recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "a job was queued past the bound"
        );
        go_tx.send(()).unwrap();
        done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a job waited for room that was made");
        t.join().unwrap();
        r.drain();
        assert!(*ran.lock().unwrap());
        assert_eq!(r.stats.queued.load(Ordering::Acquire), 0);
    }

    /// A job that panics takes the recorder's thread with it: nothing queued after waits
    /// for room that will never come; the jobs run where they are queued.
    #[test]
    fn a_recorder_gone_holds_up_nothing() {
        let r = Recorder::start().unwrap();
        r.queue(
            Box::new(|| panic!("a job that fails (expected by this test)")),
            0,
        );
        let t0 = std::time::Instant::now();
        while !r.stats.gone.load(Ordering::Acquire) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let ran = Arc::new(Mutex::new(0));
        for _ in 0..QUEUE * 2 {
            let ran = ran.clone();
            r.queue(Box::new(move || *ran.lock().unwrap() += 1), 0);
        }
        r.drain();
        assert_eq!(*ran.lock().unwrap(), QUEUE * 2);
    }

    /// A job queued while the recorder lingers runs when whoever waits for it says so
    /// ([`Waker::waiting`]), and so does every job queued while they wait; a job queued
    /// while it sleeps wakes it; jobs queued from many threads at any moment all run,
    /// nobody draining.
    #[test]
    fn a_lingering_recorder_runs_what_a_waiter_waits_for() {
        let r = Recorder::start_lingering(Duration::from_secs(3600)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let job = |i: u32| -> Job {
            let tx = tx.clone();
            Box::new(move || tx.send(i).unwrap())
        };
        let lingering = |r: &Recorder| {
            let t0 = std::time::Instant::now();
            while r.waker.0.inner.lock().state != State::Lingering {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "the recorder never lingered"
                );
                std::thread::yield_now();
            }
        };
        let ten = Duration::from_secs(10);
        r.queue(job(1), 0);
        assert_eq!(rx.recv_timeout(ten), Ok(1));
        lingering(&r);
        // Queued while it lingers (for an hour): not run yet.
        r.queue(job(2), 0);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        {
            let w = r.waker();
            let _waiting = w.waiting();
            assert_eq!(rx.recv_timeout(ten), Ok(2));
            lingering(&r);
            r.queue(job(3), 0);
            assert_eq!(rx.recv_timeout(ten), Ok(3), "a job queued while one waits");
        }
        // Nobody waits: lingering again, a job waits for the drain that asks for it.
        lingering(&r);
        r.queue(job(4), 0);
        r.drain();
        assert_eq!(rx.try_recv(), Ok(4));
        drop(r);

        // The default linger: many threads, jobs at any moment, every one runs.
        let r = Arc::new(Recorder::start().unwrap());
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let (r, tx) = (r.clone(), tx.clone());
                std::thread::spawn(move || {
                    for i in 0..200u32 {
                        let tx = tx.clone();
                        r.queue(Box::new(move || tx.send(t * 1000 + i).unwrap()), 0);
                        if i % 7 == 0 {
                            std::thread::sleep(Duration::from_micros(u64::from(i % 5) * 700));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut got: Vec<u32> = (0..800).map(|_| rx.recv_timeout(ten).unwrap()).collect();
        got.sort_unstable();
        let want: Vec<u32> = (0..4)
            .flat_map(|t| (0..200).map(move |i| t * 1000 + i))
            .collect();
        assert_eq!(got, want);
    }

    /// What the jobs queued take is counted until they have run, and a job that would
    /// take it past the limit is not taken.
    #[test]
    fn the_bytes_queued_stay_within_the_limit() {
        let r = Recorder::start().unwrap();
        let (go_tx, go_rx) = sync_channel::<()>(0);
        // The recorder is held by its first job until the test lets it go.
        assert!(r.take(400, 1000));
        r.queue(Box::new(move || go_rx.recv().unwrap()), 400);
        assert!(r.take(400, 1000));
        r.queue(Box::new(|| {}), 400);
        assert!(!r.take(400, 1000), "1200 bytes taken with a limit of 1000");
        assert_eq!(r.stats.not_deferred.load(Ordering::Relaxed), 1);
        assert_eq!(r.stats.bytes.load(Ordering::Acquire), 800);
        // Taken, then given back: not queued after all.
        assert!(r.take(200, 1000));
        r.give_back(200);
        r.add(5000);
        r.queue(Box::new(|| {}), 5000);
        go_tx.send(()).unwrap();
        r.drain();
        assert_eq!(r.stats.bytes.load(Ordering::Acquire), 0);
        assert!(r.take(1000, 1000));
        r.give_back(1000);
    }
}
