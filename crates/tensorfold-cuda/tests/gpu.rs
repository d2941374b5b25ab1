//! GPU forward tests: bitwise invariance to chunking, batch composition and
//! rollback for random models in every supported format, and closeness to
//! the CPU forward. They need a CUDA device; without one they pass vacuously
//! (printing why), so a GPU-less CI stays green.
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use tensorfold_cuda::{CudaKv, CudaModel, FewRowGrid, MatmulKernels};
use tensorfold_models::synth::{write_gguf, write_hf, SynthSpec};
use tensorfold_models::{Arch, Format, Logits, Model, Seq};
use tensorfold_quant::Encoding;

fn gpu() -> bool {
    let ok = tensorfold_cuda::available();
    if !ok {
        eprintln!("no CUDA device: skipped");
    }
    ok
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tf-cuda-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every format the kernels run, each in the family it is tested with, and
/// whether it goes through the Hugging Face layout.
fn cases() -> Vec<(Arch, Format, bool)> {
    vec![
        (Arch::Llama, Format::F32, false),
        (Arch::Qwen2, Format::F16, false),
        (Arch::Qwen3, Format::Bf16, false),
        (Arch::Llama, Format::Q4_0, false),
        (Arch::Qwen2, Format::Q4_1, false),
        (Arch::Qwen3, Format::Q5_0, false),
        (Arch::Llama, Format::Q8_0, false),
        (Arch::Qwen2, Format::Q4K, false),
        (Arch::Llama, Format::Q6K, false),
        (Arch::Qwen3, Format::Q4K, false),
        (Arch::Llama, Format::Bf16, true),
        (Arch::Qwen2, Format::F32, true),
        // The families beyond the baseline: sliding windows, soft-caps,
        // GELU, post norms, scaled embeddings, a local rotary base and
        // mixtures of experts.
        (Arch::Mistral, Format::Q4_0, false),
        (Arch::Phi3, Format::Q8_0, false),
        (Arch::Gemma2, Format::Q4_1, false),
        (Arch::Gemma3, Format::Q4K, false),
        (Arch::Qwen3Moe, Format::Q5_0, false),
        (Arch::Mixtral, Format::Q6K, false),
        (Arch::Gemma2, Format::F32, true),
        (Arch::Qwen3Moe, Format::Bf16, true),
    ]
}

fn load(arch: Arch, format: Format, hf: bool, seed: u64) -> Model {
    let spec = SynthSpec::tiny(arch, format, seed);
    let name = format!("{}-{}-{}", arch.name(), format.name(), hf);
    let path = if hf {
        let d = tmp(&name);
        write_hf(&d, &spec).unwrap();
        d
    } else {
        let p = tmp(&name).join("m.gguf");
        write_gguf(&p, &spec).unwrap();
        p
    };
    tensorfold_models::load(&path).unwrap().model
}

fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 256) as u32
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits of every position, one token per forward: the reference.
fn serial(g: &CudaModel, toks: &[u32]) -> Vec<Vec<f32>> {
    let mut kv = g.new_cache();
    toks.iter()
        .map(|t| g.forward(&[*t], &mut kv, Logits::Last).unwrap())
        .collect()
}

/// Logits of every position, in chunks of the given sizes (cycled).
fn chunked(g: &CudaModel, kv: &mut CudaKv, toks: &[u32], sizes: &[usize]) -> Vec<Vec<f32>> {
    let vocab = g.config().vocab_size;
    let mut out = Vec::new();
    let (mut at, mut i) = (kv.len(), 0);
    while at < toks.len() {
        let n = sizes[i % sizes.len()].min(toks.len() - at);
        let l = g.forward(&toks[at..at + n], kv, Logits::All).unwrap();
        out.extend(l.chunks_exact(vocab).map(|r| r.to_vec()));
        at += n;
        i += 1;
    }
    out
}

#[test]
fn logits_do_not_depend_on_chunking_batching_or_rollback() {
    if !gpu() {
        return;
    }
    for (ci, (arch, format, hf)) in cases().into_iter().enumerate() {
        let model = load(arch, format, hf, 11 + ci as u64);
        for kernels in [MatmulKernels::TensorCores, MatmulKernels::Fma] {
            let g = CudaModel::upload_with(&model, 0, kernels).unwrap();
            let what = format!("{} {} hf={hf} {kernels:?}", arch.name(), format.name());
            assert_invariant(&g, &what, ci as u64);
        }
    }
}

#[test]
fn few_row_grids_keep_the_bits() {
    if !gpu() {
        return;
    }
    // Blocks that walk several weight blocks (one block walking them all,
    // an uneven split, a wave) against a block per weight block, for
    // single rows and every few-row tile.
    for (ci, format) in [Format::Q4K, Format::Q6K, Format::Q4_1]
        .into_iter()
        .enumerate()
    {
        let model = load(Arch::Llama, format, false, 41 + ci as u64);
        let mut g = CudaModel::upload_with(&model, 0, MatmulKernels::TensorCores).unwrap();
        let toks = tokens(120, 7 + ci as u64);
        let run = |g: &CudaModel| {
            let mut kv = g.new_cache();
            let mut out = serial(g, &toks[..40]);
            chunked(g, &mut kv, &toks[..40], &[40]);
            out.extend(chunked(g, &mut kv, &toks, &[3, 9, 17, 32]));
            out
        };
        let reference = run(&g);
        for grid in [
            FewRowGrid::Blocks(1),
            FewRowGrid::Blocks(3),
            FewRowGrid::Waves(1),
        ] {
            g.set_few_row_grid(grid);
            let got = run(&g);
            assert_eq!(got.len(), reference.len());
            for (p, (a, b)) in got.iter().zip(&reference).enumerate() {
                assert_eq!(bits(a), bits(b), "{} {grid:?}: row {p}", format.name());
            }
        }
    }
}

#[test]
fn every_many_row_tile_keeps_the_bits() {
    if !gpu() {
        return;
    }
    // Each quantized format, in a tiny model and in one whose down
    // projection has 9 segments (the last of one unit where the format's
    // blocks allow): prefill chunks of 256 and of 300 rows (input tiles
    // cut short) under every many-row tile against one token a forward.
    for (ci, format) in [
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q8_0,
        Format::Q4K,
        Format::Q6K,
    ]
    .into_iter()
    .enumerate()
    {
        let wide = SynthSpec {
            hidden_size: 256,
            intermediate_size: if format.block_elems() > 32 {
                2304
            } else {
                2080
            },
            ..SynthSpec::tiny(Arch::Llama, format, 61 + ci as u64)
        };
        for (size, spec) in [
            ("tiny", SynthSpec::tiny(Arch::Qwen2, format, 51 + ci as u64)),
            ("wide", wide),
        ] {
            let p = tmp(&format!("tiles-{size}-{}", format.name())).join("m.gguf");
            write_gguf(&p, &spec).unwrap();
            let model = tensorfold_models::load(&p).unwrap().model;
            let mut g = CudaModel::upload_with(&model, 0, MatmulKernels::TensorCores).unwrap();
            let toks = tokens(500, 71 + ci as u64);
            let reference = serial(&g, &toks);
            for tile in ["m2x4", "m1x4", "m2x2"] {
                g.set_many_tile(Some(tile)).unwrap();
                for chunk in [256, 300] {
                    let mut kv = g.new_cache();
                    let got = chunked(&g, &mut kv, &toks, &[chunk]);
                    assert_eq!(got.len(), reference.len());
                    for (p, (a, b)) in got.iter().zip(&reference).enumerate() {
                        assert_eq!(
                            bits(a),
                            bits(b),
                            "{size} {} {tile}, chunks of {chunk}: position {p}",
                            format.name()
                        );
                    }
                }
            }
            assert!(g.set_many_tile(Some("m9x9")).is_err());
        }
    }
}

#[test]
fn rows_of_many_segments_stay_invariant() {
    if !gpu() {
        return;
    }
    // Down projections of 2336 and 2304 inputs: 10 and 9 segments of 256
    // (more than the few-row kernel's 8 warps), the first ending in a
    // partial segment of one unit.
    for (format, hidden, ff) in [(Format::Q4_0, 64, 2336), (Format::Q6K, 256, 2304)] {
        let spec = SynthSpec {
            hidden_size: hidden,
            intermediate_size: ff,
            ..SynthSpec::tiny(Arch::Llama, format, 9)
        };
        let p = tmp(&format!("wide-{}", format.name())).join("m.gguf");
        write_gguf(&p, &spec).unwrap();
        let model = tensorfold_models::load(&p).unwrap().model;
        let kernels = MatmulKernels::TensorCores;
        let g = CudaModel::upload_with(&model, 0, kernels).unwrap();
        let what = format!("wide {}", format.name());
        assert_invariant(&g, &what, 31);
        assert_close_to_cpu(&model, &g, kernels, &what, 5);
    }
}

#[test]
fn attention_of_every_head_width_stays_invariant() {
    if !gpu() {
        return;
    }
    // (head dimension, query heads, kv heads): the tensor-core widths with
    // tiles of 4 heads by 4 rows, 2 by 8 (6 heads of 96), 3 by 5 (a slot
    // left over) and 1 by 16; 80 takes the f32 kernels.
    for (hd, heads, kv_heads) in [(128, 4, 1), (96, 6, 2), (32, 9, 3), (64, 4, 4), (80, 4, 2)] {
        let spec = SynthSpec {
            hidden_size: heads * hd,
            intermediate_size: 256,
            heads,
            kv_heads,
            head_dim: hd,
            ..SynthSpec::tiny(Arch::Llama, Format::Q8_0, 13)
        };
        let p = tmp(&format!("heads-{hd}")).join("m.gguf");
        write_gguf(&p, &spec).unwrap();
        let model = tensorfold_models::load(&p).unwrap().model;
        let kernels = MatmulKernels::TensorCores;
        let g = CudaModel::upload_with(&model, 0, kernels).unwrap();
        let what = format!("head dim {hd}, {heads} heads / {kv_heads}");
        assert_invariant(&g, &what, 17);
        assert_close_to_cpu(&model, &g, kernels, &what, 3);
    }
}

#[test]
fn long_contexts_fold_many_key_blocks_in_order() {
    if !gpu() {
        return;
    }
    // 4300 positions: 68 key blocks, more than one round of the split
    // kernel's warps and more than two of the fold's 32-block chunks.
    // Decode rows (split kernel) against a prefill's rows (fused), for a
    // head narrower than the fold's warp (16) and one of four warps (128).
    for (hd, heads, kv_heads) in [(16, 4, 2), (128, 8, 2)] {
        let spec = SynthSpec {
            hidden_size: 64,
            heads,
            kv_heads,
            head_dim: hd,
            max_positions: 4608,
            ..SynthSpec::tiny(Arch::Llama, Format::Q8_0, 21)
        };
        let p = tmp(&format!("long-q8_0-{hd}")).join("m.gguf");
        write_gguf(&p, &spec).unwrap();
        let model = tensorfold_models::load(&p).unwrap().model;
        let g = CudaModel::upload(&model, 0).unwrap();
        let toks = tokens(4300, 8);
        let reference = chunked(&g, &mut g.new_cache(), &toks, &[256]);
        let mut kv = g.new_cache();
        chunked(&g, &mut kv, &toks[..4200], &[256]);
        let decoded = chunked(&g, &mut kv, &toks, &[1]);
        assert_eq!(decoded.len(), 100);
        for (p, a) in decoded.iter().enumerate() {
            assert_eq!(
                bits(a),
                bits(&reference[4200 + p]),
                "head dim {hd}: decode at {}",
                4200 + p
            );
        }
    }
    println!("long context: decode rows equal prefill rows");
}

#[test]
fn rows_narrower_than_32_inputs_run_and_stay_invariant() {
    if !gpu() {
        return;
    }
    // mathformer's shape: 8 inputs per row, 4-wide heads; 36 is no multiple
    // of 32 either.
    let spec = SynthSpec {
        hidden_size: 8,
        intermediate_size: 36,
        heads: 2,
        kv_heads: 2,
        head_dim: 4,
        ..SynthSpec::tiny(Arch::Llama, Format::F32, 5)
    };
    let d = tmp("narrow");
    write_hf(&d, &spec).unwrap();
    let model = tensorfold_models::load(&d).unwrap().model;
    let g = CudaModel::upload(&model, 0).unwrap();
    assert_invariant(&g, "narrow llama f32", 77);
    tensorfold_models::set_float_products(true);
    let mut cpu_kv = tensorfold_kv::KvCache::new(model.config.kv_shape());
    let cpu = model.forward(&tokens(20, 3), &mut cpu_kv, Logits::All);
    let gpu = g
        .forward(&tokens(20, 3), &mut g.new_cache(), Logits::All)
        .unwrap();
    let worst = cpu
        .iter()
        .zip(&gpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // Both keep keys and values in f16; their sums run in other orders.
    assert!(
        worst < 5e-3,
        "narrow model: GPU and CPU logits differ by {worst}"
    );
}

/// Logits are bitwise the serial ones in every chunking, after rollback and
/// inside batches of other sequences.
fn assert_invariant(g: &CudaModel, what: &str, seed: u64) {
    let toks = tokens(300, seed);
    let reference = serial(g, &toks);
    for sizes in [&[256usize][..], &[9], &[1, 2, 3, 4, 5, 7, 64], &[100, 33]] {
        let mut kv = g.new_cache();
        let got = chunked(g, &mut kv, &toks, sizes);
        assert_eq!(got.len(), reference.len());
        for (p, (a, b)) in got.iter().zip(&reference).enumerate() {
            assert_eq!(bits(a), bits(b), "{what}: chunks {sizes:?}, position {p}");
        }
    }

    // Rollback: drop 40 positions, refill in another chunking.
    let mut kv = g.new_cache();
    chunked(g, &mut kv, &toks, &[256]);
    kv.truncate(260);
    let again = chunked(g, &mut kv, &toks, &[9]);
    for (p, a) in again.iter().enumerate() {
        assert_eq!(bits(a), bits(&reference[260 + p]), "{what}: after rollback");
    }

    // Several sequences in one call, each with its own prompt, length
    // and logits choice, against each alone.
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| tokens(40 + 37 * i, 100 + i as u64))
        .collect();
    let alone: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| serial(g, p)).collect();
    let mut caches: Vec<CudaKv> = prompts.iter().map(|_| g.new_cache()).collect();
    let mut done = vec![0usize; prompts.len()];
    let steps = [5usize, 1, 17, 3, 64];
    let mut round = 0;
    while done.iter().zip(&prompts).any(|(d, p)| *d < p.len()) {
        let mut seqs: Vec<Seq<'_, CudaKv>> = Vec::new();
        let mut which = Vec::new();
        for (i, kv) in caches.iter_mut().enumerate() {
            let n = steps[(i + round) % steps.len()].min(prompts[i].len() - done[i]);
            let want = if (i + round) % 3 == 0 {
                Logits::Last
            } else {
                Logits::All
            };
            which.push((i, done[i], n, want));
            seqs.push(Seq {
                tokens: &prompts[i][done[i]..done[i] + n],
                cache: kv,
                logits: want,
            });
        }
        let out = g.forward_batch(&mut seqs).unwrap();
        for ((i, start, n, want), l) in which.into_iter().zip(out) {
            let vocab = g.config().vocab_size;
            let rows: Vec<usize> = want.rows(n).collect();
            assert_eq!(l.len(), rows.len() * vocab);
            for (r, row) in rows.iter().zip(l.chunks_exact(vocab)) {
                assert_eq!(
                    bits(row),
                    bits(&alone[i][start + r]),
                    "{what}: sequence {i} at {} in a batch",
                    start + r
                );
            }
            done[i] += n;
        }
        round += 1;
    }
    eprintln!("{what}: invariant");
}

#[test]
fn gpu_logits_are_close_to_cpu_and_greedy_tokens_agree() {
    if !gpu() {
        return;
    }
    for (ci, (arch, format, hf)) in cases().into_iter().enumerate() {
        let model = load(arch, format, hf, 50 + ci as u64);
        for kernels in [MatmulKernels::TensorCores, MatmulKernels::Fma] {
            let g = CudaModel::upload_with(&model, 0, kernels).unwrap();
            let what = format!("{} {} hf={hf} {kernels:?}", arch.name(), format.name());
            assert_close_to_cpu(&model, &g, kernels, &what, 7 + ci as u64);
        }
    }
}

/// Six greedy steps after a 70-token prompt on the CPU and the GPU: logits
/// within a tolerance of the largest, and the same tokens unless a near
/// tie. Tensor cores round inputs to f16, so quantized formats there, and
/// attention of the head widths they serve, get a wider tolerance than f32
/// arithmetic.
fn assert_close_to_cpu(
    model: &Model,
    g: &CudaModel,
    kernels: MatmulKernels,
    what: &str,
    seed: u64,
) {
    // The device multiplies decoded weights in float; so does this CPU
    // reference (its integer products quantize the inputs to 8 bits).
    tensorfold_models::set_float_products(true);
    let quantized = match model.blocks[0].q.format() {
        Encoding::Plain(f) => f.block_elems() > 1,
        Encoding::Affine(..) => false,
    };
    let f16_inputs = kernels == MatmulKernels::TensorCores && quantized
        || tensorfold_cuda::attention_on_tensor_cores(model.config.head_dim);
    // Both keep keys and values in f16 but sum in other orders: a few
    // thousandths apart even where both multiply in f32.
    let tolerance = if f16_inputs { 2e-2 } else { 5e-3 };
    let prompt = tokens(70, seed);
    let mut cpu_kv = tensorfold_kv::KvCache::new(model.config.kv_shape());
    let mut gpu_kv = g.new_cache();
    let mut c = model.forward(&prompt, &mut cpu_kv, Logits::Last);
    let mut d = g.forward(&prompt, &mut gpu_kv, Logits::Last).unwrap();
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32
    };
    let mut worst = 0f32;
    for step in 0..6 {
        let scale = c.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
        let diff = c
            .iter()
            .zip(&d)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(diff / scale);
        assert!(
            diff <= tolerance * scale,
            "{what}: step {step}: max diff {diff} (scale {scale})"
        );
        let (tc, td) = (argmax(&c), argmax(&d));
        // A near tie may break either way; otherwise they must agree.
        let mut sorted = c.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 10.0 * diff {
            assert_eq!(tc, td, "{what}: greedy token {step}");
        }
        c = model.forward(&[tc], &mut cpu_kv, Logits::Last);
        d = g.forward(&[tc], &mut gpu_kv, Logits::Last).unwrap();
    }
    eprintln!("{what}: close to CPU (worst {worst:.2e} of the largest logit)");
}

/// The real SmolLM2 answers "Paris" on the GPU, when its file is present
/// (`TENSORFOLD_MODELS`, or `TF_SMOLLM2` naming the file).
#[test]
fn smollm2_answers_paris_on_gpu() {
    if !gpu() {
        return;
    }
    let path = std::env::var_os("TF_SMOLLM2")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("TENSORFOLD_MODELS")
                .map(|d| PathBuf::from(d).join("smollm2-135m-instruct-q4_1.gguf"))
        });
    let Some(path) = path.filter(|p| p.exists()) else {
        eprintln!("SmolLM2 not present: skipped");
        return;
    };
    let bundle = tensorfold_models::load(&path).unwrap();
    let g = CudaModel::upload(&bundle.model, 0).unwrap();
    let prompt =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let ids = bundle.tokenizer.encode(prompt, false).unwrap();
    let mut kv = g.new_cache();
    let mut logits = g.forward(ids.get_ids(), &mut kv, Logits::Last).unwrap();
    let mut out = Vec::new();
    for _ in 0..24 {
        let t = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        if bundle.eos_ids.contains(&t) {
            break;
        }
        out.push(t);
        logits = g.forward(&[t], &mut kv, Logits::Last).unwrap();
    }
    let text = bundle.tokenizer.decode(&out, true).unwrap();
    eprintln!("SmolLM2 on GPU: {text:?}");
    assert!(text.contains("Paris"), "{text}");
}
