//! Serial generation through the engine API: seeds, stops, EOS, limits,
//! streaming.

use tensorfold_engine::{Engine, FinishReason, GenerateRequest, Prompt, SamplingParams};
use tensorfold_models::synth::SynthSpec;
use tensorfold_models::{Arch, Format};
use tensorfold_tests::{registry_model, synth_model};

fn tiny() -> Engine {
    let path = synth_model(
        "gen-tiny",
        &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 5),
        true,
    );
    Engine::load(&path).unwrap()
}

fn sampled(seed: Option<u64>) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: Some(40),
        top_p: 0.95,
        min_p: 0.01,
        seed,
    }
}

fn run(engine: &Engine, req: &GenerateRequest) -> (tensorfold_engine::Completion, String) {
    let mut streamed = String::new();
    let out = engine.generate(req, &mut |d| {
        streamed.push_str(d);
        true
    });
    (out.unwrap(), streamed)
}

#[test]
fn same_seed_same_bytes_and_seeds_matter() {
    let e = tiny();
    let mut req = GenerateRequest::new(Prompt::Text("Once upon a time".into()));
    req.max_tokens = 40;
    req.ignore_eos = true;
    req.sampling = sampled(Some(1));
    let (a, _) = run(&e, &req);
    let (b, _) = run(&e, &req);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.text, b.text);
    req.sampling = sampled(Some(2));
    let (c, _) = run(&e, &req);
    assert_ne!(a.tokens, c.tokens, "another seed draws another reply");
    req.sampling = sampled(None);
    let (d1, _) = run(&e, &req);
    let (d2, _) = run(&e, &req);
    assert_eq!(d1.tokens, d2.tokens, "no seed: derived from the prompt");
}

#[test]
fn streamed_deltas_concatenate_to_the_reply() {
    let e = tiny();
    let mut req = GenerateRequest::new(Prompt::Text("stream me".into()));
    req.max_tokens = 60;
    req.ignore_eos = true;
    req.sampling = sampled(Some(9));
    let (out, streamed) = run(&e, &req);
    assert_eq!(streamed, out.text);
    assert_eq!(out.completion_tokens, 60);
    assert_eq!(out.finish_reason, FinishReason::Length);
}

#[test]
fn stop_strings_end_the_reply_and_are_removed() {
    let e = tiny();
    let mut req = GenerateRequest::new(Prompt::Text("abc".into()));
    req.max_tokens = 60;
    req.ignore_eos = true;
    req.sampling = sampled(Some(4));
    let (full, _) = run(&e, &req);
    // Use a piece of the reply as the stop string.
    let chars: Vec<char> = full.text.chars().collect();
    let stop: String = chars[10..12].iter().collect();
    let cut = full.text.find(&stop).unwrap();
    req.stop = vec![stop.clone()];
    let (out, streamed) = run(&e, &req);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.text, full.text[..cut]);
    assert_eq!(streamed, out.text);
}

#[test]
fn eos_ends_unless_ignored() {
    let Some(p) = registry_model("mathformer/addformer") else {
        return;
    };
    let e = Engine::load(&p).unwrap();
    let mut req = GenerateRequest::new(Prompt::Text("3+4=".into()));
    req.max_tokens = 5;
    let (out, _) = run(&e, &req);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.completion_tokens, 1);
    req.ignore_eos = true;
    let (out, _) = run(&e, &req);
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.completion_tokens, 5);
}

#[test]
fn cancelling_stops_generation() {
    let e = tiny();
    let mut req = GenerateRequest::new(Prompt::Text("go".into()));
    req.max_tokens = 100;
    req.ignore_eos = true;
    let mut seen = 0;
    let out = e
        .generate(&req, &mut |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    assert!(out.completion_tokens < 100);
}

#[test]
fn prompts_past_the_window_are_refused() {
    let e = tiny();
    let req = GenerateRequest::new(Prompt::Tokens(vec![5; 600]));
    let err = e.generate(&req, &mut |_| true).unwrap_err();
    assert!(
        matches!(
            err,
            tensorfold_engine::EngineError::ContextLength {
                prompt: 600,
                window: 512
            }
        ),
        "{err}"
    );
}

#[test]
fn smollm2_answers_paris() {
    let Some(p) = registry_model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let e = Engine::load(&p).unwrap();
    let mut req = GenerateRequest::new(Prompt::chat_user("Name the capital of France."));
    req.max_tokens = 24;
    let (out, _) = run(&e, &req);
    assert!(out.text.contains("Paris"), "{}", out.text);
}
