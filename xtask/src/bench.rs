//! `cargo xtask bench`: builds and runs the paired benchmark harness.

use clap::Args;

#[derive(Args)]
pub struct BenchArgs {
    /// Also run the Qwen2.5-Coder pair (fetched with `cargo xtask models --all`).
    #[arg(long)]
    pub qwen: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    crate::fetch(args.qwen)?;
    crate::harness("bench", args.qwen.then_some("--qwen"))
}
