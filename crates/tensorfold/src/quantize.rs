//! `tensorfold quantize`: any readable model to an MLX affine checkpoint.

use crate::cli::QuantizeArgs;
use anyhow::{bail, Context, Result};
use tensorfold_models::mlx::{self, MlxQuantization, QuantizeOptions};
use tensorfold_models::{Affine, QuantRule, ScaleDtype};
use tensorfold_progress::Progress;

/// Closes a spinner as its operation ended.
fn finish<T, E>(progress: Progress, result: Result<T, E>) -> Result<T, E> {
    match &result {
        Ok(_) => progress.finish(""),
        Err(_) => progress.abandon(),
    }
    result
}

/// The settings the flags ask for; overrides are written only where they
/// differ from the default.
pub fn options(args: &QuantizeArgs) -> Result<QuantizeOptions> {
    let default = Affine::new(args.bits, args.group)?;
    let mut quantization = MlxQuantization::uniform(default);
    for (module, bits, group) in [
        ("model.embed_tokens", args.embed_bits, args.embed_group),
        ("lm_head", args.head_bits, args.head_group),
    ] {
        let spec = Affine::new(bits.unwrap_or(args.bits), group.unwrap_or(args.group))
            .with_context(|| format!("settings for {module}"))?;
        if spec != default {
            quantization.overrides.insert(module.into(), Some(spec));
        }
    }
    let scales = match args.scale_dtype.as_str() {
        "f16" => ScaleDtype::F16,
        "bf16" => ScaleDtype::Bf16,
        "f32" => ScaleDtype::F32,
        other => bail!("--scale-dtype {other}: expected f16, bf16 or f32"),
    };
    let rule = match args.rule.as_str() {
        "search" => QuantRule::Search,
        "mlx" => QuantRule::Mlx,
        other => bail!("--rule {other}: expected search or mlx"),
    };
    Ok(QuantizeOptions {
        quantization,
        scales,
        rule,
    })
}

pub fn quantize(args: QuantizeArgs) -> Result<()> {
    let opts = options(&args)?;
    let loading = Progress::spinner(format!("loading {}", args.source.display()));
    let bundle = tensorfold_models::load(&args.source);
    let bundle = finish(loading, bundle)?;
    let writing = Progress::spinner(format!("quantizing into {}", args.out.display()));
    finish(writing, mlx::write(&bundle, &opts, &args.out))?;
    let info = tensorfold_models::inspect(&args.out)?;
    eprintln!(
        "wrote {}: {} parameters in {} weight bytes ({})",
        args.out.display(),
        info.parameters,
        info.weight_bytes,
        info.formats
            .iter()
            .map(|(f, n)| format!("{f} x{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
