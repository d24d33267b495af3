/// The daemon allocates on every request (paths, ledger entries, replies); mimalloc does it
/// in less CPU than glibc's malloc on the serving threads (docs/speed.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    intentfs::cli::run()
}
