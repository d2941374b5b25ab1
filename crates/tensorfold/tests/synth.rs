//! `tensorfold synth` as a user runs it: real shapes, few layers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tensorfold_models::{Format, GgufFile};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensorfold"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("synth");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes `name` with `flags`; returns the path and what synth said.
fn synth(name: &str, flags: &[&str]) -> (PathBuf, String) {
    let path = tmp(name);
    let o = bin()
        .arg("synth")
        .args(flags)
        .arg("--out")
        .arg(&path)
        .output()
        .unwrap();
    assert!(o.status.success(), "synth {flags:?}: {}", stderr(&o));
    (path, stderr(&o))
}

fn info(path: &Path) -> serde_json::Value {
    let o = bin().arg("info").arg(path).arg("--json").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn formats(path: &Path) -> BTreeMap<String, Format> {
    let f = GgufFile::open(path).unwrap();
    f.tensors()
        .unwrap()
        .into_iter()
        .map(|(n, _, f)| (n, f))
        .collect()
}

/// Greedy, four tokens whatever the random model says.
fn assert_runs(path: &Path) {
    let o = bin()
        .arg("run")
        .arg(path)
        .args(["--prompt", "hi", "--max-tokens", "4", "--ignore-eos"])
        .args(["--context", "256", "--backend", "cpu"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("reply 4 tokens"), "{err}");
    assert!(!o.stdout.is_empty());
}

#[test]
fn smollm2_at_q4_1_reads_back_with_its_real_sizes_and_runs() {
    let (path, said) = synth(
        "smollm2-q4_1.gguf",
        &["--shape", "smollm2", "--quant", "Q4_1", "--layers", "2"],
    );
    assert!(
        said.contains("parameters") && said.contains("smollm2-q4_1.gguf"),
        "{said}"
    );
    assert!(!said.contains("note:"), "Q4_1 fits 576-wide rows: {said}");
    let i = info(&path);
    let c = &i["config"];
    assert_eq!(c["arch"], "Llama");
    let sizes = [
        ("vocab_size", 49_152),
        ("hidden_size", 576),
        ("intermediate_size", 1536),
        ("layers", 2),
        ("heads", 9),
        ("kv_heads", 3),
        ("head_dim", 64),
        ("max_positions", 32_768),
    ];
    for (key, want) in sizes {
        assert_eq!(c[key], want, "{key}");
    }
    assert_eq!(c["tied_embeddings"], true);
    assert_eq!(c["rope_theta"], 100_000.0);
    // Embeddings and 7 matrices a layer; 2 norms a layer and the final one.
    assert_eq!(i["formats"], serde_json::json!({"Q4_1": 15, "F32": 5}));
    assert_runs(&path);
}

#[test]
fn q4_k_m_is_llama_cpps_mix_with_its_fallbacks_on_short_rows() {
    let (path, said) = synth(
        "qwen-0.5b-q4_k_m.gguf",
        &[
            "--shape",
            "qwen2.5-0.5b",
            "--quant",
            "Q4_K_M",
            "--layers",
            "2",
        ],
    );
    let i = info(&path);
    assert_eq!(i["config"]["arch"], "Qwen2");
    assert_eq!(i["config"]["vocab_size"], 151_936);
    assert_eq!(i["config"]["qkv_bias"], true);
    // 896-wide rows are not whole 256-blocks: Q4_K -> Q5_0, Q6_K -> Q8_0;
    // ffn_down's 4864-wide rows keep the k-quants. With 2 layers,
    // use_more_bits picks layer 1 only.
    let f = formats(&path);
    let expected = [
        ("token_embd.weight", Format::Q8_0),
        ("blk.0.attn_q.weight", Format::Q5_0),
        ("blk.0.attn_v.weight", Format::Q5_0),
        ("blk.1.attn_v.weight", Format::Q8_0),
        ("blk.0.ffn_down.weight", Format::Q4K),
        ("blk.1.ffn_down.weight", Format::Q6K),
        ("blk.1.ffn_up.weight", Format::Q5_0),
        ("blk.0.attn_q.bias", Format::F32),
        ("output_norm.weight", Format::F32),
    ];
    for (name, want) in expected {
        assert_eq!(f[name], want, "{name}");
    }
    assert!(!f.contains_key("output.weight"), "tied");
    assert!(said.contains("Q4_K -> Q5_0 (896 columns) x11"), "{said}");
    assert!(said.contains("Q6_K -> Q8_0 (896 columns) x2"), "{said}");
    assert_eq!(said.matches("note:").count(), 1, "said once: {said}");
}

#[test]
fn smollm2_at_q4_k_m_falls_back_and_runs() {
    let (path, said) = synth(
        "smollm2-q4_k_m.gguf",
        &["--shape", "smollm2", "--quant", "Q4_K_M", "--layers", "2"],
    );
    assert!(said.contains("Q4_K -> Q5_0 (576 columns)"), "{said}");
    let f = formats(&path);
    assert_eq!(f["token_embd.weight"], Format::Q8_0);
    assert_eq!(f["blk.0.ffn_gate.weight"], Format::Q5_0);
    assert_eq!(f["blk.0.ffn_down.weight"], Format::Q4K);
    assert_eq!(f["blk.1.ffn_down.weight"], Format::Q6K);
    assert_runs(&path);
}

#[test]
fn the_same_seed_writes_the_same_bytes() {
    let flags = |seed| {
        [
            "--shape", "smollm2", "--quant", "Q8_0", "--layers", "1", "--seed", seed,
        ]
    };
    let (a, _) = synth("seed-a.gguf", &flags("7"));
    let (b, _) = synth("seed-b.gguf", &flags("7"));
    let (c, _) = synth("seed-c.gguf", &flags("8"));
    let read = |p: &Path| std::fs::read(p).unwrap();
    assert!(read(&a) == read(&b), "same seed, same file");
    assert!(read(&a) != read(&c), "another seed, other weights");
}

#[test]
fn unknown_shapes_and_quants_are_refused_with_the_known_ones() {
    for (flags, needle) in [
        (["--shape", "gpt-5", "--quant", "Q4_0"], "llama3-8b"),
        (["--shape", "smollm2", "--quant", "IQ2_XXS"], "Q4_K_M"),
    ] {
        let o = bin()
            .arg("synth")
            .args(flags)
            .arg("--out")
            .arg(tmp("refused.gguf"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains(needle), "{}", stderr(&o));
    }
    assert!(!tmp("refused.gguf").exists());
}
