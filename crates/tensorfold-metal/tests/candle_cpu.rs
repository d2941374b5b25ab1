//! The Metal backend's forward, run on candle's CPU device: rows do not
//! depend on the call (chunking, batching, rollback), and the logits follow
//! the CPU backend's closely enough to pick the same tokens.

use candle_core::Device;
use tensorfold_kv::KvCache;
use tensorfold_metal::MetalModel;
use tensorfold_models::synth::{self, SynthSpec};
use tensorfold_models::{Arch, Format, Logits, Model, Seq};

fn tiny(arch: Arch, format: Format, seed: u64) -> Model {
    let path = std::env::temp_dir().join(format!(
        "tensorfold-metal-{}-{arch:?}-{seed}.gguf",
        std::process::id()
    ));
    synth::write_gguf(&path, &SynthSpec::tiny(arch, format, seed)).unwrap();
    let model = tensorfold_models::load(&path).unwrap().model;
    let _ = std::fs::remove_file(&path);
    model
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
}

#[test]
fn rows_do_not_depend_on_the_call() {
    for (arch, format) in [
        (Arch::Llama, Format::Q4_1),
        (Arch::Qwen3, Format::Q8_0),
        (Arch::Qwen2, Format::F32),
    ] {
        let model = tiny(arch, format, 5);
        let gpu = MetalModel::upload_to(&model, Device::Cpu).unwrap();
        let vocab = model.config.vocab_size;
        let tokens: Vec<u32> = (0..12u32).map(|i| (i * 37 + 3) % vocab as u32).collect();

        // Serial: one token per call.
        let mut serial = gpu.new_cache();
        let mut one_by_one = Vec::new();
        for t in &tokens {
            one_by_one.extend(gpu.forward(&[*t], &mut serial, Logits::Last).unwrap());
        }
        // One chunk, beside another sequence, after a rolled-back draft.
        let mut a = gpu.new_cache();
        gpu.forward(&tokens[..3], &mut a, Logits::None).unwrap();
        gpu.forward(&[9, 9, 9], &mut a, Logits::All).unwrap();
        a.truncate(3);
        let mut b = gpu.new_cache();
        let other = [5u32, 6, 7, 8];
        let mut seqs = [
            Seq {
                tokens: &tokens[3..],
                cache: &mut a,
                logits: Logits::All,
            },
            Seq {
                tokens: &other,
                cache: &mut b,
                logits: Logits::All,
            },
        ];
        let out = gpu.forward_batch(&mut seqs).unwrap();
        assert_eq!(out[0], one_by_one[3 * vocab..], "{arch:?} {format}");
        assert_eq!(a.len(), tokens.len());

        // Close to the CPU backend's float products (its integer ones
        // quantize the inputs to 8 bits; its keys and values are f16, these
        // f32), and the same greedy picks.
        tensorfold_models::set_float_products(true);
        let mut cpu = KvCache::new(model.config.kv_shape());
        let reference = model.forward(&tokens, &mut cpu, Logits::All);
        for (r, (x, y)) in one_by_one
            .chunks(vocab)
            .zip(reference.chunks(vocab))
            .enumerate()
        {
            let diff = x
                .iter()
                .zip(y)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let scale = y.iter().map(|v| v.abs()).fold(0f32, f32::max);
            assert!(
                diff <= 5e-3 * scale.max(1.0),
                "{arch:?} row {r}: {diff} of {scale}"
            );
            assert_eq!(argmax(x), argmax(y), "{arch:?} row {r}");
        }
    }
}

#[test]
fn a_prefix_copy_continues_like_the_original() {
    let model = tiny(Arch::Llama, Format::Q8_0, 9);
    let gpu = MetalModel::upload_to(&model, Device::Cpu).unwrap();
    let mut full = gpu.new_cache();
    gpu.forward(&[1, 2, 3, 4, 5], &mut full, Logits::None)
        .unwrap();
    let mut copy = full.clone_prefix(3);
    assert_eq!(copy.len(), 3);
    let mut fresh = gpu.new_cache();
    gpu.forward(&[1, 2, 3], &mut fresh, Logits::None).unwrap();
    assert_eq!(
        gpu.forward(&[7], &mut copy, Logits::Last).unwrap(),
        gpu.forward(&[7], &mut fresh, Logits::Last).unwrap()
    );
}

#[test]
fn without_macos_no_metal_device_is_offered() {
    if !cfg!(target_os = "macos") {
        assert!(!tensorfold_metal::available());
        assert!(MetalModel::upload(&tiny(Arch::Llama, Format::F32, 1)).is_err());
    }
}

#[test]
fn a_plan_with_parts_this_forward_lacks_is_refused_by_name() {
    let err = MetalModel::upload_to(&tiny(Arch::Qwen3Moe, Format::F32, 2), Device::Cpu)
        .err()
        .expect("experts are refused");
    assert!(err.to_string().contains("mixture of experts"), "{err}");
    // Phi-3's fused weights are split at load: its plan is the baseline.
    assert!(MetalModel::upload_to(&tiny(Arch::Phi3, Format::F32, 2), Device::Cpu).is_ok());
}
