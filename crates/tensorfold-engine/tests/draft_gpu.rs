//! The draft model on the target's CUDA GPU: drafted replies equal serial
//! ones token for token, and the draft really ran there. Without a GPU the
//! test passes vacuously (printing why), as `tensorfold-cuda`'s GPU tests
//! do, unless `TENSORFOLD_REQUIRE_GPU` is set: then a missing GPU fails it,
//! so a GPU machine cannot skip it by accident.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use tensorfold_engine::models::synth::{write_gguf, SynthSpec};
use tensorfold_engine::models::{Arch, Format};
use tensorfold_engine::{
    BackendChoice, DrafterChoice, Engine, GenerateRequest, Prompt, SamplingParams,
};

fn gpu() -> bool {
    let ok = tensorfold_cuda::available();
    if !ok {
        assert!(
            std::env::var_os("TENSORFOLD_REQUIRE_GPU").is_none(),
            "TENSORFOLD_REQUIRE_GPU is set but no CUDA GPU is available"
        );
        eprintln!("no CUDA device: skipped");
    }
    ok
}

/// A random tiny Llama; every seed shares the synthetic tokenizer.
fn tiny(name: &str, seed: u64) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("tf-draft-gpu-{}-{name}.gguf", std::process::id()));
    write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::F32, seed)).unwrap();
    path
}

fn engine(target: &Path, draft: &Path) -> Engine {
    let mut engine = Engine::load(target).unwrap();
    let device = engine.set_backend(BackendChoice::Cuda).unwrap();
    assert!(device.starts_with("cuda"), "{device}");
    engine.set_draft_model(draft).unwrap();
    engine.set_drafter(DrafterChoice::Model).unwrap();
    engine
}

#[test]
fn a_draft_model_on_the_gpu_keeps_replies_serial() {
    if !gpu() {
        return;
    }
    let target = tiny("target", 31);
    // The same weights draft every greedy token right; other weights
    // draft some wrong, so rejected drafts are rolled back.
    for (name, seed) in [("same", 31), ("other", 32)] {
        let draft = tiny(name, seed);
        let engine = engine(&target, &draft);
        std::fs::remove_file(&draft).unwrap();
        let place = engine.draft_backend().unwrap();
        assert!(place.starts_with("cuda"), "the draft runs on {place}");
        let sampled = SamplingParams {
            temperature: 0.8,
            top_k: Some(40),
            top_p: 0.95,
            min_p: 0.0,
            seed: Some(7),
        };
        for (sname, sampling) in [("greedy", SamplingParams::greedy()), ("sampled", sampled)] {
            for p in 0..3u32 {
                let prompt: Vec<u32> = (0..5 + 7 * p).map(|i| (i * 11 + p) % 200 + 1).collect();
                let mut req = GenerateRequest::new(Prompt::Tokens(prompt));
                req.max_tokens = 48;
                req.ignore_eos = true;
                req.sampling = sampling.clone();
                req.draft = false;
                let serial = engine.generate(&req, &mut |_| true).unwrap();
                req.draft = true;
                let drafted = engine.generate(&req, &mut |_| true).unwrap();
                let case = format!("{name}/{sname}/{p}");
                assert_eq!(drafted.tokens, serial.tokens, "{case}");
                assert_eq!(drafted.text, serial.text, "{case}");
                assert_eq!(serial.draft.drafted, 0, "{case}");
                assert!(drafted.draft.drafted > 0, "{case}: nothing drafted");
                if name == "same" && sname == "greedy" {
                    assert!(drafted.draft.accepted > 0, "{case}: nothing accepted");
                }
            }
        }
    }
    std::fs::remove_file(&target).unwrap();
}

/// The draft follows the target when the backend is set after it, and
/// back to the CPU; the budget counts its cache at its own device's bytes
/// per position (the draft here has the target's shape).
#[test]
fn the_draft_moves_with_the_target() {
    if !gpu() {
        return;
    }
    let target = tiny("moving-target", 41);
    let draft = tiny("moving-draft", 42);
    let mut engine = Engine::load(&target).unwrap();
    engine.set_backend(BackendChoice::Cuda).unwrap();
    let gpu_alone = engine.memory();
    engine.set_backend(BackendChoice::Cpu).unwrap();
    let cpu_alone = engine.memory();

    engine.set_draft_model(&draft).unwrap();
    std::fs::remove_file(&target).unwrap();
    std::fs::remove_file(&draft).unwrap();
    assert_eq!(engine.draft_backend().as_deref(), Some("cpu"));
    assert_eq!(engine.memory().per_position, 2 * cpu_alone.per_position);
    let cpu_window = engine.window();

    engine.set_backend(BackendChoice::Cuda).unwrap();
    let place = engine.draft_backend().unwrap();
    assert!(place.starts_with("cuda"), "the draft runs on {place}");
    assert_eq!(engine.memory().per_position, 2 * gpu_alone.per_position);
    assert!(engine.memory().fixed > gpu_alone.fixed);

    engine.set_backend(BackendChoice::Cpu).unwrap();
    assert_eq!(engine.draft_backend().as_deref(), Some("cpu"));
    assert_eq!(engine.window(), cpu_window);
}
