//! The device sampler against the CPU rule: given the same row of logits
//! and the same draw, `sampling.cu` picks the token `tensorfold-sampling`
//! picks, for greedy and keyed draws, every filter, vocabularies of real
//! sizes, ties, masked and NaN logits; and a forward that picks on the
//! device gives the tokens the host picks from the same forward's rows.
//! Without a CUDA device the tests pass vacuously (printing why).
#![cfg(feature = "cuda")]

use tensorfold_cuda::{CudaModel, DevicePicker, RowDraw};
use tensorfold_models::synth::{write_gguf, SynthSpec};
use tensorfold_models::{Arch, Format, Logits, Seq};
use tensorfold_sampling::{pick, Draw, SeqRows};

fn gpu() -> bool {
    let ok = tensorfold_cuda::available();
    if !ok {
        eprintln!("no CUDA device: skipped");
    }
    ok
}

/// splitmix64: a reproducible stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        tensorfold_sampling::mix(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// A row in one of several shapes: a language model's (a few large
/// logits over a spread), flat, integer ties, masked and NaN entries.
fn row(rng: &mut Rng, vocab: usize) -> Vec<f32> {
    let shape = rng.below(5);
    (0..vocab)
        .map(|_| {
            let u = rng.unit();
            match shape {
                0 => (u - 0.5) * 8.0 + if rng.below(500) == 0 { 12.0 } else { 0.0 },
                1 => (u - 0.5) * 0.01,
                2 => (rng.below(9) as f32) - 4.0,
                3 => match rng.below(12) {
                    0 => f32::NEG_INFINITY,
                    1 => f32::NAN,
                    _ => (u - 0.5) * 60.0,
                },
                _ => (u - 0.5) * 30.0,
            }
        })
        .collect()
}

fn draw(rng: &mut Rng) -> Draw {
    let temperature = match rng.below(8) {
        0 => 0.0,
        1 => 1e-20,
        2 => 1e20,
        _ => 0.05 + rng.unit() * 2.5,
    };
    Draw {
        temperature,
        top_k: match rng.below(4) {
            0 => Some(1 + rng.below(700) as usize),
            1 => Some(1 + rng.below(5) as usize),
            _ => None,
        },
        top_p: match rng.below(3) {
            0 => 1.0,
            1 => 0.95,
            _ => 0.01 + rng.unit() * 0.98,
        },
        min_p: match rng.below(3) {
            0 => rng.unit() * 0.3,
            _ => 0.0,
        },
        seed: rng.next(),
    }
}

#[test]
fn device_picks_equal_cpu_picks_row_for_row() {
    if !gpu() {
        return;
    }
    let mut picker = DevicePicker::new(0).unwrap();
    let mut rng = Rng(25);
    let mut checked = 0;
    // Vocabularies of real models and small ones, whole calls of rows.
    for (vocab, calls, rows) in [
        (2usize, 20usize, 40usize),
        (7, 20, 40),
        (1023, 10, 40),
        (1025, 10, 40),
        (2600, 10, 40),
        (32000, 6, 24),
        (49152, 4, 24),
        (128256, 6, 16),
        (151936, 3, 16),
    ] {
        for _ in 0..calls {
            let logits: Vec<f32> = (0..rows).flat_map(|_| row(&mut rng, vocab)).collect();
            let draws: Vec<RowDraw> = (0..rows)
                .map(|r| RowDraw {
                    row: r,
                    position: rng.below(1 << 20),
                    draw: draw(&mut rng),
                })
                .collect();
            let got = picker.pick(&logits, vocab, &draws).unwrap();
            for (d, &g) in draws.iter().zip(&got) {
                let cpu = pick(
                    &d.draw,
                    d.position,
                    &logits[d.row * vocab..(d.row + 1) * vocab],
                );
                assert_eq!(g, cpu, "vocab {vocab}, {d:?}");
                checked += 1;
            }
        }
    }
    eprintln!("{checked} rows picked alike");
}

#[test]
fn a_row_picked_in_any_company_picks_alike() {
    if !gpu() {
        return;
    }
    let mut picker = DevicePicker::new(0).unwrap();
    let mut rng = Rng(7);
    let vocab = 49152;
    let logits: Vec<f32> = (0..8).flat_map(|_| row(&mut rng, vocab)).collect();
    let draws: Vec<RowDraw> = (0..8)
        .map(|r| RowDraw {
            row: r,
            position: 100 + r as u64,
            draw: Draw {
                temperature: 0.8,
                top_k: None,
                top_p: 0.95,
                min_p: 0.0,
                seed: 3,
            },
        })
        .collect();
    let together = picker.pick(&logits, vocab, &draws).unwrap();
    for (d, &t) in draws.iter().zip(&together) {
        let alone = picker.pick(&logits, vocab, &[*d]).unwrap();
        assert_eq!(alone, vec![t]);
    }
}

#[test]
fn a_forward_that_picks_gives_the_hosts_tokens() {
    if !gpu() {
        return;
    }
    let path = std::env::temp_dir().join(format!("tf-cuda-picks-{}.gguf", std::process::id()));
    write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::Q4K, 11)).unwrap();
    let model = tensorfold_models::load(&path).unwrap().model;
    std::fs::remove_file(&path).unwrap();
    let g = CudaModel::upload(&model, 0).unwrap();
    let sampled = Draw {
        temperature: 0.9,
        top_k: Some(40),
        top_p: 0.9,
        min_p: 0.02,
        seed: 99,
    };
    let prompts: [Vec<u32>; 3] = [
        (1..40).collect(),
        (5..25).rev().collect(),
        vec![3, 1, 4, 1, 5, 9, 2, 6],
    ];
    let wants = [Logits::All, Logits::Last, Logits::All];
    let draws = [Some(sampled), None, Some(Draw::greedy())];
    let run = |draws: &[Option<Draw>]| {
        let mut caches: Vec<_> = prompts.iter().map(|_| g.new_cache()).collect();
        let mut seqs: Vec<Seq<'_, _>> = caches
            .iter_mut()
            .zip(&prompts)
            .zip(wants)
            .map(|((cache, p), logits)| Seq {
                tokens: p,
                cache,
                logits,
            })
            .collect();
        g.forward_batch_picked(&mut seqs, draws).unwrap()
    };
    let picked = run(&draws);
    let rows = run(&[]);
    let vocab = g.config().vocab_size;
    for (i, (p, r)) in picked.iter().zip(&rows).enumerate() {
        let SeqRows::Logits(logits) = r else {
            panic!("rows without draws come back whole");
        };
        let first = wants[i].rows(prompts[i].len()).start;
        let host: Vec<u32> = logits
            .chunks_exact(vocab)
            .enumerate()
            .map(|(k, row)| match draws[i] {
                Some(d) => pick(&d, (first + k + 1) as u64, row),
                None => 0,
            })
            .collect();
        match (p, draws[i]) {
            (SeqRows::Picks(ids), Some(_)) => assert_eq!(ids, &host, "sequence {i}"),
            (SeqRows::Logits(l), None) => assert_eq!(l, logits, "sequence {i}"),
            _ => panic!("sequence {i} came back in the wrong form"),
        }
    }
}
