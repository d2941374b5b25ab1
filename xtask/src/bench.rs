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
    let mut cargo = vec![
        "run",
        "--release",
        "--quiet",
        "-p",
        "tensorfold-tests",
        "--bin",
        "bench",
        "--",
    ];
    if args.qwen {
        cargo.push("--qwen");
    }
    crate::cargo(&cargo)
}
