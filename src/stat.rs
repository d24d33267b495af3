//! `stat` as the kernel returns it: the attributes the passthrough (`fs`) reads and the
//! control directory (`control`) makes up. A leaf, so that neither depends on the other.

/// `stat` as the kernel returns it.
pub type Stat = libc::stat64;

/// An all-zero [`Stat`], for attributes made up rather than read from the kernel.
pub fn zeroed() -> Stat {
    // SAFETY: `stat64` is a plain C struct of integers; all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}
