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
//! What `--record sync` (the default) guarantees and this mode does not: a returned
//! `close()` is on record. Here a daemon killed with jobs queued (at most [`QUEUE`]) loses
//! their entries; the files' changes are on disk, and `intentfs ledger verify` reports
//! them as drift (changes the ledger does not explain).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

/// Jobs queued at most: a close that finds the queue full waits (the agent cannot run
/// ahead of the ledger by more than this many closes).
pub const QUEUE: usize = 256;

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
}

pub struct Recorder {
    tx: SyncSender<Msg>,
    pub stats: Arc<Stats>,
}

enum Msg {
    Job(Job),
    /// [`Recorder::drain`]: answered once every job before it is done.
    Mark(SyncSender<()>),
}

impl Recorder {
    pub fn start() -> std::io::Result<Recorder> {
        let (tx, rx) = sync_channel::<Msg>(QUEUE);
        let stats = Arc::new(Stats::default());
        let theirs = stats.clone();
        std::thread::Builder::new()
            .name("intentfs-record".into())
            .spawn(move || run(&rx, &theirs))?;
        Ok(Recorder { tx, stats })
    }

    /// Queue `job`, or run it here when the thread is gone (as the recorder would: its
    /// own entry owed is not waited for).
    pub fn queue(&self, job: Job) {
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.tx.send(Msg::Job(job)) {
            if let Msg::Job(job) = e.0 {
                let was = RECORDER.with(|r| r.replace(true));
                job();
                RECORDER.with(|r| r.set(was));
            }
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Return once every job queued before this call is done.
    pub fn drain(&self) {
        if is_recorder() || self.stats.queued.load(Ordering::Acquire) == 0 {
            return;
        }
        let (tx, rx) = sync_channel::<()>(1);
        if self.tx.send(Msg::Mark(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

fn run(rx: &Receiver<Msg>, stats: &Stats) {
    RECORDER.with(|r| r.set(true));
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Job(job) => {
                job();
                stats.done.fetch_add(1, Ordering::Relaxed);
                stats.queued.fetch_sub(1, Ordering::Release);
            }
            Msg::Mark(tx) => {
                let _ = tx.send(());
            }
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
            r.queue(Box::new(move || s.lock().unwrap().push(i)));
        }
        r.drain();
        assert_eq!(*seen.lock().unwrap(), (0..1000).collect::<Vec<_>>());
        assert_eq!(r.stats.queued.load(Ordering::Relaxed), 0);
        assert!(r.stats.done.load(Ordering::Relaxed) >= 1000);
        // The recorder's own drain (a job that drains) does not wait for itself.
        let (tx, rx) = sync_channel(1);
        let r = Arc::new(r);
        let r2 = r.clone();
        r.queue(Box::new(move || {
            assert!(is_recorder());
            r2.drain();
            tx.send(()).unwrap();
        }));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("a drain from the recorder itself deadlocked");
        assert!(!is_recorder());
    }
}
