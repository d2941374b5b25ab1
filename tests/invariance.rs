//! The row invariant, end to end: a position's logits are the same bits
//! whether it is decoded alone, verified among k rows, or prefilled inside
//! a chunk of any size and offset.

use proptest::prelude::*;
use tensorfold_kv::KvCache;
use tensorfold_models::synth::SynthSpec;
use tensorfold_models::{Arch, Format, Logits, Model};
use tensorfold_tests::synth_model;

fn model(arch: Arch, format: Format, seed: u64) -> Model {
    let gguf =
        !matches!(format, Format::F32 | Format::F16 | Format::Bf16) || seed.is_multiple_of(2);
    let spec = SynthSpec::tiny(arch, format, seed);
    let path = synth_model(&format!("inv-{}-{format}-{seed}", arch.name()), &spec, gguf);
    tensorfold_models::load(&path).unwrap().model
}

/// Logits of every position, computed with the sequence cut into `chunks`.
fn logits_by_chunks(m: &Model, tokens: &[u32], chunks: &[usize]) -> Vec<u32> {
    let mut cache = KvCache::new(m.config.kv_shape());
    let mut out = Vec::new();
    let mut at = 0;
    let mut sizes = chunks.iter().copied().cycle();
    while at < tokens.len() {
        let n = sizes.next().unwrap().clamp(1, tokens.len() - at);
        out.extend(
            m.forward(&tokens[at..at + n], &mut cache, Logits::All)
                .iter()
                .map(|x| x.to_bits()),
        );
        at += n;
    }
    out
}

const FORMATS: [Format; 6] = [
    Format::F32,
    Format::Bf16,
    Format::Q4_1,
    Format::Q8_0,
    Format::Q4K,
    Format::Q6K,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn logits_do_not_depend_on_chunking(
        arch in proptest::sample::select(vec![
            Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Qwen3Moe, Arch::Mistral, Arch::Phi3,
            Arch::Gemma3, Arch::Gemma2, Arch::Mixtral,
        ]),
        format in proptest::sample::select(FORMATS.to_vec()),
        seed in 0u64..4,
        tokens in proptest::collection::vec(0u32..259, 2..40),
        chunks in proptest::collection::vec(1usize..12, 1..5),
    ) {
        let m = model(arch, format, seed);
        let serial = logits_by_chunks(&m, &tokens, &[1]);
        let chunked = logits_by_chunks(&m, &tokens, &chunks);
        prop_assert_eq!(serial, chunked);
    }
}

#[test]
fn a_verify_window_after_rollback_equals_serial() {
    let m = model(Arch::Llama, Format::Q4_1, 3);
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 % 250) as u32).collect();
    let serial = logits_by_chunks(&m, &tokens, &[1]);
    let v = m.config.vocab_size;
    // Prefill 10, verify a window of 6 wrong drafts, roll back, verify again.
    let mut cache = KvCache::new(m.config.kv_shape());
    m.forward(&tokens[..10], &mut cache, Logits::None);
    m.forward(&[1, 2, 3, 4, 5, 6], &mut cache, Logits::All);
    cache.truncate(10);
    let window = m.forward(&tokens[10..16], &mut cache, Logits::All);
    let bits: Vec<u32> = window.iter().map(|x| x.to_bits()).collect();
    assert_eq!(bits, serial[10 * v..16 * v]);
}
