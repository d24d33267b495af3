//! Extended attributes.

use super::*;

impl Fs {
    pub fn getxattr(&self, nodeid: u64, name: &OsStr, size: u32) -> Result<Vec<u8>> {
        if control::is_control(nodeid) {
            return err(libc::ENODATA);
        }
        let node = self.node(nodeid)?;
        if node.is_symlink() {
            return err(libc::ENODATA);
        }
        let fd = self.fd(&node)?;
        Ok(sys::getxattr_fd(fd.as_fd(), name, size as usize)?)
    }

    pub fn listxattr(&self, nodeid: u64, size: u32) -> Result<Vec<u8>> {
        if control::is_control(nodeid) {
            return Ok(Vec::new());
        }
        let node = self.node(nodeid)?;
        if node.is_symlink() {
            return Ok(Vec::new());
        }
        let fd = self.fd(&node)?;
        Ok(sys::listxattr_fd(fd.as_fd(), size as usize)?)
    }

    pub fn setxattr(
        &self,
        caller: &Caller,
        nodeid: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        self.xattr_change(caller, nodeid, name, Operation::Setxattr, |fd| {
            sys::setxattr_fd(fd, name, value, flags)
        })
    }

    pub fn removexattr(&self, caller: &Caller, nodeid: u64, name: &OsStr) -> Result<()> {
        self.xattr_change(caller, nodeid, name, Operation::Removexattr, |fd| {
            sys::removexattr_fd(fd, name)
        })
    }

    pub(super) fn xattr_change(
        &self,
        caller: &Caller,
        nodeid: u64,
        name: &OsStr,
        op: Operation,
        act: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<()>,
    ) -> Result<()> {
        if control::is_control(nodeid) {
            return err(libc::EPERM);
        }
        let node = self.node(nodeid)?;
        if node.is_symlink() {
            return err(libc::EPERM);
        }
        self.settled(&node);
        let (ident, rel) = self.authorize_node(caller, op, &node)?;
        let fd = self.fd(&node)?;
        // (`--record async`: room for the entry, taken before the change is made.)
        let extra = crate::ledger::entry::encoded_len(Path::new(name)) as u64;
        let slot = self.defer_slot(MutationType::Xattr, &node, &ident, &rel, extra);
        act(fd.as_fd())?;
        let draft = Draft {
            detail: Some(serde_json::json!({ "op": op, "name": name.to_string_lossy() })),
            ..Default::default()
        };
        self.record_change(&ident, caller, MutationType::Xattr, &rel, draft, slot)?;
        Ok(())
    }
}
