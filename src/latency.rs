//! `intentfs mount --low-latency`: while agents are using the mount, ask the kernel to keep
//! idle CPUs polling instead of halting (the CPU latency PM QoS, `/dev/cpu_dma_latency`).
//!
//! Every FUSE request is two wake-ups (the daemon's worker, then the caller). On virtual
//! machines a halted vCPU is woken through the hypervisor, which can cost more than the
//! request itself (see bench/README.md "Where the time goes"). A CPU latency request of
//! 0 µs makes cpuidle pick its polling state, so a wake-up is a store the polling CPU sees.
//! Polling costs power (and host CPU on a VM), so the request is held only while requests
//! arrive: it is made at the first request after a quiet spell and dropped when none came
//! for [`LINGER`]. While the mount is idle no thread of this module runs.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The kernel's CPU latency QoS device: an open descriptor is one request; its value (µs,
/// a native-endian `i32`) holds until rewritten or closed.
pub const DEVICE: &str = "/dev/cpu_dma_latency";

/// How long the request outlives the last FUSE request (between two commands of a script
/// there are a few milliseconds of process start-up).
pub const LINGER: Duration = Duration::from_millis(50);

/// "No constraint": the kernel's default for a request (`PM_QOS_DEFAULT_VALUE`).
const RELAXED: i32 = 2_000_000_000;

pub struct LowLatency {
    /// Requests seen (bumped by [`LowLatency::tick`]).
    ticks: AtomicU64,
    /// The 0 µs request is in force.
    held: AtomicBool,
    /// Times the request was made, and time held over finished spells (ms), for
    /// `.intentfs/status`.
    bursts: AtomicU64,
    held_ms: AtomicU64,
    monitor: OnceLock<std::thread::Thread>,
}

impl LowLatency {
    /// Open the QoS device and start the monitor thread.
    pub fn start() -> std::io::Result<Arc<LowLatency>> {
        let dev = std::fs::OpenOptions::new().write(true).open(DEVICE)?;
        let ll = Arc::new(LowLatency {
            ticks: AtomicU64::new(0),
            held: AtomicBool::new(false),
            bursts: AtomicU64::new(0),
            held_ms: AtomicU64::new(0),
            monitor: OnceLock::new(),
        });
        let weak = Arc::downgrade(&ll);
        let t = std::thread::Builder::new()
            .name("low-latency".into())
            .spawn(move || monitor(weak, dev))?;
        let _ = ll.monitor.set(t.thread().clone());
        Ok(ll)
    }

    /// A request arrived (one relaxed add; the monitor is woken only after a quiet spell).
    #[inline]
    pub fn tick(&self) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
        if !self.held.load(Ordering::Relaxed) {
            if let Some(t) = self.monitor.get() {
                t.unpark();
            }
        }
    }

    pub fn held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// (times the request was made, milliseconds it was held over finished spells).
    pub fn stats(&self) -> (u64, u64) {
        (
            self.bursts.load(Ordering::Relaxed),
            self.held_ms.load(Ordering::Relaxed),
        )
    }
}

fn set(dev: &mut File, us: i32) -> bool {
    match dev.write_all(&us.to_ne_bytes()) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("{DEVICE}: {e}: --low-latency stops");
            false
        }
    }
}

/// Park while idle; hold the request while ticks keep coming. Ends with the filesystem
/// (the closed descriptor drops the request).
fn monitor(ll: std::sync::Weak<LowLatency>, mut dev: File) {
    let mut seen = 0;
    loop {
        {
            let Some(l) = ll.upgrade() else { return };
            if l.ticks.load(Ordering::Relaxed) == seen {
                drop(l);
                // A tick after `held` went false unparks us; one that came between the
                // load above and here left a token, so park returns at once.
                std::thread::park_timeout(Duration::from_secs(5));
                continue;
            }
            if !set(&mut dev, 0) {
                return;
            }
            l.held.store(true, Ordering::Relaxed);
            l.bursts.fetch_add(1, Ordering::Relaxed);
        }
        let since = Instant::now();
        loop {
            std::thread::sleep(LINGER);
            let Some(l) = ll.upgrade() else { return };
            // (Dropping the last Fs ends the thread; the closed descriptor ends the request.)
            let now = l.ticks.load(Ordering::Relaxed);
            if now == seen {
                break;
            }
            seen = now;
        }
        let Some(l) = ll.upgrade() else { return };
        l.held.store(false, Ordering::Relaxed);
        l.held_ms
            .fetch_add(since.elapsed().as_millis() as u64, Ordering::Relaxed);
        // A tick between the last look and `held = false` did not unpark us; the outer
        // loop sees it (ticks != seen) and makes the request again.
        if !set(&mut dev, RELAXED) {
            return;
        }
    }
}
