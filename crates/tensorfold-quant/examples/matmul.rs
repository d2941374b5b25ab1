//! Times `Matrix::matmul` for SmolLM2-135M's shapes by number of rows:
//! `cargo run --release -p tensorfold-quant --example matmul`.

use std::time::Instant;
use tensorfold_quant::{Format, Matrix};

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u64 * 2654435761) % 20011) as f32 / 10000.0 - 1.0)
        .collect()
}

fn main() {
    let shapes = [
        ("q/o 576x576 Q4_1", Format::Q4_1, 576, 576, 60),
        ("k/v 192x576 Q4_1", Format::Q4_1, 192, 576, 60),
        ("gate/up 1536x576 Q4_1", Format::Q4_1, 1536, 576, 60),
        ("down 576x1536 Q4_1", Format::Q4_1, 576, 1536, 30),
        ("head 49152x576 Q8_0", Format::Q8_0, 49152, 576, 1),
    ];
    for (name, f, n, k, per_token) in shapes {
        let w = Matrix::from_f32(f, n, k, &values(n * k)).unwrap();
        let x = values(9 * k);
        let mut out = vec![0f32; 9 * n];
        let mut line = format!("{name:<24}");
        for m in [1, 2, 3, 4, 5, 9] {
            let reps = (2_000_000_000 / (n * k * 8)).max(3);
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..reps {
                    w.matmul(&x, m, &mut out);
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            line += &format!("  m={m} {:>7.3}ms", best * 1e3 * per_token as f64);
        }
        println!("{line}   (per token: x{per_token})");
    }
}
