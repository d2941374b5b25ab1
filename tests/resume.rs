//! Resume: a follow-up turn reuses the retained state of the conversation
//! so far and prefills only what is new; its reply equals the same prompt
//! served fresh, byte for byte (greedy and sampled, drafted, concurrent).

use serde_json::json;
use tensorfold_engine::{
    Completion, Engine, GenerateRequest, Prompt, SamplingParams, AUTO_MAX_STREAMS, MIN_REUSE,
};
use tensorfold_models::synth::SynthSpec;
use tensorfold_models::{Arch, Format};
use tensorfold_tests::{registry_model, synth_model};

fn chat(messages: &[serde_json::Value], i: usize, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Chat {
        messages: messages.to_vec(),
        template_vars: Default::default(),
    });
    r.max_tokens = max_tokens;
    r.sampling = if i.is_multiple_of(2) {
        SamplingParams::greedy()
    } else {
        SamplingParams {
            temperature: 0.8,
            top_k: Some(40),
            top_p: 0.95,
            min_p: 0.0,
            seed: Some(i as u64),
        }
    };
    r
}

/// The same prompt served fresh: the tokens the engine makes of it (with
/// the ids it generated kept), prefilled from scratch without drafts.
fn fresh(engine: &Engine, req: &GenerateRequest) -> Completion {
    let tokens = engine
        .prepare(req.clone())
        .unwrap()
        .prompt_tokens()
        .to_vec();
    let mut r = req.clone();
    r.prompt = Prompt::Tokens(tokens);
    r.cache_prompt = false;
    r.draft = false;
    let out = engine.generate(&r, &mut |_| true).unwrap();
    assert_eq!(out.cached_tokens, 0);
    out
}

/// `conversations` chats of `turns` turns, their turns served together in
/// one batch each round of the conversation; every resumed turn equals its
/// fresh reference, and every follow-up turn reused the conversation.
fn conversations(engine: &Engine, conversations: usize, turns: usize, max_tokens: usize) {
    let system = json!({"role": "system", "content": "You are a helpful assistant. Answer briefly and precisely, and use tools when asked."});
    let mut histories: Vec<Vec<serde_json::Value>> = (0..conversations)
        .map(|c| {
            vec![
                system.clone(),
                json!({"role": "user", "content": format!("Question {c}: what is {c} plus {c}?")}),
            ]
        })
        .collect();
    let mut previous_prompt = vec![0; conversations];
    for turn in 0..turns {
        let requests: Vec<GenerateRequest> = histories
            .iter()
            .enumerate()
            .map(|(c, h)| chat(h, c + turn, max_tokens))
            .collect();
        let mut batch = engine.batch();
        let mut ids = Vec::new();
        for r in &requests {
            ids.push(
                batch
                    .admit(engine.prepare(r.clone()).unwrap(), |_: &str| true)
                    .unwrap(),
            );
        }
        let mut outs = vec![None; requests.len()];
        while !batch.is_empty() {
            for (id, done) in batch.step() {
                outs[ids.iter().position(|&x| x == id).unwrap()] =
                    Some(done.expect("stream completes"));
            }
        }
        for (c, (req, out)) in requests.iter().zip(outs).enumerate() {
            let out = out.unwrap();
            let want = fresh(engine, req);
            assert_eq!(out.tokens, want.tokens, "conversation {c}, turn {turn}");
            assert_eq!(out.text, want.text, "conversation {c}, turn {turn}");
            if turn > 0 {
                // At least the whole previous prompt comes from its state.
                assert!(
                    out.cached_tokens >= previous_prompt[c].max(MIN_REUSE),
                    "conversation {c}, turn {turn}: reused {} of {} tokens",
                    out.cached_tokens,
                    previous_prompt[c]
                );
            }
            previous_prompt[c] = out.prompt_tokens;
            histories[c].push(json!({"role": "assistant", "content": out.text}));
            histories[c].push(
                json!({"role": "user", "content": format!("Now tell me more about turn {turn}.")}),
            );
        }
    }
}

#[test]
fn resumed_turns_equal_fresh_ones_on_a_tiny_model() {
    let path = synth_model(
        "resume-tiny",
        &SynthSpec::tiny(Arch::Qwen3, Format::Q8_0, 31),
        true,
    );
    let engine = Engine::load(&path).unwrap();
    conversations(&engine, 6, 4, 24);
}

#[test]
fn resumed_turns_equal_fresh_ones_on_smollm2() {
    let Some(path) = registry_model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let engine = Engine::load(&path).unwrap();
    conversations(&engine, 4, 3, 12);
}

#[test]
fn a_shared_system_prompt_is_reused_across_conversations() {
    let path = synth_model(
        "resume-shared",
        &SynthSpec::tiny(Arch::Llama, Format::F16, 8),
        false,
    );
    let engine = Engine::load(&path).unwrap();
    let system = json!({"role": "system", "content": "A long shared system prompt that many conversations start with."});
    let first = chat(
        &[system.clone(), json!({"role": "user", "content": "hi"})],
        0,
        4,
    );
    let other = chat(
        &[system, json!({"role": "user", "content": "hello there"})],
        1,
        8,
    );
    engine.generate(&first, &mut |_| true).unwrap();
    let out = engine.generate(&other, &mut |_| true).unwrap();
    assert!(out.cached_tokens >= MIN_REUSE, "{}", out.cached_tokens);
    assert_eq!(out.tokens, fresh(&engine, &other).tokens);
    // cache_prompt: false neither reuses nor retains.
    let mut off = other.clone();
    off.cache_prompt = false;
    assert_eq!(
        engine.generate(&off, &mut |_| true).unwrap().cached_tokens,
        0
    );
    // Retention can be turned off.
    let mut engine = engine;
    engine.set_prompt_cache(None, 0);
    assert_eq!(engine.prompt_cache_bytes(), 0);
    assert_eq!(
        engine
            .generate(&other, &mut |_| true)
            .unwrap()
            .cached_tokens,
        0
    );
}

#[test]
fn a_full_server_keeps_every_clients_last_prompt() {
    // As many clients as `--parallel auto` serves at once, each served
    // once: by default every one of their states is retained (memory, not
    // a count, is the bound), so each comes back to a reused prompt.
    let path = synth_model(
        "resume-clients",
        &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 12),
        true,
    );
    let engine = Engine::load(&path).unwrap();
    let request = |client: usize| {
        // A first token of its own: no two clients share a prefix.
        let tokens = (0..24)
            .map(|t| ((client + 1) * 3 + t * 7) as u32 % 250)
            .collect();
        let mut r = GenerateRequest::new(Prompt::Tokens(tokens));
        r.max_tokens = 2;
        r
    };
    for client in 0..AUTO_MAX_STREAMS {
        let out = engine.generate(&request(client), &mut |_| true).unwrap();
        assert_eq!(out.cached_tokens, 0, "client {client} is new");
    }
    for client in 0..AUTO_MAX_STREAMS {
        let out = engine.generate(&request(client), &mut |_| true).unwrap();
        assert_eq!(out.cached_tokens, 23, "client {client} came back");
    }
}

#[test]
fn a_changed_history_falls_back_to_the_common_prefix() {
    let Some(path) = registry_model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let engine = Engine::load(&path).unwrap();
    let question = json!({"role": "user", "content": "Name three colours."});
    let first = engine
        .generate(&chat(std::slice::from_ref(&question), 0, 12), &mut |_| true)
        .unwrap();
    // The client sends back an edited reply: the retained tokens (the ids the
    // engine generated) match the new prompt only up to the edit, at the
    // reply's start.
    let edited = format!("Well, {}", first.text);
    let turn = [
        question,
        json!({"role": "assistant", "content": edited}),
        json!({"role": "user", "content": "And three animals?"}),
    ];
    let req = chat(&turn, 1, 12);
    let out = engine.generate(&req, &mut |_| true).unwrap();
    assert!(
        out.cached_tokens >= first.prompt_tokens,
        "{}",
        out.cached_tokens
    );
    assert!(
        out.cached_tokens < first.prompt_tokens + first.completion_tokens / 2,
        "reuse stops at the edit: {} of {} + {}",
        out.cached_tokens,
        first.prompt_tokens,
        first.completion_tokens
    );
    let want = fresh(&engine, &req);
    assert_eq!(out.tokens, want.tokens);
    assert_eq!(out.text, want.text);
}

#[test]
fn generated_ids_stay_the_truth_when_the_reply_text_comes_back() {
    let Some(path) = registry_model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let engine = Engine::load(&path).unwrap();
    let tokenizer = &engine.bundle().tokenizer;
    let question = json!({"role": "user", "content": "Say hello."});
    let asked = engine
        .prompt_tokens(&chat(std::slice::from_ref(&question), 0, 1).prompt)
        .unwrap();
    // A reply whose first word the engine holds as single-character ids,
    // which re-tokenizing its text would merge.
    let spelled: Vec<u32> = "Hello"
        .chars()
        .map(|c| tokenizer.token_to_id(&c.to_string()).unwrap())
        .collect();
    assert_ne!(engine.encode("Hello").unwrap(), spelled);
    let held = [asked.clone(), spelled].concat();
    let mut first = GenerateRequest::new(Prompt::Tokens(held.clone()));
    first.max_tokens = 8;
    let reply = engine.generate(&first, &mut |_| true).unwrap();
    let content = format!("Hello{}", reply.text);
    let turn = [
        question,
        json!({"role": "assistant", "content": content}),
        json!({"role": "user", "content": "Again, please."}),
    ];
    let req = chat(&turn, 1, 8);
    let prepared = engine.prepare(req.clone()).unwrap();
    assert_eq!(
        &prepared.prompt_tokens()[..held.len()],
        &held[..],
        "the held ids are kept"
    );
    let out = engine.generate(&req, &mut |_| true).unwrap();
    assert!(
        out.cached_tokens >= held.len() + reply.completion_tokens - 1,
        "{} of {} + {}",
        out.cached_tokens,
        held.len(),
        reply.completion_tokens
    );
    // Equal to the same prompt served fresh.
    let mut same = GenerateRequest::new(Prompt::Tokens(prepared.prompt_tokens().to_vec()));
    same.max_tokens = 8;
    same.sampling = req.sampling.clone();
    same.cache_prompt = false;
    let want = engine.generate(&same, &mut |_| true).unwrap();
    assert_eq!(out.tokens, want.tokens);
    assert_eq!(out.text, want.text);
}
