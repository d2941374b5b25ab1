//! Paired benchmarks.

use clap::Args;

#[derive(Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("no benchmark cells yet")
}
