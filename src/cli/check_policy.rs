//! `intentfs check-policy FILE`: validate a policy and print its intents.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::policy::Policy;

#[derive(clap::Args, Debug)]
pub struct CheckPolicyArgs {
    /// The policy file (YAML), e.g. WORKSPACE/.orchestration/active_intents.yaml.
    pub file: PathBuf,
}

pub fn run(a: CheckPolicyArgs) -> anyhow::Result<ExitCode> {
    match Policy::load(&a.file) {
        Ok(p) => {
            println!("{}: ok, {} intent(s)", a.file.display(), p.intents().len());
            print!("{}", p.summary_table());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("intentfs: {e}");
            Ok(ExitCode::from(2))
        }
    }
}
