//! `intentfs restore` and `intentfs rewind` served by the daemon: the plan (`versions`) runs
//! on the workspace below the mount's own root handle, each change is made under the same
//! name locks as the operations it could race with, the kernel is told to drop what it
//! cached of each name it touched (the daemon's own changes raise no fanotify event it
//! listens to), and each step goes on record as the operator's entry.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use crate::approval::RestoreRequest;
use crate::fs::{sys, Fs};
use crate::ledger::Agent;
use crate::versions::plan::{apply, draft, Report};
use crate::versions::tree::{Disk, Node, Tree};

/// The workspace as the daemon changes it: [`Disk`] plus name locks and cache invalidation.
struct Kernel<'a> {
    fs: &'a Fs,
    disk: Disk,
}

impl Kernel<'_> {
    /// Runs `op` on `names` (workspace-relative) holding their name locks, then has the
    /// kernel forget each name and the inode it held before.
    fn change<T>(
        &mut self,
        names: &[&Path],
        op: impl FnOnce(&mut Disk) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut dirs = Vec::new();
        for p in names {
            let (d, name) = self.disk.parent(p)?;
            dirs.push((d, name.to_os_string()));
        }
        let mut keys: Vec<super::rename::NameAt<'_>> = Vec::new();
        for (d, n) in &dirs {
            let st = sys::stat_fd(d.as_fd())?;
            keys.push((d.as_fd(), (st.st_dev, st.st_ino), n.as_os_str()));
        }
        let before: Vec<Option<(u64, u64)>> = keys
            .iter()
            .map(|(d, _, n)| sys::stat_at(*d, n).ok().map(|s| (s.st_dev, s.st_ino)))
            .collect();
        let fs = self.fs;
        let r = {
            let (_locks, _) = fs.lock_names(&keys);
            op(&mut self.disk)
        };
        for ((_, dir, n), child) in keys.iter().zip(before) {
            fs.forget_cached(*dir, n, child);
        }
        r
    }
}

impl Tree for Kernel<'_> {
    fn node(&self, p: &Path) -> io::Result<Node> {
        self.disk.node(p)
    }
    fn read(&self, p: &Path) -> io::Result<Vec<u8>> {
        self.disk.read(p)
    }
    fn put(&mut self, p: &Path, data: &[u8], mode: u32) -> io::Result<()> {
        self.change(&[p], |d| d.put(p, data, mode))
    }
    fn remove(&mut self, p: &Path) -> io::Result<()> {
        self.change(&[p], |d| d.remove(p))?;
        // A tool's temporary removed by a rewind is no longer one (as at an unlink).
        self.fs.gate.temps.remove(p);
        Ok(())
    }
    fn rmdir(&mut self, p: &Path) -> io::Result<()> {
        self.change(&[p], |d| d.rmdir(p))
    }
    fn mkdir(&mut self, p: &Path, mode: u32) -> io::Result<()> {
        self.change(&[p], |d| d.mkdir(p, mode))
    }
    fn symlink(&mut self, p: &Path, target: &Path) -> io::Result<()> {
        self.change(&[p], |d| d.symlink(p, target))
    }
    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        self.change(&[from, to], |d| d.rename(from, to))?;
        self.fs.gate.temps.remove(from);
        Ok(())
    }
    fn exchange(&mut self, a: &Path, b: &Path) -> io::Result<()> {
        self.change(&[a, b], |d| d.exchange(a, b))
    }
    fn chmod(&mut self, p: &Path, mode: u32) -> io::Result<()> {
        self.change(&[p], |d| d.chmod(p, mode))
    }
}

impl Fs {
    /// Serves a restore or rewind for the operator (`pid`, `uid`: who asked).
    pub(crate) fn restore(
        &self,
        pid: u32,
        uid: u32,
        req: &RestoreRequest,
    ) -> std::result::Result<Report, String> {
        let ledger = self.gate.ledger.as_ref().ok_or_else(|| {
            "this mount has no ledger: there is nothing on record to restore".to_string()
        })?;
        // Nothing changes off the record: a ledger that cannot take entries refuses the run
        // (a failure in the middle stops it, see `apply`).
        ledger
            .health()
            .map_err(|e| format!("the ledger cannot be written: {e}"))?;
        let entries = crate::ledger::read_entries(ledger.path())
            .map_err(|e| format!("cannot read the ledger: {e}"))?;
        let store = self.store().map(|s| s.as_ref());
        let plan = crate::versions::plan_request(&entries, req, store)?;
        // Nothing under the daemon's own directory is restored through the mount.
        for s in &plan.steps {
            if s.path.starts_with(".orchestration") || s.path.starts_with(".intentfs") {
                return Err(format!(
                    "{} is intentfs's own: not restored",
                    s.path.display()
                ));
            }
        }
        let root = self
            .table
            .fd(self.table.root())
            .map_err(|e| format!("the workspace root: {e}"))?;
        let disk = Disk::from_fd(root.as_fd()).map_err(|e| format!("the workspace root: {e}"))?;
        let mut tree = Kernel { fs: self, disk };
        let agent = Agent {
            name: "operator".into(),
            identity: "operator".into(),
            pid,
            uid,
            process: "intentfs".into(),
        };
        let run = uuid::Uuid::new_v4().to_string();
        let command = req.command.clone();
        let report = apply(&plan, &mut tree, store, req.force, &mut |c| {
            ledger
                .record(draft(c, &agent, &command, &run))
                .map_err(|e| format!("the ledger cannot be written: {e}"))
        });
        tracing::info!(
            command = %req.command, uid,
            restored = report.restored.len(), removed = report.removed.len(),
            skipped = report.skipped.len(), "versions put back"
        );
        Ok(report)
    }
}
