//! Under the allow-all intent the mount must behave like the native filesystem for
//! `std::fs` and the tools agents run: sed, python, mv, ln, chmod, truncate, git, tar,
//! rsync, cp, fallocate, copy_file_range, xattrs, locks, fsync, statfs; real and stable
//! inode numbers; hard links; renameat2 flags; a large workspace under the fd cap.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;

fn mount_with(files: &[(&str, &str)]) -> TestMount {
    TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(files)
        .mount()
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn std_fs_create_read_write_append_seek() {
    let tm = mount_with(&[]);
    let p = tm.m("dir/f.txt");
    std::fs::create_dir(tm.m("dir")).unwrap();
    std::fs::write(&p, "hello world").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "hello world");
    assert_eq!(tm.ws_bytes("dir/f.txt"), b"hello world");
    // Append.
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"!!").unwrap();
    drop(f);
    assert_eq!(tm.ws_bytes("dir/f.txt"), b"hello world!!");
    // Seek and overwrite in the middle, read back at offsets.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.seek(SeekFrom::Start(6)).unwrap();
    f.write_all(b"WORLD").unwrap();
    let mut buf = [0u8; 5];
    f.read_exact_at(&mut buf, 6).unwrap();
    assert_eq!(&buf, b"WORLD");
    f.seek(SeekFrom::End(-2)).unwrap();
    let mut rest = String::new();
    f.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "!!");
    // Write past the end: a hole.
    f.write_all_at(b"Z", 20).unwrap();
    drop(f);
    let mut want = b"hello WORLD!!".to_vec();
    want.resize(20, 0);
    want.push(b'Z');
    assert_eq!(tm.ws_bytes("dir/f.txt"), want);
    assert_eq!(std::fs::read(&p).unwrap(), want);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 21);
    // Create-new semantics.
    let e = errno_of(
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p),
        "create_new",
    );
    assert_eq!(e, libc::EEXIST);
    let e = errno_of(std::fs::read(tm.m("dir/missing")), "read missing");
    assert_eq!(e, libc::ENOENT);
    // Large write and read (several FUSE requests).
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(tm.m("big.bin"), &big).unwrap();
    assert_eq!(std::fs::read(tm.m("big.bin")).unwrap(), big);
    assert_eq!(tm.ws_bytes("big.bin"), big);
    // The ledger holds the final content hash of each write.
    let l = tm.mutations();
    let last = l
        .iter()
        .rev()
        .find(|e| e["path"] == "dir/f.txt" && e["mutation_type"] == "WRITE")
        .expect("WRITE of dir/f.txt");
    assert_eq!(last["content_hash"], sha(&want).as_str());
    assert_eq!(last["intent_id"], "ALL");
    let b = l
        .iter()
        .find(|e| e["path"] == "big.bin" && e["mutation_type"] == "WRITE")
        .unwrap();
    assert_eq!(b["content_hash"], sha(&big).as_str());
    assert_eq!(b["size"], 3_000_000);
    assert!(l
        .iter()
        .any(|e| e["mutation_type"] == "MKDIR" && e["path"] == "dir"));
}

#[test]
fn sed_in_place_and_python_replace() {
    let tm = mount_with(&[("a.txt", "one\ntwo\n"), ("b.json", "{\"v\": 1}\n")]);
    tm.sh_ok("sed -i 's/two/TWO/' a.txt");
    assert_eq!(tm.ws_bytes("a.txt"), b"one\nTWO\n");
    tm.sh_ok(
        "python3 - <<'EOF'
import os, tempfile
fd, tmp = tempfile.mkstemp(dir='.', prefix='.b.json.')
with os.fdopen(fd, 'w') as f:
    f.write('{\"v\": 2}\\n')
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, 'b.json')
EOF",
    );
    assert_eq!(tm.ws_bytes("b.json"), b"{\"v\": 2}\n");
    assert_eq!(std::fs::read(tm.m("b.json")).unwrap(), b"{\"v\": 2}\n");
    let names: Vec<String> = std::fs::read_dir(&tm.ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n != ".orchestration")
        .collect();
    assert!(names.is_empty(), "leftover temp files: {names:?}");
    let renames: Vec<_> = tm
        .mutations()
        .into_iter()
        .filter(|e| e["mutation_type"] == "RENAME" && e["path"] == "b.json")
        .collect();
    assert_eq!(renames.len(), 1, "{renames:#?}");
}

#[test]
fn mv_ln_symlink_chmod_truncate() {
    let tm = mount_with(&[("a", "aaaa"), ("d/x", "x")]);
    tm.sh_ok("mv a b && ln b c && ln -s b s && chmod 640 b && truncate -s 2 c && mv d e");
    assert!(!tm.w("a").exists());
    assert_eq!(tm.ws_bytes("b"), b"aa");
    assert_eq!(tm.ws_bytes("c"), b"aa");
    let (b, c) = (
        std::fs::metadata(tm.w("b")).unwrap(),
        std::fs::metadata(tm.w("c")).unwrap(),
    );
    assert_eq!(b.ino(), c.ino());
    assert_eq!(b.nlink(), 2);
    assert_eq!(b.mode() & 0o777, 0o640);
    assert_eq!(std::fs::read_link(tm.w("s")).unwrap(), Path::new("b"));
    assert_eq!(std::fs::read_link(tm.m("s")).unwrap(), Path::new("b"));
    assert_eq!(std::fs::read(tm.m("s")).unwrap(), b"aa");
    assert_eq!(tm.ws_bytes("e/x"), b"x");
    assert!(!tm.w("d").exists());
    // Through the mount, the same view.
    assert_eq!(std::fs::metadata(tm.m("b")).unwrap().mode() & 0o777, 0o640);
    assert_eq!(std::fs::metadata(tm.m("c")).unwrap().nlink(), 2);
    let kinds: Vec<String> = tm
        .mutations()
        .iter()
        .map(|e| e["mutation_type"].as_str().unwrap().to_string())
        .collect();
    for k in ["RENAME", "LINK", "SYMLINK", "CHMOD", "TRUNCATE"] {
        assert!(kinds.iter().any(|x| x == k), "no {k} in {kinds:?}");
    }
    // chmod through setattr on a symlink's target, mode bits incl. setgid/sticky on a dir.
    std::fs::create_dir(tm.m("sticky")).unwrap();
    std::fs::set_permissions(tm.m("sticky"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert_eq!(
        std::fs::metadata(tm.w("sticky")).unwrap().mode() & 0o7777,
        0o1777
    );
}

#[test]
fn mkdir_p_rmdir_rm_rf() {
    let tm = mount_with(&[]);
    tm.sh_ok("mkdir -p a/b/c/d && rmdir a/b/c/d && touch a/b/c/f && mkdir -p t/u && echo 1 > t/u/v && ln -s ../u t/u/l");
    assert!(tm.w("a/b/c").is_dir() && !tm.w("a/b/c/d").exists());
    assert!(tm.w("a/b/c/f").is_file());
    let e = errno_of(std::fs::remove_dir(tm.m("a")), "rmdir non-empty");
    assert_eq!(e, libc::ENOTEMPTY);
    tm.sh_ok("rm -rf a t");
    assert!(!tm.w("a").exists() && !tm.w("t").exists());
    assert!(!tm.m("a").exists());
    let l = tm.mutations();
    assert!(l
        .iter()
        .any(|e| e["mutation_type"] == "RMDIR" && e["path"] == "a/b/c"));
    assert!(l
        .iter()
        .any(|e| e["mutation_type"] == "DELETE" && e["path"] == "t/u/v"));
}

#[test]
fn git_init_add_commit_status_log() {
    // `git init` itself writes .git/config and .git/hooks, which are always protected: a
    // repository is initialized in the workspace, and used through the mount.
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("src/main.rs", "fn main() {}\n"), ("README.md", "hi\n")])
        .setup(|ws| {
            ok(
                sh_in(
                    ws,
                    "git init -q -b main . && git add -A && git commit -qm init",
                ),
                "git init in ws",
            );
            // The virtual control dir and the governance files are not project content.
            std::fs::write(
                ws.join(".git/info/exclude"),
                ".intentfs/\n.orchestration/\n",
            )
            .unwrap();
        })
        .mount();
    assert_eq!(tm.sh_ok("git status --porcelain"), "");
    std::fs::write(tm.m("src/main.rs"), "fn main() { println!(\"hi\"); }\n").unwrap();
    std::fs::write(tm.m("src/lib.rs"), "pub fn f() {}\n").unwrap();
    let st = tm.sh_ok("git status --porcelain");
    assert_eq!(st, " M src/main.rs\n?? src/lib.rs\n");
    tm.sh_ok(
        "git add -A && git commit -qm second && git mv README.md README2.md && git commit -qm mv",
    );
    assert_eq!(tm.sh_ok("git log --format=%s"), "mv\nsecond\ninit\n");
    assert_eq!(tm.sh_ok("git status --porcelain"), "");
    assert_eq!(tm.sh_ok("git show HEAD~1:src/lib.rs"), "pub fn f() {}\n");
    // A second `git status` after a checkout sees a clean tree (index stat data matches:
    // inode numbers and times are real and stable).
    tm.sh_ok("git checkout -q HEAD~2 && git checkout -q main");
    assert_eq!(tm.sh_ok("git status --porcelain"), "");
    // The workspace sees the same repository.
    assert_eq!(
        ok(sh_in(&tm.ws, "git log --format=%s"), "ws log"),
        "mv\nsecond\ninit\n"
    );
    assert_eq!(ok(sh_in(&tm.ws, "git status --porcelain"), "ws status"), "");
    // git gc / repack (writes packs, deletes loose objects) works too.
    tm.sh_ok("git gc -q");
    assert_eq!(tm.sh_ok("git log --oneline | wc -l").trim(), "3");
}

#[test]
fn git_add_all_does_not_commit_the_control_dir() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("a.txt", "a\n")])
        .setup(|ws| {
            ok(
                sh_in(
                    ws,
                    "git init -q -b main . && git add a.txt && git commit -qm init",
                ),
                "git init in ws",
            );
        })
        .mount();
    tm.sh_ok("echo b > b.txt && git add -A && git commit -qm all");
    let files = tm.sh_ok("git ls-files");
    assert!(
        !files.contains(".intentfs/"),
        "committed the control dir:\n{files}"
    );
    // Nor the daemon's own files (issue 17): `.orchestration/` ignores itself.
    assert!(
        !files.contains(".orchestration"),
        "committed the ledger:\n{files}"
    );
    assert_eq!(files, "a.txt\nb.txt\n");
    let st = ok(sh_in(&tm.ws, "git status --porcelain"), "ws status");
    assert!(!st.contains(".intentfs"), "{st}");
    assert!(!st.contains(".orchestration"), "{st}");
}

#[test]
fn git_init_inside_the_mount_is_refused_by_design() {
    let tm = mount_with(&[]);
    let out = tm.sh("git init -q .");
    assert!(
        !out.status.success(),
        "git init wrote .git/config or .git/hooks"
    );
    let le = tm.last_error();
    assert_eq!(le["code"], "PROTECTED_PATH", "{le:#}");
    assert!(!tm.w(".git/config").exists());
}

#[test]
fn tar_create_and_extract() {
    let tm = mount_with(&[]);
    let src = tm.root.join("src");
    put(&src.join("a/b.txt"), "b");
    put(&src.join("c.txt"), "c");
    std::os::unix::fs::symlink("c.txt", src.join("l")).unwrap();
    std::fs::set_permissions(src.join("c.txt"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let tarball = tm.root.join("t.tar");
    ok(
        sh_in(&tm.root, &format!("tar -C src -cf {} .", tarball.display())),
        "tar c",
    );
    tm.sh_ok(&format!("mkdir x && tar -C x -xpf {}", tarball.display()));
    assert_eq!(tree(&tm.w("x"), &[]), tree(&src, &[]));
    // And create from the mount.
    let t2 = tm.root.join("t2.tar");
    tm.sh_ok(&format!("tar -C x -cf {} .", t2.display()));
    let out_dir = tm.root.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    ok(
        sh_in(&out_dir, &format!("tar -xpf {}", t2.display())),
        "tar x",
    );
    assert_eq!(tree(&out_dir, &[]), tree(&src, &[]));
}

#[test]
fn rsync_into_the_mount() {
    let tm = mount_with(&[("dst/stale", "old")]);
    let src = tm.root.join("rsrc");
    put(&src.join("a/b.txt"), "b".repeat(10_000));
    put(&src.join("c.txt"), "c");
    put(&src.join("stale"), "newer content");
    std::os::unix::fs::symlink("a/b.txt", src.join("l")).unwrap();
    std::fs::set_permissions(src.join("c.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    ok(
        sh_in(
            &tm.root,
            &format!("rsync -a {}/ {}/", src.display(), tm.m("dst").display()),
        ),
        "rsync",
    );
    assert_eq!(tree(&tm.w("dst"), &[]), tree(&src, &[]));
    let (a, b) = (
        std::fs::metadata(src.join("a/b.txt")).unwrap(),
        std::fs::metadata(tm.w("dst/a/b.txt")).unwrap(),
    );
    assert_eq!(a.mtime(), b.mtime(), "rsync -a keeps mtimes");
    // A second run has nothing to do.
    let out = ok(
        sh_in(
            &tm.root,
            &format!("rsync -ai {}/ {}/", src.display(), tm.m("dst").display()),
        ),
        "rsync again",
    );
    assert_eq!(out, "", "rsync found differences on the second run: {out}");
}

#[test]
fn cp_fallocate_copy_file_range() {
    let tm = mount_with(&[("src.bin", &"0123456789".repeat(100_000))]);
    tm.sh_ok("cp --reflink=never src.bin copy.bin && fallocate -l 1M alloc.bin");
    assert_eq!(tm.ws_bytes("copy.bin"), tm.ws_bytes("src.bin"));
    let md = std::fs::metadata(tm.w("alloc.bin")).unwrap();
    assert_eq!(md.len(), 1 << 20);
    assert!(
        md.blocks() * 512 >= 1 << 20,
        "fallocate did not allocate: {} blocks",
        md.blocks()
    );
    let out = tm.sh_ok(
        "python3 - <<'EOF'
import os
src = os.open('src.bin', os.O_RDONLY)
dst = os.open('cfr.bin', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
n = 0
while True:
    k = os.copy_file_range(src, dst, 1 << 20, offset_src=n, offset_dst=n)
    if k == 0:
        break
    n += k
os.close(src); os.close(dst)
print(n)
EOF",
    );
    assert_eq!(out.trim(), "1000000");
    assert_eq!(tm.ws_bytes("cfr.bin"), tm.ws_bytes("src.bin"));
    // Punching a hole (fallocate mode) changes the bytes as on the native fs.
    tm.sh_ok("fallocate -p -o 0 -l 10 copy.bin");
    let c = tm.ws_bytes("copy.bin");
    assert_eq!(&c[..10], &[0u8; 10]);
    assert_eq!(&c[10..20], b"0123456789");
    let cfr = tm
        .mutations()
        .into_iter()
        .find(|e| e["path"] == "cfr.bin" && e["mutation_type"] == "WRITE")
        .expect("cfr.bin ledgered");
    assert_eq!(cfr["content_hash"], sha(&tm.ws_bytes("src.bin")).as_str());
}

#[test]
fn xattrs() {
    let tm = mount_with(&[("f", "x")]);
    let have_setfattr = sh_in(&tm.root, "command -v setfattr").status.success();
    if have_setfattr {
        tm.sh_ok("setfattr -n user.tool -v v1 f");
        assert!(tm.sh_ok("getfattr -n user.tool f").contains("v1"));
    }
    let out = tm.sh_ok(
        "python3 - <<'EOF'
import os
os.setxattr('f', 'user.a', b'1')
os.setxattr('f', 'user.b', b'22')
print(sorted(x for x in os.listxattr('f') if x.startswith('user.')))
print(os.getxattr('f', 'user.b'))
os.removexattr('f', 'user.a')
try:
    os.getxattr('f', 'user.a')
except OSError as e:
    print('gone', e.errno)
try:
    os.setxattr('f', 'user.b', b'3', os.XATTR_CREATE)
except OSError as e:
    print('exists', e.errno)
EOF",
    );
    let mut lines = out.lines();
    let listed = lines.next().unwrap();
    assert!(
        listed.contains("'user.a'") && listed.contains("'user.b'"),
        "{out}"
    );
    assert_eq!(lines.next().unwrap(), "b'22'");
    assert_eq!(lines.next().unwrap(), format!("gone {}", libc::ENODATA));
    assert_eq!(lines.next().unwrap(), format!("exists {}", libc::EEXIST));
    // On the backing file.
    let out = ok(
        sh_in(&tm.ws, "python3 -c \"import os; print(os.getxattr('f','user.b'), 'user.a' in os.listxattr('f'))\""),
        "xattr in ws",
    );
    assert_eq!(out.trim(), "b'22' False");
    assert!(tm.mutations().iter().any(|e| e["mutation_type"] == "XATTR"));
}

#[test]
fn flock_posix_locks_fsync_statfs() {
    let tm = mount_with(&[("f", "data")]);
    // flock: a second, non-blocking lock conflicts while the first is held.
    let out = tm.sh_ok("flock -n f -c 'flock -n -E 42 f true; echo $?'");
    assert_eq!(out.trim(), "42");
    assert_eq!(tm.sh_ok("flock -n f -c 'echo locked'").trim(), "locked");
    // POSIX record locks between two processes.
    let out = tm.sh_ok(
        "python3 - <<'EOF'
import fcntl, os, subprocess, sys
f = open('f', 'r+')
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
child = subprocess.run([sys.executable, '-c', '''
import fcntl
g = open(\"f\", \"r+\")
try:
    fcntl.lockf(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print(\"acquired\")
except OSError as e:
    print(\"conflict\")
'''], capture_output=True, text=True)
print(child.stdout.strip())
fcntl.lockf(f, fcntl.LOCK_UN)
f.write('DATA'); f.flush()
os.fsync(f.fileno())
os.fdatasync(f.fileno())
f.close()
EOF",
    );
    assert_eq!(out.trim(), "conflict");
    assert_eq!(tm.ws_bytes("f"), b"DATA");
    // statfs reports the backing filesystem.
    let df = tm.sh_ok(&format!("df -P {}", tm.mnt.display()));
    assert!(df.lines().count() == 2, "{df}");
    // SAFETY: `statvfs` is a plain C struct: all-zero bytes are a valid value.
    let mut a: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `statvfs` is a plain C struct: all-zero bytes are a valid value.
    let mut b: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    assert_eq!(unsafe { libc::statvfs(cpath(&tm.mnt).as_ptr(), &mut a) }, 0);
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    assert_eq!(unsafe { libc::statvfs(cpath(&tm.ws).as_ptr(), &mut b) }, 0);
    assert_eq!(a.f_blocks * a.f_frsize, b.f_blocks * b.f_frsize);
    assert_eq!(a.f_files, b.f_files);
    // Through a subdirectory and a control file as well.
    assert_eq!(
        // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
        unsafe { libc::statvfs(cpath(&tm.m(".intentfs/status")).as_ptr(), &mut a) },
        0
    );
}

#[test]
fn inode_numbers_are_the_backing_ones_and_stable() {
    let mut tm = mount_with(&[("a/b/c.txt", "c"), ("d.txt", "d")]);
    let names = ["a", "a/b", "a/b/c.txt", "d.txt"];
    let via_mount: Vec<u64> = names.iter().map(|n| TestMount::ino(&tm.m(n))).collect();
    let backing: Vec<u64> = names.iter().map(|n| TestMount::ino(&tm.w(n))).collect();
    assert_eq!(via_mount, backing);
    let out = tm.sh_ok("stat -c %i a/b/c.txt");
    assert_eq!(out.trim(), backing[2].to_string());
    // readdir reports them too.
    let out = tm.sh_ok("ls -i d.txt");
    assert_eq!(
        out.split_whitespace().next().unwrap(),
        backing[3].to_string()
    );
    // A new file gets its backing inode number.
    std::fs::write(tm.m("new"), "n").unwrap();
    assert_eq!(TestMount::ino(&tm.m("new")), TestMount::ino(&tm.w("new")));
    // Stable across a rename and a remount.
    std::fs::rename(tm.m("d.txt"), tm.m("a/d.txt")).unwrap();
    assert_eq!(TestMount::ino(&tm.m("a/d.txt")), backing[3]);
    tm.remount();
    assert_eq!(TestMount::ino(&tm.m("a/b/c.txt")), backing[2]);
    assert_eq!(TestMount::ino(&tm.m("a/d.txt")), backing[3]);
    assert_eq!(TestMount::ino(&tm.m("a")), backing[0]);
}

#[test]
fn hard_links_behave() {
    let tm = mount_with(&[("a", "one")]);
    tm.sh_ok("ln a b");
    assert_eq!(tm.sh_ok("stat -c %h a").trim(), "2");
    assert_eq!(tm.sh_ok("stat -c %h b").trim(), "2");
    assert_eq!(TestMount::ino(&tm.m("a")), TestMount::ino(&tm.m("b")));
    std::fs::write(tm.m("b"), "two").unwrap();
    assert_eq!(std::fs::read(tm.m("a")).unwrap(), b"two");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(tm.m("a"))
        .unwrap();
    f.write_all(b"+").unwrap();
    drop(f);
    assert_eq!(std::fs::read(tm.m("b")).unwrap(), b"two+");
    assert_eq!(tm.ws_bytes("b"), b"two+");
    std::fs::remove_file(tm.m("a")).unwrap();
    assert_eq!(tm.sh_ok("stat -c %h b").trim(), "1");
    assert_eq!(std::fs::read(tm.m("b")).unwrap(), b"two+");
    // A hard link into another directory, then rename of the original.
    std::fs::create_dir(tm.m("d")).unwrap();
    std::fs::hard_link(tm.m("b"), tm.m("d/b2")).unwrap();
    std::fs::rename(tm.m("b"), tm.m("c")).unwrap();
    std::fs::write(tm.m("d/b2"), "three").unwrap();
    assert_eq!(std::fs::read(tm.m("c")).unwrap(), b"three");
    assert_eq!(std::fs::metadata(tm.m("c")).unwrap().nlink(), 2);
    // Writing through a hard link made outside the mount (both names in scope) works.
    std::fs::hard_link(tm.w("c"), tm.w("e")).unwrap();
    std::fs::write(tm.m("e"), "four").unwrap();
    assert_eq!(std::fs::read(tm.m("c")).unwrap(), b"four");
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cpath(from).as_ptr(),
            libc::AT_FDCWD,
            cpath(to).as_ptr(),
            flags,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[test]
fn rename_noreplace_and_exchange() {
    let tm = mount_with(&[("a", "A"), ("b", "B"), ("d1/x", "x1"), ("d2/y", "y2")]);
    let e = errno_of(
        renameat2(&tm.m("a"), &tm.m("b"), libc::RENAME_NOREPLACE),
        "noreplace",
    );
    assert_eq!(e, libc::EEXIST);
    assert_eq!(tm.ws_bytes("a"), b"A");
    assert_eq!(tm.ws_bytes("b"), b"B");
    renameat2(&tm.m("a"), &tm.m("c"), libc::RENAME_NOREPLACE).unwrap();
    assert!(!tm.w("a").exists());
    assert_eq!(tm.ws_bytes("c"), b"A");
    // mv -n does not overwrite.
    tm.sh_ok("mv -n c b || true");
    assert_eq!(tm.ws_bytes("b"), b"B");
    assert_eq!(tm.ws_bytes("c"), b"A");
    // Exchange two files, then two directories.
    renameat2(&tm.m("b"), &tm.m("c"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(tm.ws_bytes("b"), b"A");
    assert_eq!(tm.ws_bytes("c"), b"B");
    assert_eq!(std::fs::read(tm.m("b")).unwrap(), b"A");
    assert_eq!(std::fs::read(tm.m("c")).unwrap(), b"B");
    renameat2(&tm.m("d1"), &tm.m("d2"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(tm.ws_bytes("d1/y"), b"y2");
    assert_eq!(tm.ws_bytes("d2/x"), b"x1");
    assert_eq!(std::fs::read(tm.m("d1/y")).unwrap(), b"y2");
    assert_eq!(std::fs::read(tm.m("d2/x")).unwrap(), b"x1");
    let e = errno_of(
        renameat2(&tm.m("b"), &tm.m("zz"), libc::RENAME_EXCHANGE),
        "exchange missing",
    );
    assert_eq!(e, libc::ENOENT);
    // The same with python ctypes, as an agent would.
    let out = tm.sh_ok(
        "python3 - <<'EOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
r = libc.renameat2(AT_FDCWD, b'b', AT_FDCWD, b'c', 2)
print(r, open('b').read(), open('c').read())
r = libc.renameat2(AT_FDCWD, b'b', AT_FDCWD, b'c', 1)
print(r, ctypes.get_errno() == 17)
EOF",
    );
    assert_eq!(out, "0 B A\n-1 True\n");
    assert!(tm
        .mutations()
        .iter()
        .any(|e| e["mutation_type"] == "RENAME" && e["detail"]["exchange"] == true));
}

#[test]
fn thirty_thousand_files_under_the_fd_cap() {
    const DIRS: usize = 30;
    const PER: usize = 1000;
    const THREADS: usize = 4;
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .on_tmpfs()
        .setup(|ws| {
            // Directly in the workspace, a few threads at a time.
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    s.spawn(move || {
                        for d in (t..DIRS).step_by(THREADS) {
                            let dir = ws.join(format!("big/d{d:02}"));
                            std::fs::create_dir_all(&dir).unwrap();
                            for f in 0..PER {
                                std::fs::write(dir.join(format!("f{f:04}")), format!("{d}/{f}"))
                                    .unwrap();
                            }
                        }
                    });
                }
            });
        })
        .mount();
    let pid = tm.daemon_pid();
    let fds = move || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let out = tm.sh_ok("find big | wc -l");
    assert_eq!(out.trim(), (1 + DIRS + DIRS * PER).to_string());
    // Read every file through the mount (several readers at once), sampling the daemon's
    // open descriptors as we go.
    let max_fds = std::sync::atomic::AtomicUsize::new(fds());
    let read = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (tm, max_fds, read) = (&tm, &max_fds, &read);
            s.spawn(move || {
                for d in (t..DIRS).step_by(THREADS) {
                    let dir = tm.m(&format!("big/d{d:02}"));
                    let mut names: Vec<_> = std::fs::read_dir(&dir)
                        .unwrap()
                        .map(|e| e.unwrap().file_name())
                        .collect();
                    assert_eq!(names.len(), PER);
                    names.sort();
                    for (f, name) in names.iter().enumerate() {
                        let p = dir.join(name);
                        let got = std::fs::read(&p).unwrap();
                        assert_eq!(got, format!("{d}/{f}").as_bytes(), "{}", p.display());
                        read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if f % 250 == 0 {
                            max_fds.fetch_max(fds(), std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    assert_eq!(read.into_inner(), DIRS * PER);
    let max_fds = max_fds.into_inner();
    assert!(max_fds < 20_000, "the daemon held {max_fds} fds");
    // Still serving, and a whole-tree search works.
    let out = tm.sh_ok("rg -l --no-messages '^29/999$' big");
    assert_eq!(out.trim(), "big/d29/f0999");
    assert!(fds() < 20_000);
}

// ----- an identity never goes stale against its own changes ---------------------------------

fn python(tm: &TestMount, script: &str) -> String {
    tm.sh_ok(&format!("python3 - <<'EOF'\nimport os\n{script}\nEOF"))
}

#[test]
fn own_changes_never_make_a_file_stale() {
    let tm = mount_with(&[]);
    // Each: changes made by this identity through the mount, then a mutation that stale
    // protection checks (unlink, rename, open for writing).
    python(
        &tm,
        "
def fresh(n):
    with open(n, 'wb') as f: f.write(b'hello')
fresh('a'); open('a', 'ab').write(b'+'); os.unlink('a')
fresh('b'); fd = os.open('b', os.O_WRONLY); os.pwrite(fd, b'zz', 40); os.close(fd); os.rename('b', 'b2')
fresh('c'); f = open('c', 'r+b'); f.truncate(2); f.close(); open('c', 'wb').write(b'x'); os.unlink('c')
fresh('d'); os.chmod('d', 0o600); open('d', 'ab').write(b'+'); os.unlink('d')
fresh('e'); os.rename('e', 'e2'); open('e2', 'ab').write(b'+'); os.unlink('e2')
fresh('f'); os.link('f', 'g'); os.unlink('f'); open('g', 'ab').write(b'+'); os.unlink('g')
",
    );
    assert_eq!(tm.ws_bytes("b2").len(), 42);
    for n in ["a", "c", "d", "e2", "f", "g"] {
        assert!(!tm.w(n).exists(), "{n}");
    }
    assert!(tm.ledger().iter().all(|e| e["code"] != "STALE_FILE"));
}

#[test]
fn own_truncate_by_path_does_not_make_the_file_stale() {
    let tm = mount_with(&[]);
    std::fs::write(tm.m("f"), "dygvldlkqhavzwhwpk").unwrap();
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = unsafe { libc::truncate(cpath(&tm.m("f")).as_ptr(), 37) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let r = std::fs::remove_file(tm.m("f"));
    assert!(r.is_ok(), "{r:?}: {}", tm.ctl("last_error"));
}

#[test]
fn own_write_to_a_hard_linked_file_does_not_make_it_stale() {
    let tm = mount_with(&[]);
    std::fs::write(tm.m("r1"), "hello").unwrap();
    std::fs::hard_link(tm.m("r1"), tm.m("r2")).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(tm.m("r1"))
        .unwrap();
    f.write_all(b"more").unwrap();
    drop(f);
    assert_eq!(std::fs::read(tm.m("r1")).unwrap(), b"hellomore");
    let r = std::fs::remove_file(tm.m("r1"));
    assert!(r.is_ok(), "{r:?}: {}", tm.ctl("last_error"));
    assert_eq!(tm.ws_bytes("r2"), b"hellomore");
}

#[test]
fn own_write_through_another_hard_link_name_does_not_make_it_stale() {
    let tm = mount_with(&[]);
    std::fs::write(tm.m("q"), "hello").unwrap();
    std::fs::hard_link(tm.m("q"), tm.m("qL")).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(tm.m("qL"))
        .unwrap();
    f.write_all(b"xyz").unwrap();
    drop(f);
    let r = std::fs::remove_file(tm.m("q"));
    assert!(r.is_ok(), "{r:?}: {}", tm.ctl("last_error"));
}

#[test]
fn rereading_an_emptied_file_clears_stale() {
    let tm = mount_with(&[("e", "abc\n")]);
    assert_eq!(std::fs::read(tm.m("e")).unwrap(), b"abc\n");
    // A human empties it, directly in the workspace.
    std::fs::write(tm.w("e"), "").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100)); // past the attribute cache
                                                                // The agent follows the remedy: it re-reads the file ...
    assert_eq!(std::fs::read(tm.m("e")).unwrap(), b"");
    // ... and may now change it.
    let r = std::fs::write(tm.m("e"), "new");
    assert!(r.is_ok(), "{r:?}: {}", tm.ctl("last_error"));
    assert_eq!(tm.ws_bytes("e"), b"new");
}

#[test]
fn stale_file_refused_after_a_human_edit_then_allowed_after_reread() {
    // The behaviour the bugs above deviate from: a human's edit makes the agent's write
    // stale until it re-reads the file.
    let tm = mount_with(&[("s", "v1\n")]);
    assert_eq!(std::fs::read(tm.m("s")).unwrap(), b"v1\n");
    std::fs::write(tm.w("s"), "v2 by a human\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let le = tm.assert_denied(std::fs::write(tm.m("s"), "agent"), "STALE_FILE");
    assert_eq!(le["path"], "s");
    assert_eq!(tm.ws_bytes("s"), b"v2 by a human\n");
    assert_eq!(std::fs::read(tm.m("s")).unwrap(), b"v2 by a human\n");
    std::fs::write(tm.m("s"), "agent").unwrap();
    assert_eq!(tm.ws_bytes("s"), b"agent");
}
