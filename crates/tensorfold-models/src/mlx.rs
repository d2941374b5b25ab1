//! MLX affine checkpoints in the Hugging Face layout: the `quantization`
//! block of `config.json`, and writing a model in that layout.
//!
//! A quantized module `M` stores `M.weight` (packed `u32`, `rows x
//! cols*bits/32`), `M.scales` and `M.biases` (`rows x cols/group`). The
//! block gives the default `bits` and `group_size` and, keyed by module
//! path, per-module settings (`{"bits": 8, "group_size": 64}`) or `false`
//! for a module kept in floats. Modules without `.scales` are floats, as
//! in MLX.

use crate::config::{ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::{family, Bundle};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;
use tensorfold_quant::{Affine, AffineBlocks, Matrix, ScaleDtype};

/// What TensorFold reads, for refusals.
pub const SUPPORTED: &str =
    "supported: MLX affine checkpoints (a config.json `quantization` block \
     with bits 2, 3, 4, 5, 6 or 8 and group_size 32, 64 or 128), f32/f16/bf16 safetensors, \
     and GGUF files (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)";

/// A checkpoint's affine settings: a default and per-module overrides
/// (`None`: the module stays in floats).
#[derive(Debug, Clone, PartialEq)]
pub struct MlxQuantization {
    pub default: Affine,
    pub overrides: BTreeMap<String, Option<Affine>>,
}

impl MlxQuantization {
    pub fn uniform(default: Affine) -> MlxQuantization {
        MlxQuantization {
            default,
            overrides: BTreeMap::new(),
        }
    }

    /// The settings of the module at `path` (e.g. `model.embed_tokens`).
    pub fn for_module(&self, path: &str) -> Option<Affine> {
        self.overrides
            .get(path)
            .copied()
            .unwrap_or(Some(self.default))
    }

    /// The `quantization` block as MLX writes it.
    pub fn to_json(&self) -> Value {
        let spec = |a: Affine| json!({"group_size": a.group(), "bits": a.bits()});
        let mut m = Map::new();
        m.insert("group_size".into(), self.default.group().into());
        m.insert("bits".into(), self.default.bits().into());
        for (k, v) in &self.overrides {
            m.insert(k.clone(), v.map_or(Value::Bool(false), spec));
        }
        Value::Object(m)
    }

    /// Reads `quantization` (before `quantization_config`, which MLX writes
    /// as a copy); refuses every other declared quantization.
    pub(crate) fn from_config(config: &Value) -> Result<Option<MlxQuantization>> {
        let present = |k: &str| config.get(k).filter(|v| !v.is_null());
        if let Some(qc) = present("quantization_config") {
            let method = qc["quant_method"].as_str();
            if method.is_some() || present("quantization").is_none() {
                return Err(ModelError::Unsupported(format!(
                    "config.json declares quantization_config ({}); {SUPPORTED}",
                    method.unwrap_or("unknown method")
                )));
            }
        }
        let Some(q) = present("quantization") else {
            return Ok(None);
        };
        let obj = q.as_object().ok_or_else(|| {
            ModelError::Malformed("config.json: `quantization` is not an object".into())
        })?;
        if let Some(mode) = obj.get("mode").and_then(Value::as_str) {
            if mode != "affine" {
                return Err(ModelError::Unsupported(format!(
                    "config.json declares quantization mode '{mode}'; {SUPPORTED}"
                )));
            }
        }
        let default = spec_of("quantization", q)?;
        let mut overrides = BTreeMap::new();
        for (k, v) in obj {
            if matches!(k.as_str(), "group_size" | "bits" | "mode") {
                continue;
            }
            let s = match v {
                Value::Bool(false) => None,
                Value::Bool(true) => Some(default),
                Value::Object(_) => Some(spec_of(&format!("quantization.{k}"), v)?),
                _ => {
                    return Err(ModelError::Malformed(format!(
                        "config.json: quantization.{k} is neither settings nor a boolean"
                    )))
                }
            };
            overrides.insert(k.clone(), s);
        }
        Ok(Some(MlxQuantization { default, overrides }))
    }
}

fn spec_of(what: &str, v: &Value) -> Result<Affine> {
    let field = |k: &str| {
        v[k].as_u64()
            .ok_or_else(|| ModelError::Malformed(format!("config.json: {what} lacks {k}")))
    };
    let (bits, group) = (field("bits")?, field("group_size")?);
    Affine::new(bits.min(u32::MAX as u64) as u32, group as usize).map_err(|_| {
        ModelError::Unsupported(format!(
            "config.json: {what} asks for {bits}-bit groups of {group}; {SUPPORTED}"
        ))
    })
}

/// How to write a model in the MLX layout.
#[derive(Debug, Clone)]
pub struct QuantizeOptions {
    pub quantization: MlxQuantization,
    /// Dtype of scales and biases.
    pub scales: ScaleDtype,
    /// How each group's scale and bias are chosen.
    pub rule: tensorfold_quant::QuantRule,
}

fn st_dtype(d: ScaleDtype) -> Dtype {
    match d {
        ScaleDtype::F32 => Dtype::F32,
        ScaleDtype::F16 => Dtype::F16,
        ScaleDtype::Bf16 => Dtype::BF16,
    }
}

/// Rows of `m` reordered from GGUF's interleaved rotary layout to Hugging
/// Face's halves, per head of `head_dim` (the inverse of llama.cpp's
/// permutation): HF row `h*d + t*d/2 + i` is GGUF row `h*d + 2i + t`.
fn unpermute_rows(values: &[f32], rows: usize, cols: usize, head_dim: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; values.len()];
    for r in 0..rows {
        let (h, j) = (r / head_dim, r % head_dim);
        let (t, i) = (j / half, j % half);
        let src = h * head_dim + 2 * i + t;
        out[r * cols..(r + 1) * cols].copy_from_slice(&values[src * cols..(src + 1) * cols]);
    }
    out
}

fn decode(m: &Matrix) -> Vec<f32> {
    let (rows, cols) = (m.rows(), m.cols());
    let mut v = vec![0f32; rows * cols];
    for (r, row) in v.chunks_exact_mut(cols).enumerate() {
        m.row_f32(r, row);
    }
    v
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |e| ModelError::io(path, e)
}

/// The `config.json` of `config` in the Hugging Face layout.
pub(crate) fn hf_config(c: &ModelConfig, bos: Option<u32>, eos: &[u32]) -> Value {
    let class = family::FAMILIES
        .iter()
        .find(|f| f.arch == c.arch)
        .map_or("LlamaForCausalLM", |f| f.hf_class);
    json!({
        "architectures": [class],
        "model_type": c.arch.name(),
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_positions,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tied_embeddings,
        "attention_bias": c.qkv_bias,
        "bos_token_id": bos,
        "eos_token_id": eos,
    })
}

/// Writes `bundle` to `dir` as an MLX affine checkpoint: `config.json` (with
/// the `quantization` block), `model.safetensors`, `tokenizer.json`,
/// `tokenizer_config.json` (chat template, BOS/EOS) and
/// `generation_config.json` (every end-of-reply id, sampling defaults), so
/// the result serves chats as the source does. Norms and projection biases
/// are written in f32; GGUF Llama q/k rows are put back in the Hugging Face
/// rotary order.
pub fn write(bundle: &Bundle, opts: &QuantizeOptions, dir: &Path) -> Result<()> {
    let model = &bundle.model;
    let c = &model.config;
    let missing = c.plan.features();
    if !missing.is_empty() || family::of(c.arch).fused {
        return Err(ModelError::Unsupported(format!(
            "MLX export of {} writes Llama-shaped blocks only (this plan has {})",
            c.arch.name(),
            if missing.is_empty() {
                "fused weights".to_string()
            } else {
                missing.join(", ")
            }
        )));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let unpermute = c.rope_style == RopeStyle::Interleaved;
    // (name, dtype, shape, bytes), in the order written.
    let mut out: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let matrix = |out: &mut Vec<_>, module: &str, m: &Matrix, rotary: bool| -> Result<()> {
        let (rows, cols) = (m.rows(), m.cols());
        let mut values = decode(m);
        if rotary && unpermute {
            values = unpermute_rows(&values, rows, cols, c.head_dim);
        }
        match opts.quantization.for_module(module) {
            Some(spec) => {
                let q =
                    AffineBlocks::quantize_with(opts.rule, spec, opts.scales, rows, cols, &values)?;
                let groups = vec![rows, cols / spec.group()];
                let d = st_dtype(opts.scales);
                out.push((
                    format!("{module}.weight"),
                    Dtype::U32,
                    vec![rows, spec.row_words(cols)],
                    q.packed_le_bytes(),
                ));
                out.push((
                    format!("{module}.scales"),
                    d,
                    groups.clone(),
                    q.scales_le_bytes(),
                ));
                out.push((format!("{module}.biases"), d, groups, q.biases_le_bytes()));
            }
            None => out.push((
                format!("{module}.weight"),
                Dtype::F32,
                vec![rows, cols],
                f32_bytes(&values),
            )),
        }
        Ok(())
    };
    let vector = |out: &mut Vec<_>, name: String, v: &[f32], permute: bool| {
        let v = if permute && unpermute {
            unpermute_rows(v, v.len(), 1, c.head_dim)
        } else {
            v.to_vec()
        };
        out.push((name, Dtype::F32, vec![v.len()], f32_bytes(&v)));
    };
    matrix(&mut out, "model.embed_tokens", &model.embed, false)?;
    for (i, b) in model.blocks.iter().enumerate() {
        let p = format!("model.layers.{i}");
        vector(
            &mut out,
            format!("{p}.input_layernorm.weight"),
            &b.attn_norm,
            false,
        );
        vector(
            &mut out,
            format!("{p}.post_attention_layernorm.weight"),
            &b.ffn_norm,
            false,
        );
        matrix(&mut out, &format!("{p}.self_attn.q_proj"), &b.q, true)?;
        matrix(&mut out, &format!("{p}.self_attn.k_proj"), &b.k, true)?;
        matrix(&mut out, &format!("{p}.self_attn.v_proj"), &b.v, false)?;
        matrix(&mut out, &format!("{p}.self_attn.o_proj"), &b.o, false)?;
        for (name, v, permute) in [
            ("q_proj.bias", &b.q_bias, true),
            ("k_proj.bias", &b.k_bias, true),
            ("v_proj.bias", &b.v_bias, false),
            ("q_norm.weight", &b.q_norm, false),
            ("k_norm.weight", &b.k_norm, false),
        ] {
            if let Some(v) = v {
                vector(&mut out, format!("{p}.self_attn.{name}"), v, permute);
            }
        }
        matrix(&mut out, &format!("{p}.mlp.gate_proj"), &b.gate, false)?;
        matrix(&mut out, &format!("{p}.mlp.up_proj"), &b.up, false)?;
        matrix(&mut out, &format!("{p}.mlp.down_proj"), &b.down, false)?;
    }
    vector(&mut out, "model.norm.weight".into(), &model.norm, false);
    if let Some(head) = &model.lm_head {
        matrix(&mut out, "lm_head", head, false)?;
    }

    let views: Vec<(String, TensorView)> = out
        .iter()
        .map(|(n, d, s, b)| {
            TensorView::new(*d, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| ModelError::Malformed(format!("{n}: {e}")))
        })
        .collect::<Result<_>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "mlx".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &dir.join("model.safetensors"))
        .map_err(|e| ModelError::Malformed(e.to_string()))?;

    let bos = bundle
        .bos_token
        .as_deref()
        .and_then(|t| bundle.tokenizer.token_to_id(t));
    let mut config = hf_config(c, bos, &bundle.eos_ids);
    let q = opts.quantization.to_json();
    config["quantization"] = q.clone();
    config["quantization_config"] = q;
    let write_json = |name: &str, v: &Value| {
        let text = serde_json::to_string_pretty(v).expect("json values serialize");
        std::fs::write(dir.join(name), text).map_err(io(dir))
    };
    write_json("config.json", &config)?;
    let mut tk = json!({ "add_bos_token": bundle.add_bos.is_some() });
    for (k, v) in [
        ("chat_template", &bundle.chat_template),
        ("bos_token", &bundle.bos_token),
        ("eos_token", &bundle.eos_token),
    ] {
        if let Some(v) = v {
            tk[k] = Value::String(v.clone());
        }
    }
    write_json("tokenizer_config.json", &tk)?;
    let d = &bundle.defaults;
    let mut generation = json!({ "eos_token_id": bundle.eos_ids });
    for (k, v) in [
        ("temperature", d.temperature.map(|v| json!(v))),
        ("top_p", d.top_p.map(|v| json!(v))),
        ("top_k", d.top_k.map(|v| json!(v))),
        ("min_p", d.min_p.map(|v| json!(v))),
    ] {
        if let Some(v) = v {
            generation[k] = v;
        }
    }
    write_json("generation_config.json", &generation)?;
    bundle
        .tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(|e| ModelError::Tokenizer(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Value {
        serde_json::from_str(&format!("{{\"vocab_size\": 3 {extra}}}")).unwrap()
    }

    #[test]
    fn the_quantization_block_is_read_with_overrides() {
        let q =
            MlxQuantization::from_config(&cfg(r#", "quantization": {"group_size": 64, "bits": 4,
                "model.embed_tokens": {"group_size": 32, "bits": 8}, "lm_head": false},
                "quantization_config": {"group_size": 64, "bits": 4}"#))
            .unwrap()
            .unwrap();
        assert_eq!(q.default, Affine::new(4, 64).unwrap());
        assert_eq!(
            q.for_module("model.embed_tokens"),
            Some(Affine::new(8, 32).unwrap())
        );
        assert_eq!(q.for_module("lm_head"), None);
        assert_eq!(q.for_module("model.layers.0.mlp.up_proj"), Some(q.default));
        let back = MlxQuantization::from_config(&json!({ "quantization": q.to_json() }));
        assert_eq!(back.unwrap().unwrap(), q);
        assert_eq!(MlxQuantization::from_config(&cfg("")).unwrap(), None);
    }

    #[test]
    fn other_quantizations_are_refused_by_name() {
        let refused = |extra: &str, needle: &str| {
            let e = MlxQuantization::from_config(&cfg(extra))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(needle) && e.contains("bits 2, 3, 4, 5, 6 or 8"),
                "{e}"
            );
        };
        refused(
            r#", "quantization_config": {"quant_method": "gptq", "bits": 4}"#,
            "gptq",
        );
        refused(
            r#", "quantization_config": {"quant_method": "awq"}, "quantization": {"bits": 4, "group_size": 64}"#,
            "awq",
        );
        refused(
            r#", "quantization": {"bits": 7, "group_size": 64}"#,
            "7-bit",
        );
        refused(
            r#", "quantization": {"bits": 4, "group_size": 16}"#,
            "groups of 16",
        );
        refused(
            r#", "quantization": {"bits": 4, "group_size": 64, "model.embed_tokens": {"bits": 1, "group_size": 64}}"#,
            "model.embed_tokens",
        );
        refused(
            r#", "quantization": {"bits": 4, "group_size": 32, "mode": "mxfp4"}"#,
            "mxfp4",
        );
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tensorfold-mlx-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn written_checkpoints_load_at_every_width_with_mixed_settings() {
        use crate::synth::{self, SynthSpec};
        use crate::{Arch, Logits};
        let f32_dir = tmp("f32");
        let spec = SynthSpec::tiny(Arch::Qwen2, tensorfold_quant::Format::F32, 5);
        synth::write_hf(&f32_dir, &spec).unwrap();
        let reference = crate::load(&f32_dir).unwrap();
        let tokens = [1u32, 72, 101, 108, 108, 111];
        let logits = |b: &crate::Bundle| {
            let mut cache = tensorfold_kv::KvCache::new(b.model.config.kv_shape());
            b.model.forward(&tokens, &mut cache, Logits::All)
        };
        let want = logits(&reference);
        for bits in tensorfold_quant::AFFINE_BITS {
            let mut quant = MlxQuantization::uniform(Affine::new(bits, 32).unwrap());
            quant.overrides.insert(
                "model.embed_tokens".into(),
                Some(Affine::new(8, 64).unwrap()),
            );
            quant
                .overrides
                .insert("model.layers.1.mlp.down_proj".into(), None);
            let opts = QuantizeOptions {
                quantization: quant,
                scales: ScaleDtype::F16,
                rule: Default::default(),
            };
            let dir = tmp(&format!("q{bits}"));
            synth::write_mlx(&dir, &spec, &opts).unwrap();
            let info = crate::inspect(&dir).unwrap();
            let name = format!("AFFINE{bits}_G32");
            // 2 layers x 7 projections, one kept in floats, plus lm_head.
            assert_eq!(info.formats.get(&name), Some(&14), "{:?}", info.formats);
            assert_eq!(info.formats.get("F32"), Some(&(1 + 2 * 5 + 1)));
            assert_eq!(info.formats.get("AFFINE8_G64"), Some(&1));
            assert_eq!(info.config, reference.model.config);
            let b = crate::load(&dir).unwrap();
            let got = logits(&b);
            // The error halves with each bit (2 bits: ~3.0, 8 bits: ~0.04).
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            let bound = [0.0, 0.0, 4.5, 2.0, 1.2, 0.6, 0.3, 0.0, 0.08][bits as usize];
            assert!(err < bound, "{bits} bits: logits off by {err}");
            assert_eq!(b.eos_ids, reference.eos_ids);
            assert_eq!(b.chat_template, reference.chat_template);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let _ = std::fs::remove_dir_all(&f32_dir);
    }

    #[test]
    fn unpermute_inverts_the_gguf_order() {
        // One head of 4: GGUF rows (0, 1, 2, 3) = HF rows (0, 2, 1, 3).
        let v = [0.0, 1.0, 2.0, 3.0];
        assert_eq!(unpermute_rows(&v, 4, 1, 4), vec![0.0, 2.0, 1.0, 3.0]);
    }
}
