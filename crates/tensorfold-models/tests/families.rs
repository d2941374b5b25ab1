//! Every family's plan runs on random weights: both layouts load to the
//! same forward, and the row invariant holds (chunked prefill = serial
//! decode, batched = solo) through its parts (experts, windows, caps).

use std::path::PathBuf;
use tensorfold_kv::KvCache;
use tensorfold_models::synth::{write_gguf, write_hf, SynthSpec};
use tensorfold_models::{load, Arch, Format, Logits, Model, Seq};

const NEW: [Arch; 6] = [
    Arch::Qwen3Moe,
    Arch::Mistral,
    Arch::Phi3,
    Arch::Gemma3,
    Arch::Gemma2,
    Arch::Mixtral,
];

/// A fresh folder per call: tests run in parallel and may write the same
/// model at once.
fn dir(name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("tf-families-{}-{call}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn model(arch: Arch, format: Format, gguf: bool) -> Model {
    let spec = SynthSpec::tiny(arch, format, 7);
    let name = format!("{}-{format}-{gguf}", arch.name());
    let path = if gguf {
        let p = dir(&name).join("m.gguf");
        write_gguf(&p, &spec).unwrap();
        p
    } else {
        let p = dir(&name);
        write_hf(&p, &spec).unwrap();
        p
    };
    load(&path).unwrap().model
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + salt * 11) % 250).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every position's logits, the sequence fed in chunks of the given sizes.
fn by_chunks(m: &Model, t: &[u32], chunks: &[usize]) -> Vec<u32> {
    let mut cache = KvCache::new(m.config.kv_shape());
    let mut out = Vec::new();
    let (mut at, mut sizes) = (0, chunks.iter().copied().cycle());
    while at < t.len() {
        let n = sizes.next().unwrap().min(t.len() - at);
        out.extend(bits(&m.forward(&t[at..at + n], &mut cache, Logits::All)));
        at += n;
    }
    out
}

#[test]
fn chunked_prefill_equals_serial_decode() {
    for arch in NEW {
        let layouts = [
            (Format::Bf16, false),
            (Format::F32, true),
            (Format::Q8_0, true),
            (Format::Q4K, true),
        ];
        for (format, gguf) in layouts {
            let m = model(arch, format, gguf);
            // Longer than the tiny windows (8), so sliding layers slide.
            let t = tokens(30, 1);
            let serial = by_chunks(&m, &t, &[1]);
            assert!(serial.iter().all(|b| f32::from_bits(*b).is_finite()));
            assert_eq!(
                serial,
                by_chunks(&m, &t, &[7, 3, 11]),
                "{arch:?} {format} gguf: {gguf}"
            );
        }
    }
}

#[test]
fn batched_rows_equal_each_sequence_alone() {
    for arch in NEW {
        let m = model(arch, Format::Q8_0, true);
        let (a, b) = (tokens(19, 2), tokens(12, 3));
        let alone = |t: &[u32]| {
            let mut cache = KvCache::new(m.config.kv_shape());
            bits(&m.forward(t, &mut cache, Logits::All))
        };
        let (mut ca, mut cb) = (
            KvCache::new(m.config.kv_shape()),
            KvCache::new(m.config.kv_shape()),
        );
        let mut seqs = [
            Seq {
                tokens: &a,
                cache: &mut ca,
                logits: Logits::All,
            },
            Seq {
                tokens: &b,
                cache: &mut cb,
                logits: Logits::All,
            },
        ];
        let out = m.forward_batch(&mut seqs);
        assert_eq!(bits(&out[0]), alone(&a), "{arch:?}");
        assert_eq!(bits(&out[1]), alone(&b), "{arch:?}");
    }
}

#[test]
fn both_layouts_load_the_same_forward() {
    // Mistral's and Mixtral's GGUF files are `llama`, whose rows the
    // converter permutes for interleaved rotation: not the same weights.
    for arch in [Arch::Qwen3Moe, Arch::Phi3, Arch::Gemma3, Arch::Gemma2] {
        let (g, h) = (
            model(arch, Format::F32, true),
            model(arch, Format::F32, false),
        );
        let t = tokens(20, 4);
        assert_eq!(
            by_chunks(&g, &t, &[20]),
            by_chunks(&h, &t, &[20]),
            "{arch:?}"
        );
    }
}

#[test]
fn each_part_of_the_plan_changes_the_logits() {
    // A plan part that were silently ignored would give the baseline's logits.
    let t = tokens(24, 5);
    let base = by_chunks(&model(Arch::Qwen3, Format::F32, true), &t, &[24]);
    for arch in [Arch::Qwen3Moe, Arch::Gemma2, Arch::Gemma3] {
        let m = model(arch, Format::F32, true);
        assert_ne!(by_chunks(&m, &t, &[24]), base, "{arch:?}");
    }
    // A window of 8: the first 8 positions see all their keys, so they
    // agree with a full-attention copy of the model; later ones do not.
    let mut full = model(Arch::Gemma2, Format::F32, true);
    let windowed = by_chunks(&full, &t, &[24]);
    full.config.plan.sliding_window = None;
    let global = by_chunks(&full, &t, &[24]);
    let v = full.config.vocab_size;
    assert_eq!(windowed[..8 * v], global[..8 * v]);
    assert_ne!(windowed[8 * v..], global[8 * v..]);
}
