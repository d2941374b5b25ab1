//! The `tensorfold` command as a user runs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use tensorfold_models::synth::{self, SynthSpec};
use tensorfold_models::{Arch, Format};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensorfold"))
}

fn fixture(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Written once: tests run in parallel, and a rewrite under a running
/// `tensorfold` would hand it a half-written file.
fn tiny_gguf() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let p = fixture("tiny.gguf");
        synth::write_gguf(&p, &SynthSpec::tiny(Arch::Qwen2, Format::Q4_0, 1)).unwrap();
        p
    })
    .clone()
}

#[test]
fn info_reads_the_header() {
    let out = bin().arg("info").arg(tiny_gguf()).output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("qwen2") && s.contains("Q4_0"), "{s}");
}

/// A tiny Hugging Face model whose config.json `edit` rewrites.
fn hf_with_config(name: &str, edit: &dyn Fn(String) -> String) -> PathBuf {
    let dir = fixture(name);
    synth::write_hf(&dir, &SynthSpec::tiny(Arch::Llama, Format::F32, 1)).unwrap();
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), edit(cfg)).unwrap();
    dir
}

fn assert_refused(path: &Path, needle: &str) {
    for cmd in ["info", "run"] {
        let out = bin()
            .arg(cmd)
            .arg(path)
            .args(
                ["--prompt", "x"]
                    .iter()
                    .take(if cmd == "run" { 2 } else { 0 }),
            )
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{cmd} {}: {err}",
            path.display()
        );
        assert!(err.contains(needle), "{cmd}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn malformed_and_unsupported_files_are_refused_cleanly() {
    let junk = fixture("junk.gguf");
    std::fs::write(&junk, b"definitely not a model").unwrap();
    assert_refused(&junk, "not a readable GGUF");

    let truncated = fixture("truncated.gguf");
    let bytes = std::fs::read(tiny_gguf()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    assert_refused(&truncated, "truncated");

    let dir = hf_with_config("falcon", &|c: String| {
        c.replace("LlamaForCausalLM", "FalconForCausalLM")
    });
    assert_refused(&dir, "architecture 'FalconForCausalLM' is not supported");

    let q = hf_with_config("gptq", &|c: String| {
        c.replacen(
            '{',
            "{\"quantization_config\": {\"quant_method\": \"gptq\"},",
            1,
        )
    });
    assert_refused(&q, "gptq");

    assert_refused(&fixture("missing.gguf"), "no such file");
}

#[test]
fn run_prints_the_reply_alone() {
    let path = tiny_gguf();
    let args = [
        "--prompt",
        "hello",
        "--max-tokens",
        "12",
        "--temperature",
        "0.8",
        "--seed",
        "3",
    ];
    let run = || {
        bin()
            .arg("run")
            .arg(&path)
            .args(args)
            .arg("--ignore-eos")
            .output()
            .unwrap()
    };
    let (a, b) = (run(), run());
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(a.stdout, b.stdout, "same seed, same bytes");
    assert!(String::from_utf8_lossy(&a.stderr).contains("tokens/s"));
    assert!(!String::from_utf8_lossy(&a.stdout).contains("tokens/s"));
}

#[test]
fn backends_are_chosen_by_flag_and_refused_cleanly() {
    let path = tiny_gguf();
    let run = |backend: &str| {
        bin()
            .arg("run")
            .arg(&path)
            .args(["--prompt", "hi", "--max-tokens", "4", "--backend", backend])
            .output()
            .unwrap()
    };
    let (auto, cpu) = (run("auto"), run("cpu"));
    assert!(
        cpu.status.success(),
        "{}",
        String::from_utf8_lossy(&cpu.stderr)
    );
    // Without a GPU in reach, `auto` is the CPU: the same bytes.
    if !tensorfold_engine::cuda_available() {
        assert_eq!(auto.stdout, cpu.stdout);
        let cuda = run("cuda");
        let err = String::from_utf8_lossy(&cuda.stderr);
        assert!(!cuda.status.success());
        assert!(
            err.contains("backend") && !err.contains("panicked"),
            "{err}"
        );
    }
    let bad = run("tpu");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected auto, cpu, cuda or metal"));
}
