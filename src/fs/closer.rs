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
//!
//! A handle is queued without waking the thread unless the queue was empty: the thread
//! sleeps until the oldest handle is due, and everything queued meanwhile is due later.
//! (A channel woke it for every forgotten node: in an edit loop that renames files over
//! others, 10% of the daemon's CPU samples were that thread waking and yielding.)

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// How long a forgotten node's handle is held before it is closed.
pub const DELAY: Duration = Duration::from_millis(20);
/// The least time between two batches of closes (a handle is held at most DELAY + BATCH).
const BATCH: Duration = Duration::from_millis(5);

#[derive(Default)]
struct Held {
    /// Handles in the order they were queued, with when.
    queue: VecDeque<(Instant, Arc<OwnedFd>)>,
    /// The [`Closer`] was dropped: the thread closes what it holds and ends.
    stop: bool,
}

#[derive(Default)]
struct Shared {
    held: Mutex<Held>,
    /// Signalled when the queue stops being empty, and at stop.
    wake: Condvar,
}

/// The queueing side; the thread ends (closing what it holds) when this is dropped.
pub struct Closer {
    /// `None` when the thread could not be spawned: handles close at once.
    shared: Option<Arc<Shared>>,
}

impl Closer {
    /// Start the thread. Without a thread (it could not be spawned), handles close at once.
    pub fn start() -> Closer {
        let shared = Arc::new(Shared::default());
        let theirs = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("intentfs-closer".into())
            .spawn(move || run(&theirs));
        Closer {
            shared: spawned.is_ok().then_some(shared),
        }
    }

    /// Close `fd` [`DELAY`] from now (at once if the thread is gone).
    pub fn later(&self, fd: Arc<OwnedFd>) {
        let Some(sh) = &self.shared else { return };
        let mut held = sh.held.lock();
        let was_empty = held.queue.is_empty();
        held.queue.push_back((Instant::now(), fd));
        drop(held);
        if was_empty {
            sh.wake.notify_one();
        }
    }

    /// Close every handle held, and return once they are closed (a full disk: the space of
    /// deleted files must come back before the write is retried).
    pub fn flush(&self) {
        if let Some(sh) = &self.shared {
            // Closed here, outside the lock: freeing a deleted file waits for the disk.
            let all = std::mem::take(&mut sh.held.lock().queue);
            drop(all);
        }
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        if let Some(sh) = &self.shared {
            sh.held.lock().stop = true;
            sh.wake.notify_one();
        }
    }
}

fn run(sh: &Shared) {
    let mut held = sh.held.lock();
    // Handles are closed in batches at least BATCH apart: during `rm -rf` one is queued
    // every few tens of µs, and a wake-up per handle cost as much as the channel did.
    let mut next_batch = Instant::now();
    loop {
        if held.stop {
            return;
        }
        let Some(&(at, _)) = held.queue.front() else {
            sh.wake.wait(&mut held);
            continue;
        };
        let due = (at + DELAY).max(next_batch);
        if Instant::now() < due {
            sh.wake.wait_until(&mut held, due);
            continue;
        }
        let now = Instant::now();
        let n = held
            .queue
            .iter()
            .take_while(|(at, _)| *at + DELAY <= now)
            .count();
        let expired: Vec<_> = held.queue.drain(..n).collect();
        // Closed outside the lock, so queueing never waits for a file being freed.
        parking_lot::MutexGuard::unlocked(&mut held, || drop(expired));
        next_batch = Instant::now() + BATCH;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> Arc<OwnedFd> {
        Arc::new(std::fs::File::open("/proc/self/stat").unwrap().into())
    }

    /// Wait until every handle is closed (at most 10 s after `since`).
    fn wait_closed(weaks: &[std::sync::Weak<OwnedFd>], since: Instant, what: &str) {
        while weaks.iter().any(|w| w.upgrade().is_some()) {
            assert!(since.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn handles_are_closed_after_the_delay_or_on_flush() {
        let c = Closer::start();
        let fd = handle();
        let weak = Arc::downgrade(&fd);
        let t0 = Instant::now();
        c.later(fd);
        wait_closed(&[weak], t0, "never closed");
        assert!(t0.elapsed() >= DELAY, "closed before the delay");

        let fd = handle();
        let weak = Arc::downgrade(&fd);
        c.later(fd);
        c.flush();
        assert!(weak.upgrade().is_none(), "flush left the handle open");

        // Without the thread, a handle closes at once.
        drop(c);
        let none = Closer { shared: None };
        let fd = handle();
        let weak = Arc::downgrade(&fd);
        none.later(fd);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn a_burst_is_closed_after_the_delay_and_a_dropped_closer_closes_the_rest() {
        let c = Closer::start();
        let t0 = Instant::now();
        let weaks: Vec<_> = (0..500)
            .map(|_| {
                let fd = handle();
                let w = Arc::downgrade(&fd);
                c.later(fd);
                w
            })
            .collect();
        wait_closed(&weaks, t0, "never closed");
        assert!(t0.elapsed() >= DELAY, "closed before the delay");
        let fd = handle();
        let weak = Arc::downgrade(&fd);
        c.later(fd);
        drop(c);
        wait_closed(&[weak], Instant::now(), "a dropped closer kept a handle");
    }
}
