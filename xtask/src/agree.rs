//! `cargo xtask agree`: greedy replies of the CPU forward against
//! llama.cpp's on the same random-weight f32 GGUFs, one per new family,
//! written in llama.cpp's own layout with its gguf-py
//! (`tests/peer/llama_cpp_families.py` writes them and compares).

use crate::peer::llama_cpp;
use crate::{cargo, target_dir, workspace_root};
use anyhow::{bail, Result};
use clap::Args;
use std::process::Command;

#[derive(Args)]
pub struct AgreeArgs {
    /// Families to compare (comma-separated); all by default.
    #[arg(long)]
    families: Option<String>,
}

pub fn run(args: AgreeArgs) -> Result<()> {
    let peer = llama_cpp::ensure("cpu", None)?;
    cargo(&[
        "build",
        "--release",
        "-p",
        "tensorfold-models",
        "--example",
        "greedy",
    ])?;
    let has_numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_numpy {
        crate::pip_install(&["numpy"])?;
    }
    let out = target_dir().join("peer-families");
    let mut script = Command::new("python3");
    script
        .arg(workspace_root().join("tests/peer/llama_cpp_families.py"))
        .arg("--llama-server")
        .arg(peer.tool("llama-server"))
        .arg("--greedy")
        .arg(target_dir().join("release/examples/greedy"))
        .arg("--gguf-py")
        .arg(llama_cpp::tree().join("gguf-py"))
        .arg("--out")
        .arg(&out);
    if let Some(f) = &args.families {
        script.args(["--families", f]);
    }
    if !script.status()?.success() {
        bail!(
            "a family's greedy replies differ from llama.cpp's (see {})",
            out.display()
        );
    }
    Ok(())
}
