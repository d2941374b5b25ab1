//! Concurrency: streams that share rounds each equal the same request
//! served alone, byte for byte, whatever the others are (prompt lengths
//! across prefill chunks, samplers, drafting, joining mid-way, cancelled).

use std::cell::RefCell;
use std::rc::Rc;
use tensorfold_engine::{
    Completion, DrafterChoice, Engine, FinishReason, GenerateRequest, Prompt, SamplingParams,
    StreamId,
};
use tensorfold_models::synth::SynthSpec;
use tensorfold_models::{Arch, Format};
use tensorfold_tests::{registry_model, synth_model};

fn sampled(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k: Some(40),
        top_p: 0.95,
        min_p: 0.0,
        seed: Some(seed),
    }
}

/// Sixteen requests that differ in everything a stream can differ in.
fn mixed_requests(prompts: &[String], max_tokens: usize) -> Vec<GenerateRequest> {
    (0..16)
        .map(|i| {
            let mut r = GenerateRequest::new(Prompt::Text(prompts[i % prompts.len()].clone()));
            r.max_tokens = max_tokens / 2 + (i * 7) % max_tokens;
            r.ignore_eos = i % 4 != 3;
            r.draft = i % 3 != 2;
            r.sampling = match i % 4 {
                0 => SamplingParams::greedy(),
                1 => sampled(0.8, i as u64),
                2 => sampled(1.3, 7),
                _ => SamplingParams {
                    min_p: 0.05,
                    ..sampled(0.6, 99)
                },
            };
            if i == 5 {
                r.stop = vec!["e".into()];
            }
            if i == 6 {
                r.logprobs = Some(3);
            }
            r
        })
        .collect()
}

/// The serial reference: alone, no drafts, prefilled from scratch.
fn solo(engine: &Engine, req: &GenerateRequest) -> Completion {
    let mut serial = req.clone();
    serial.draft = false;
    serial.cache_prompt = false;
    engine.generate(&serial, &mut |_| true).unwrap()
}

/// Runs `requests` in one batch: half join at once, the rest one per round
/// after that; stream `cancel_at.0` is cancelled after `cancel_at.1` rounds.
/// Returns each request's completion and streamed text.
fn together(
    engine: &Engine,
    requests: &[GenerateRequest],
    cancel_at: (usize, usize),
) -> Vec<(Completion, String)> {
    let mut batch = engine.batch();
    let texts: Vec<Rc<RefCell<String>>> = requests.iter().map(|_| Rc::default()).collect();
    let mut ids: Vec<Option<StreamId>> = vec![None; requests.len()];
    let mut results: Vec<Option<Completion>> = vec![None; requests.len()];
    let mut next = 0;
    let mut round = 0;
    while results.iter().any(Option::is_none) {
        let join = if round == 0 { requests.len() / 2 } else { 1 };
        for _ in 0..join {
            if next < requests.len() {
                let text = texts[next].clone();
                let prepared = engine.prepare(requests[next].clone()).unwrap();
                let id = batch
                    .admit(prepared, move |d: &str| {
                        text.borrow_mut().push_str(d);
                        true
                    })
                    .unwrap();
                ids[next] = Some(id);
                next += 1;
            }
        }
        if round == cancel_at.1 {
            batch.cancel(ids[cancel_at.0].expect("joined by then"));
        }
        for (id, done) in batch.step() {
            let i = ids.iter().position(|&x| x == Some(id)).unwrap();
            results[i] = Some(done.expect("stream completes"));
        }
        round += 1;
    }
    assert_eq!(batch.reserved_bytes(), 0, "every reservation is returned");
    assert_eq!(batch.cache_bytes(), 0);
    results
        .into_iter()
        .zip(texts)
        .map(|(c, t)| (c.unwrap(), t.borrow().clone()))
        .collect()
}

fn check_against_solo(engine: &Engine, requests: &[GenerateRequest], cancel: (usize, usize)) {
    let outs = together(engine, requests, cancel);
    for (i, (req, (got, streamed))) in requests.iter().zip(&outs).enumerate() {
        let want = solo(engine, req);
        if i == cancel.0 {
            assert_eq!(got.finish_reason, FinishReason::Cancelled);
            assert!(
                want.tokens.starts_with(&got.tokens),
                "a cancelled stream's tokens are a prefix of its solo reply"
            );
            continue;
        }
        assert_eq!(got.tokens, want.tokens, "stream {i}: tokens");
        assert_eq!(got.text, want.text, "stream {i}: text");
        assert_eq!(*streamed, got.text, "stream {i}: streamed text");
        assert_eq!(got.finish_reason, want.finish_reason, "stream {i}");
        let lp = |c: &Completion| {
            c.logprobs
                .iter()
                .map(|l| (l.token, l.logprob.to_bits()))
                .collect::<Vec<_>>()
        };
        assert_eq!(lp(got), lp(&want), "stream {i}: logprobs");
    }
}

#[test]
fn sixteen_mixed_streams_equal_their_solo_runs_on_a_tiny_model() {
    let mut spec = SynthSpec::tiny(Arch::Qwen2, Format::Q4_0, 21);
    spec.max_positions = 2048;
    let path = synth_model("concurrent-tiny", &spec, true);
    let mut engine = Engine::load(&path).unwrap();
    engine.set_drafter(DrafterChoice::Auto).unwrap();
    // Prompts from a few tokens to past two prefill chunks.
    let prompts: Vec<String> = [3usize, 40, 300, 600, 17]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|i| ["ab", "cd ", "ab", "x"][i % 4])
                .collect::<String>()
        })
        .collect();
    check_against_solo(&engine, &mixed_requests(&prompts, 40), (9, 4));
}

#[test]
fn sixteen_mixed_streams_equal_their_solo_runs_on_smollm2() {
    let Some(path) = registry_model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let engine = Engine::load(&path).unwrap();
    let code = "def add(a, b):\n    return a + b\n\n# Repeat the function above exactly:\n";
    let prompts = vec![
        "The capital of France is".to_string(),
        code.to_string(),
        "Once upon a time, in a small village,".to_string(),
        code.repeat(12),
    ];
    check_against_solo(&engine, &mixed_requests(&prompts, 16), (4, 3));
}

#[test]
fn streams_past_the_parallel_limit_wait_their_turn() {
    let path = synth_model(
        "concurrent-limit",
        &SynthSpec::tiny(Arch::Llama, Format::F16, 3),
        false,
    );
    let mut engine = Engine::load(&path).unwrap();
    engine
        .set_parallel(tensorfold_engine::Parallel::Fixed(2))
        .unwrap();
    let mut req = GenerateRequest::new(Prompt::Text("hello".into()));
    req.max_tokens = 5;
    req.ignore_eos = true;
    let mut batch = engine.batch();
    for _ in 0..2 {
        batch
            .admit(engine.prepare(req.clone()).unwrap(), |_: &str| true)
            .unwrap();
    }
    let third = engine.prepare(req.clone()).unwrap();
    assert!(!batch.fits(&third));
    assert!(matches!(
        batch.admit(third.clone(), |_: &str| true),
        Err(tensorfold_engine::EngineError::Busy)
    ));
    while !batch.is_empty() {
        batch.step();
    }
    assert!(batch.fits(&third));
}
