//! `tensorfold synth`: a random-weight GGUF of a real model's shape, for
//! speed comparisons where no model can be downloaded.

use anyhow::{anyhow, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use tensorfold_models::synth::{write_shaped_gguf, Shape, ShapedReport, ShapedSpec, SynthQuant};

/// `tensorfold synth --shape SHAPE --quant QUANT --out F.gguf [--seed N] [--layers N]`.
///
/// Real widths, depth, heads and vocabulary size; random weights (the same
/// for the same seed) and a byte-level vocabulary of filler tokens with the
/// ChatML control tokens. TensorFold and llama.cpp both load the file.
#[derive(Args)]
pub struct SynthArgs {
    /// llama3-8b, qwen2.5-7b, smollm2, qwen2.5-0.5b, llama3.2-1b or
    /// qwen3-30b-a3b (a mixture of experts).
    #[arg(long)]
    pub shape: String,
    /// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K (every
    /// matrix in that type) or Q4_K_M (llama.cpp's mix).
    #[arg(long)]
    pub quant: String,
    /// The GGUF file to write (replaced if it exists).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Layers instead of the shape's own count (small files for tests).
    #[arg(long)]
    pub layers: Option<usize>,
}

pub fn synth(args: SynthArgs) -> Result<()> {
    let mut shape = Shape::named(&args.shape).ok_or_else(|| {
        anyhow!(
            "--shape {}: unknown (known: {})",
            args.shape,
            Shape::names().join(", ")
        )
    })?;
    if let Some(layers) = args.layers {
        shape = shape.with_layers(layers);
    }
    let spec = ShapedSpec {
        shape,
        quant: SynthQuant::parse(&args.quant)?,
        seed: args.seed,
    };
    let start = Instant::now();
    let report = write_shaped_gguf(&args.out, &spec)?;
    let secs = start.elapsed().as_secs_f64();
    note_fallbacks(&report);
    eprintln!(
        "wrote {}: {} bytes ({:.2} GiB), {} parameters ({}) in {:.1}s",
        args.out.display(),
        report.file_bytes,
        report.file_bytes as f64 / (1u64 << 30) as f64,
        report.parameters,
        report
            .formats
            .iter()
            .map(|(f, n)| format!("{f} x{n}"))
            .collect::<Vec<_>>()
            .join(", "),
        secs
    );
    Ok(())
}

/// One line for all the k-quant fallbacks, by kind, as llama-quantize
/// would have made them.
fn note_fallbacks(report: &ShapedReport) {
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for f in &report.fallbacks {
        let kind = format!("{} -> {} ({} columns)", f.wanted, f.stored, f.cols);
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
    }
    if !kinds.is_empty() {
        let list: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        eprintln!(
            "note: rows not a multiple of 256 cannot hold k-quants; stored as llama.cpp does: {}",
            list.join(", ")
        );
    }
}
