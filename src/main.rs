fn main() -> std::process::ExitCode {
    intentfs::cli::run()
}
