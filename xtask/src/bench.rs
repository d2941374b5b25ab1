//! `cargo xtask bench`: builds and runs the paired benchmark harness, or,
//! with `--peer`, measures TensorFold beside another engine.

use crate::peer::{Invocation, PeerArgs};
use clap::Args;

#[derive(Args)]
pub struct BenchArgs {
    /// Also run the Qwen2.5-Coder pair (fetched with `cargo xtask models --all`).
    #[arg(long)]
    pub qwen: bool,
    /// Only the concurrency cells (1 to 16 streams).
    #[arg(long)]
    pub concurrency: bool,
    /// Only the agent-session cells (12 turns, retained prompts against none).
    #[arg(long)]
    pub agent: bool,
    /// Only the paired drafted-against-serial cells of SmolLM2.
    #[arg(long)]
    pub paired: bool,
    /// Where the target runs: `cpu`, or `cuda` (builds with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Measure beside this engine on the same files (`llama.cpp`).
    #[arg(long)]
    pub peer: Option<String>,
    #[command(flatten)]
    pub peer_args: PeerArgs,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(peer) = &args.peer {
        let how = Invocation {
            backend: args.backend.clone(),
            peer: peer.clone(),
            command: format!(
                "cargo xtask {}",
                std::env::args().skip(1).collect::<Vec<_>>().join(" ")
            ),
        };
        return crate::peer::run(&args.peer_args, &how);
    }
    crate::fetch(args.qwen)?;
    let mode = if args.concurrency {
        Some("--concurrency")
    } else if args.agent {
        Some("--agent")
    } else if args.paired {
        Some("--paired")
    } else {
        args.qwen.then_some("--qwen")
    };
    let mut flags = vec!["--backend", args.backend.as_str()];
    flags.extend(mode);
    crate::harness("bench", &flags, &args.backend)
}
