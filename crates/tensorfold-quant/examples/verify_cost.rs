//! What a verify window costs in the integer products: the time of one
//! product with `m` input rows against one row, per weight format, on
//! shapes of the registry's models (`cargo run --release -p
//! tensorfold-quant --example verify_cost [-- ROWS...]`). Each time is
//! the fastest of repeated calls: on a shared machine the others' work
//! only ever adds.

use std::time::Instant;
use tensorfold_quant::{Format, Matrix};

fn values(n: usize, seed: u64) -> Vec<f32> {
    // A small xorshift: inputs need only be varied, not random.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn fastest_seconds(mut run: impl FnMut(), repeats: usize) -> f64 {
    run();
    let mut times: Vec<f64> = (0..repeats)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[0]
}

fn main() {
    let heights: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("row counts"))
        .collect();
    let heights = if heights.is_empty() {
        vec![2, 9]
    } else {
        heights
    };
    let shapes = [
        (Format::Q4K, 1536, 8960),
        (Format::Q6K, 8960, 1536),
        (Format::Q4_1, 1536, 576),
        (Format::Q5_0, 4864, 896),
        (Format::Q8_0, 4864, 896),
    ];
    for (format, rows, cols) in shapes {
        let w = Matrix::from_f32(format, rows, cols, &values(rows * cols, 1)).expect("quantizes");
        let most = *heights.iter().max().unwrap_or(&1);
        let x = values(most * cols, 2);
        let mut out = vec![0f32; most * rows];
        let mut time = |m: usize| fastest_seconds(|| w.matmul(&x, m, &mut out), 41);
        let one = time(1);
        let ratios: Vec<String> = heights
            .iter()
            .map(|&m| {
                let t = time(m);
                format!("{m} rows {:.1} us, {:.2}x", t * 1e6, t / one)
            })
            .collect();
        println!(
            "{format:?} {rows}x{cols}: one row {:.1} us; {}",
            one * 1e6,
            ratios.join(", ")
        );
    }
}
