//! `tensorfold quantize` as a user runs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use tensorfold_models::synth::{self, SynthSpec};
use tensorfold_models::{Arch, Format};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensorfold"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("quantize");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn quantize(src: &Path, out: &Path, flags: &[&str]) -> String {
    let o = bin()
        .arg("quantize")
        .arg(src)
        .arg("--out")
        .arg(out)
        .args(flags)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "quantize {flags:?}: {err}");
    err
}

fn reply(model: &Path, prompt: &str) -> String {
    let o = bin()
        .arg("run")
        .arg(model)
        .args(["--chat", "--temperature", "0", "--max-tokens", "16"])
        .args(["--prompt", prompt])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn gguf_and_float_sources_quantize_with_mixed_settings() {
    let dir = tmp("src");
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join("tiny.gguf");
    synth::write_gguf(&gguf, &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 3)).unwrap();
    let hf = dir.join("tiny-hf");
    synth::write_hf(&hf, &SynthSpec::tiny(Arch::Qwen2, Format::Bf16, 4)).unwrap();
    for (src, name) in [(&gguf, "from-gguf"), (&hf, "from-hf")] {
        let out = tmp(name);
        let note = quantize(
            src,
            &out,
            &["--bits", "3", "--group", "32", "--embed-bits", "8"],
        );
        assert!(
            note.contains("AFFINE3_G32") && note.contains("AFFINE8_G32"),
            "{note}"
        );
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["quantization"]["bits"], 3);
        assert_eq!(cfg["quantization"]["model.embed_tokens"]["bits"], 8);
        for f in [
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            assert!(out.join(f).exists(), "{f}");
        }
        // The quantized model serves chats: it runs, and twice the same.
        let a = reply(&out, "hello");
        assert_eq!(a, reply(&out, "hello"));
    }
    let out = tmp("bad");
    let o = bin()
        .arg("quantize")
        .arg(&gguf)
        .args(["--bits", "7", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("bits 2, 3, 4, 5, 6 or 8"), "{err}");
}

/// SmolLM2 at each width still answers with Paris (greedy), quantized by
/// the default (search) rule. The source's embedding table is Q8_0, and at
/// 6 and 3 bits it needs to stay at 8 bits to keep the answer.
#[test]
fn quantized_smollm2_still_knows_the_capital_of_france() {
    let models = std::env::var_os("TENSORFOLD_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    let src = models.join("smollm2-135m-instruct-q4_1.gguf");
    if !src.exists() {
        if std::env::var_os("TENSORFOLD_REQUIRE_MODELS").is_some() {
            panic!("{} is missing: run `cargo xtask models`", src.display());
        }
        eprintln!(
            "skipping: {} not fetched (cargo xtask models)",
            src.display()
        );
        return;
    }
    let settings: [&[&str]; 5] = [
        &["--bits", "8", "--group", "64"],
        &["--bits", "6", "--group", "32", "--embed-bits", "8"],
        &["--bits", "5", "--group", "64"],
        &["--bits", "4", "--group", "64"],
        &["--bits", "3", "--group", "32", "--embed-bits", "8"],
    ];
    for flags in settings {
        let out = tmp(&format!("smollm2-{}", flags.join("")));
        quantize(&src, &out, flags);
        let r = reply(&out, "What is the capital of France?");
        assert!(r.contains("Paris"), "{flags:?}: {r:?}");
        let _ = std::fs::remove_dir_all(&out);
    }
}
