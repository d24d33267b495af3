//! Backing handles of forgotten nodes, closed a moment later on a thread of their own.
//!
//! Closing the last handle of a deleted file frees its inode: ext4 truncates it and, on a
//! disk mounted with `discard`, discards its blocks (50-300 µs of waiting on the disk here).
//! Closed by the worker that got the kernel's FORGET, the freeing ran while `rm -rf` went on
//! with the next name, and the `rmdir` of the file's directory waited for it: the kernel's
//! walk of the directory's dentries before removing it spins while a child is being freed
//! (`shrink_dcache_parent`). RMDIR took 263 µs through intentfs against 84 µs for bindfs,
//! whose files are freed inside their UNLINK. A child whose handle is still held is not
//! waited for, so the handles are held [`DELAY`] and closed here, after the directory is
//! gone, by a thread that has nothing else to do meanwhile.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

/// How long a forgotten node's handle is held before it is closed.
pub const DELAY: Duration = Duration::from_millis(20);

enum Msg {
    Close(Instant, Arc<OwnedFd>),
    /// Close everything held now, then answer.
    Flush(Sender<()>),
}

/// The sending side; the thread ends (closing what it holds) when this is dropped.
pub struct Closer {
    tx: Option<Sender<Msg>>,
}

impl Closer {
    /// Start the thread. Without a thread (it could not be spawned), handles close at once.
    pub fn start() -> Closer {
        let (tx, rx) = crossbeam_channel::unbounded();
        let spawned = std::thread::Builder::new()
            .name("intentfs-closer".into())
            .spawn(move || run(rx));
        Closer {
            tx: spawned.is_ok().then_some(tx),
        }
    }

    /// Close `fd` [`DELAY`] from now (at once if the thread is gone).
    pub fn later(&self, fd: Arc<OwnedFd>) {
        if let Some(tx) = &self.tx {
            // On a send error the message (and the handle in it) is dropped: closed now.
            let _ = tx.send(Msg::Close(Instant::now(), fd));
        }
    }

    /// Close every handle held, and return once they are closed (a full disk: the space of
    /// deleted files must come back before the write is retried).
    pub fn flush(&self) {
        if let Some(tx) = &self.tx {
            let (done, wait) = crossbeam_channel::bounded(1);
            if tx.send(Msg::Flush(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }
}

fn run(rx: Receiver<Msg>) {
    let mut held: VecDeque<(Instant, Arc<OwnedFd>)> = VecDeque::new();
    loop {
        let msg = match held.front() {
            Some((at, _)) => {
                rx.recv_timeout((*at + DELAY).saturating_duration_since(Instant::now()))
            }
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match msg {
            Ok(Msg::Close(at, fd)) => held.push_back((at, fd)),
            Ok(Msg::Flush(done)) => {
                held.clear();
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        while held.front().is_some_and(|(at, _)| *at + DELAY <= now) {
            held.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> Arc<OwnedFd> {
        Arc::new(std::fs::File::open("/proc/self/stat").unwrap().into())
    }

    #[test]
    fn handles_are_closed_after_the_delay_or_on_flush() {
        let c = Closer::start();
        let fd = handle();
        let weak = Arc::downgrade(&fd);
        let t0 = Instant::now();
        c.later(fd);
        while weak.upgrade().is_some() {
            assert!(t0.elapsed() < Duration::from_secs(10), "never closed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(t0.elapsed() >= DELAY, "closed before the delay");

        let fd = handle();
        let weak = Arc::downgrade(&fd);
        c.later(fd);
        c.flush();
        assert!(weak.upgrade().is_none(), "flush left the handle open");

        // Without the thread, a handle closes at once.
        drop(c);
        let none = Closer { tx: None };
        let fd = handle();
        let weak = Arc::downgrade(&fd);
        none.later(fd);
        assert!(weak.upgrade().is_none());
    }
}
