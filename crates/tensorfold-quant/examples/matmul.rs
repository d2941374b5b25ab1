//! Times `Matrix::matmul` for SmolLM2-135M's and Qwen2.5's shapes by number
//! of rows: `cargo run --release -p tensorfold-quant --example matmul [NAME]`
//! (only the shapes whose name contains NAME).
//!
//! Times are the calling thread's CPU time (steadier than wall time on a
//! busy machine); run with `RAYON_NUM_THREADS=1` to time one core, or set
//! `MATMUL_WALL=1` for wall time (every thread's work).

use tensorfold_quant::{Format, Matrix};

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u64 * 2654435761) % 20011) as f32 / 10000.0 - 1.0)
        .collect()
}

/// Nanoseconds of CPU time this thread has used, or of wall time since the
/// first call with `MATMUL_WALL` set.
fn nanos() -> u64 {
    if std::env::var_os("MATMUL_WALL").is_some() {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        return START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64;
    }
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn main() {
    let shapes = [
        ("q/o 576x576 Q4_1", Format::Q4_1, 576, 576, 60),
        ("k/v 192x576 Q4_1", Format::Q4_1, 192, 576, 60),
        ("gate/up 1536x576 Q4_1", Format::Q4_1, 1536, 576, 60),
        ("down 576x1536 Q4_1", Format::Q4_1, 576, 1536, 30),
        ("head 49152x576 Q8_0", Format::Q8_0, 49152, 576, 1),
        ("q 896x896 Q5_0", Format::Q5_0, 896, 896, 24),
        ("down 896x4864 Q6_K", Format::Q6K, 896, 4864, 1),
        ("up 8960x1536 Q4_K", Format::Q4K, 8960, 1536, 1),
        ("q 1536x1536 Q4_K", Format::Q4K, 1536, 1536, 1),
        ("down 1536x8960 Q6_K", Format::Q6K, 1536, 8960, 1),
        ("down 1536x8960 Q4_K", Format::Q4K, 1536, 8960, 1),
    ];
    let only = std::env::args().nth(1).unwrap_or_default();
    for (name, f, n, k, per_token) in shapes {
        if !name.contains(&only) {
            continue;
        }
        let w = Matrix::from_f32(f, n, k, &values(n * k)).unwrap();
        let x = values(256 * k);
        let mut out = vec![0f32; 256 * n];
        let mut line = format!("{name:<24}");
        for m in [1, 9, 16, 64, 256] {
            let reps = (500_000_000 / (n * k * 8)).max(3);
            let mut best = f64::MAX;
            for _ in 0..7 {
                let t = nanos();
                for _ in 0..reps {
                    w.matmul(&x, m, &mut out);
                }
                best = best.min((nanos() - t) as f64 / reps as f64);
            }
            line += &format!("  m={m} {:>7.3}ms", best * 1e-6 * per_token as f64);
        }
        println!("{line}   (x{per_token} per token)");
    }
}
