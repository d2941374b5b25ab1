//! `cargo xtask fuzz [--seconds N]`: every cargo-fuzz target in `fuzz/`,
//! one after another, each for N seconds from its seed corpus
//! (`fuzz/seeds/<target>`, in the repository) and its growing corpus
//! (`fuzz/corpus/<target>`, not). Installs the nightly toolchain and
//! cargo-fuzz when missing. A crash fails the task and leaves its input in
//! `fuzz/artifacts/<target>/`, to become a regression test.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};

/// The targets, as `fuzz/Cargo.toml` names them.
pub const TARGETS: &[&str] = &[
    "gguf_header",
    "gguf_tokenizer",
    "safetensors_header",
    "config_json",
    "chat_template",
    "request_body",
];

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Only this target (default: all).
    #[arg(long)]
    pub target: Option<String>,
}

/// One target's run.
struct Run {
    target: &'static str,
    executions: u64,
    seconds: u64,
    corpus: u64,
}

pub fn run(args: FuzzArgs) -> Result<()> {
    let targets: Vec<&'static str> = match &args.target {
        Some(t) => match TARGETS.iter().find(|name| *name == t) {
            Some(name) => vec![*name],
            None => bail!("no fuzz target {t} (targets: {})", TARGETS.join(", ")),
        },
        None => TARGETS.to_vec(),
    };
    install_tools()?;
    let fuzz = crate::workspace_root().join("fuzz");
    let target_dir = crate::target_dir().join("fuzz");
    let mut runs = Vec::new();
    for target in targets {
        let run = fuzz_one(&fuzz, &target_dir, target, args.seconds)?;
        println!(
            "{target}: {} executions in {} s",
            run.executions, run.seconds
        );
        runs.push(run);
    }
    println!(
        "{:<20} {:>12} {:>8} {:>8}",
        "target", "executions", "seconds", "corpus"
    );
    for r in &runs {
        println!(
            "{:<20} {:>12} {:>8} {:>8}",
            r.target, r.executions, r.seconds, r.corpus
        );
    }
    Ok(())
}

/// Nightly Rust and cargo-fuzz, installed when missing.
fn install_tools() -> Result<()> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !works("cargo", &["+nightly", "--version"]) {
        let ok = Command::new("rustup")
            .args(["toolchain", "install", "nightly", "--profile", "minimal"])
            .status()?
            .success();
        if !ok {
            bail!("rustup could not install the nightly toolchain");
        }
    }
    if !works("cargo", &["fuzz", "--version"]) {
        let ok = Command::new("cargo")
            .args(["install", "cargo-fuzz", "--locked"])
            .status()?
            .success();
        if !ok {
            bail!("cargo install cargo-fuzz failed");
        }
    }
    Ok(())
}

fn fuzz_one(fuzz: &Path, target_dir: &Path, target: &'static str, seconds: u64) -> Result<Run> {
    let corpus = fuzz.join("corpus").join(target);
    std::fs::create_dir_all(&corpus)?;
    let seeds = fuzz.join("seeds").join(target);
    let target_dir = target_dir.to_string_lossy();
    let corpus_arg = corpus.to_string_lossy();
    let seeds_arg = seeds.to_string_lossy();
    let max_time = format!("-max_total_time={seconds}");
    // Built first, so that a build that fails (a full disk, a toolchain
    // problem) is told apart from a crash the fuzzer found.
    let built = Command::new("cargo")
        .current_dir(fuzz)
        .args(["+nightly", "fuzz", "build", "--sanitizer", "none"])
        .args(["--target-dir", &target_dir, target])
        .status()
        .with_context(|| format!("running cargo fuzz build for {target}"))?;
    if !built.success() {
        bail!("building the fuzz target {target} failed (see the compiler's output above)");
    }
    println!("fuzzing {target} for {seconds} s");
    // Safe Rust needs no address sanitizer: the targets look for panics,
    // aborts, timeouts and runaway memory, with debug assertions on.
    let output = Command::new("cargo")
        .current_dir(fuzz)
        .args(["+nightly", "fuzz", "run", "--sanitizer", "none"])
        .args(["--target-dir", &target_dir, target, &corpus_arg, &seeds_arg])
        .args(["--", &max_time, "-print_final_stats=1", "-timeout=20"])
        .args(["-rss_limit_mb=4096", "-max_len=65536"])
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running cargo fuzz for {target}"))?;
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        for line in tail.iter().rev() {
            eprintln!("{line}");
        }
        bail!("{target} found a crash; the input is in fuzz/artifacts/{target}/");
    }
    let stat = |name: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let corpus_size = std::fs::read_dir(&corpus).map_or(0, |d| d.count() as u64);
    Ok(Run {
        target,
        executions: stat("number_of_executed_units"),
        seconds,
        corpus: corpus_size,
    })
}
