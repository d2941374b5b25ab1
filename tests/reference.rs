//! Greedy tokens of the engine equal an independent f64 reference forward
//! on the same weights: real models (mathformer, SmolLM2) and random ones.

use tensorfold_engine::{Engine, GenerateRequest, Prompt};
use tensorfold_models::synth::SynthSpec;
use tensorfold_models::{Arch, Format};
use tensorfold_tests::reference::Reference;
use tensorfold_tests::{registry_model, synth_model};

fn engine_greedy(engine: &Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut req = GenerateRequest::new(Prompt::Tokens(prompt.to_vec()));
    req.max_tokens = n;
    req.ignore_eos = true;
    engine.generate(&req, &mut |_| true).unwrap().tokens
}

fn check(path: &std::path::Path, prompt_text: &str, n: usize) {
    let engine = Engine::load(path).unwrap();
    let prompt = engine.encode(prompt_text).unwrap();
    let reference = Reference::load(path, engine.bundle().model.config.clone());
    assert_eq!(
        engine_greedy(&engine, &prompt, n),
        reference.greedy(&prompt, n),
        "{}",
        path.display()
    );
}

#[test]
fn mathformer_matches_reference() {
    for op in ["add", "sub", "mul", "div"] {
        let Some(p) = registry_model(&format!("mathformer/{op}former")) else {
            return;
        };
        check(&p, "3+4=", 3);
        check(&p, "81-27=", 3);
    }
}

#[test]
fn mathformer_adds() {
    let Some(p) = registry_model("mathformer/addformer") else {
        return;
    };
    let engine = Engine::load(&p).unwrap();
    let mut req = GenerateRequest::new(Prompt::Text("3+4=".into()));
    req.max_tokens = 8;
    assert_eq!(engine.generate(&req, &mut |_| true).unwrap().text, "7");
}

#[test]
fn smollm2_first_tokens_match_reference() {
    let Some(p) = registry_model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    check(&p, "The capital of France is", 3);
}

#[test]
fn random_models_match_reference_in_every_family_and_format() {
    let cases = [
        (Arch::Llama, Format::F32, false),
        (Arch::Qwen2, Format::Bf16, false),
        (Arch::Qwen3, Format::F16, false),
        (Arch::Llama, Format::Q8_0, true),
        (Arch::Qwen2, Format::Q4K, true),
        (Arch::Qwen3, Format::Q6K, true),
    ];
    for (i, (arch, format, gguf)) in cases.into_iter().enumerate() {
        let spec = SynthSpec::tiny(arch, format, 11 + i as u64);
        let path = synth_model(&format!("ref-{i}-{}-{format}", arch.name()), &spec, gguf);
        check(&path, "hello world, tiny model", 6);
    }
}
