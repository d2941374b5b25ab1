//! `cargo xtask agree`: greedy replies of the CPU forward against
//! llama.cpp's on the same random-weight f32 GGUFs, one per new family,
//! written in llama.cpp's own layout with its gguf-py
//! (`tests/peer/llama_cpp_families.py` writes them and compares).
//! `--peer transformers`: every position's logits against PyTorch and
//! transformers on random f32 weights that transformers writes in the
//! Hugging Face layout (`tests/peer/transformers_families.py`).

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
    /// The independent engine: `llama.cpp` (greedy replies on GGUFs) or
    /// `transformers` (logits on Hugging Face files; installs torch and
    /// transformers with pip where python3 lacks them).
    #[arg(long, default_value = "llama.cpp")]
    peer: String,
}

pub fn run(args: AgreeArgs) -> Result<()> {
    match args.peer.as_str() {
        "llama.cpp" => with_llama_cpp(&args),
        "transformers" => with_transformers(&args),
        other => bail!("unknown peer '{other}' (llama.cpp or transformers)"),
    }
}

/// Builds `example` of tensorfold-models, and installs `packages` with pip
/// unless python3 already imports `modules`.
fn prepare(example: &str, modules: &str, packages: &[&str]) -> Result<()> {
    cargo(&[
        "build",
        "--release",
        "-p",
        "tensorfold-models",
        "--example",
        example,
    ])?;
    let present = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        crate::pip_install(packages)?;
    }
    Ok(())
}

fn with_transformers(args: &AgreeArgs) -> Result<()> {
    prepare(
        "logits",
        "torch, transformers, safetensors",
        &["torch", "transformers", "safetensors", "numpy"],
    )?;
    let mut script = Command::new("python3");
    script
        .arg(workspace_root().join("tests/peer/transformers_families.py"))
        .arg("--logits")
        .arg(target_dir().join("release/examples/logits"));
    run_script(
        script,
        "transformers-families",
        args,
        "a family's logits are past the tolerance of transformers'",
    )
}

/// Runs a comparison script with its output folder (under the target
/// directory) and the chosen families; `failure` says what a failure means.
fn run_script(mut script: Command, out: &str, args: &AgreeArgs, failure: &str) -> Result<()> {
    let out = target_dir().join(out);
    script.arg("--out").arg(&out);
    if let Some(f) = &args.families {
        script.args(["--families", f]);
    }
    if !script.status()?.success() {
        bail!("{failure} (see {})", out.display());
    }
    Ok(())
}

fn with_llama_cpp(args: &AgreeArgs) -> Result<()> {
    let peer = llama_cpp::ensure("cpu", None)?;
    prepare("greedy", "numpy", &["numpy"])?;
    let mut script = Command::new("python3");
    script
        .arg(workspace_root().join("tests/peer/llama_cpp_families.py"))
        .arg("--llama-server")
        .arg(peer.tool("llama-server"))
        .arg("--greedy")
        .arg(target_dir().join("release/examples/greedy"))
        .arg("--gguf-py")
        .arg(llama_cpp::tree().join("gguf-py"));
    run_script(
        script,
        "peer-families",
        args,
        "a family's greedy replies differ from llama.cpp's",
    )
}
