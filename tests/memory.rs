//! The memory budget: windows that fit, refusals with what would fit,
//! admission that never passes the budget, and memory freed on cancel.

use tensorfold_engine::{Engine, EngineError, FinishReason, GenerateRequest, Prompt};
use tensorfold_kv::GROWTH;
use tensorfold_models::synth::SynthSpec;
use tensorfold_models::{Arch, Format};
use tensorfold_tests::synth_model;

fn engine() -> Engine {
    let mut spec = SynthSpec::tiny(Arch::Llama, Format::Q8_0, 11);
    spec.max_positions = 4096;
    Engine::load(&synth_model("memory-tiny", &spec, true)).unwrap()
}

/// A limit whose caches hold exactly `positions` positions of one stream
/// (plus its growth slack) beyond the engine's fixed costs.
fn limit_for(engine: &mut Engine, positions: usize) -> usize {
    engine.set_memory_limit(Some(usize::MAX / 2)).unwrap();
    let m = engine.memory();
    m.fixed + m.per_position * (positions + GROWTH)
}

fn request(text: &str, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Text(text.into()));
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r
}

#[test]
fn an_omitted_context_is_the_largest_window_that_fits() {
    let mut e = engine();
    assert_eq!(
        e.set_memory_limit(Some(usize::MAX / 2)).unwrap(),
        4096,
        "ample memory: the model's own window"
    );
    let limit = limit_for(&mut e, 1000);
    let window = e.set_memory_limit(Some(limit)).unwrap();
    assert_eq!(window, 1000);
    let m = e.memory();
    assert!(m.fixed + m.stream_bytes(window) <= m.limit);
    assert!(m.fixed + m.stream_bytes(window + 1) > m.limit);
    // A prompt past the window is refused, one inside it runs.
    let long = "ab".repeat(window);
    match e.prepare(request(&long, 4)) {
        Err(EngineError::ContextLength { window: w, .. }) => assert_eq!(w, window),
        other => panic!("expected a context-length error, got {other:?}"),
    }
    assert!(e.prepare(request("ab", 4)).is_ok());
}

#[test]
fn a_context_that_cannot_fit_is_refused_with_what_would() {
    let mut e = engine();
    let limit = limit_for(&mut e, 500);
    e.set_memory_limit(Some(limit)).unwrap();
    let err = e.set_context(Some(4000)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("4000") && msg.contains("at most"), "{msg}");
    assert!(
        e.set_context(Some(5000)).is_err(),
        "past the model's window"
    );
    assert_eq!(e.set_context(Some(200)).unwrap(), 200);
    let err = e.set_memory_limit(Some(1)).unwrap_err();
    assert!(err.to_string().contains("fixed costs"), "{err}");
}

#[test]
fn admission_waits_for_memory_and_cancellation_frees_it() {
    let mut e = engine();
    // Room for two streams of 300 positions, not three.
    let limit = limit_for(&mut e, 2 * 300 + GROWTH);
    e.set_memory_limit(Some(limit)).unwrap();
    e.set_context(Some(300)).unwrap();
    let prepared: Vec<_> = (0..3)
        .map(|i| e.prepare(request(&format!("stream {i}"), 300)).unwrap())
        .collect();
    let mut batch = e.batch();
    let a = batch.admit(prepared[0].clone(), |_: &str| true).unwrap();
    batch.admit(prepared[1].clone(), |_: &str| true).unwrap();
    assert!(
        !batch.fits(&prepared[2]),
        "a third stream would pass the budget"
    );
    assert!(matches!(
        batch.admit(prepared[2].clone(), |_: &str| true),
        Err(EngineError::Busy)
    ));
    assert!(batch.reserved_bytes() <= e.memory().for_caches());
    for _ in 0..3 {
        assert!(batch.step().is_empty());
    }
    assert!(batch.cache_bytes() > 0);
    let before = batch.cache_bytes();
    batch.cancel(a);
    let done = batch.step();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, a);
    assert_eq!(
        done[0].1.as_ref().unwrap().finish_reason,
        FinishReason::Cancelled
    );
    assert!(batch.cache_bytes() < before, "the cancelled cache is freed");
    assert!(batch.fits(&prepared[2]), "its reservation is returned");
    batch.admit(prepared[2].clone(), |_: &str| true).unwrap();
    while !batch.is_empty() {
        batch.step();
    }
    assert_eq!(batch.reserved_bytes(), 0);
}
