//! Random-weight models written in the real on-disk formats, for tests and
//! benchmarks: deterministic from a seed, any shape, any storage format.
//!
//! The tokenizer is byte-level BPE over the 256 byte symbols plus ChatML
//! control tokens, so any text round-trips; the chat template is ChatML.
//!
//! [`write_shaped_gguf`] writes models of real shapes and real size (an 8B
//! Llama at Q4_K_M), streamed a tensor at a time, for llama.cpp too.

use crate::config::{Arch, ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::family;
use crate::mlx::{MlxQuantization, QuantizeOptions};
use crate::plan::{Activation, Experts, Plan, SlidingWindow};
use crate::weights::TensorSource;
use crate::{Bundle, GenerationDefaults};
use candle_core::quantized::{ggml_file::qtensor_from_ggml, gguf_file, GgmlDType, QTensor};
use std::collections::HashMap;
use std::path::Path;
use tensorfold_quant::{Format, GgmlBlocks, Matrix, Storage};
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

mod mix;
mod shaped;
mod shapes;
mod stream;
mod vocab;

pub use mix::SynthQuant;
pub use shaped::{write_shaped_gguf, Fallback, ShapedReport, ShapedSpec};
pub use shapes::Shape;

pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The shape and storage of a random model.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub arch: Arch,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub max_positions: usize,
    pub tied_embeddings: bool,
    /// Storage of the 2-D weights (norms stay f32).
    pub format: Format,
    pub seed: u64,
    /// The family's parts, as the forward runs them (norm weights as
    /// multiplied: a Gemma file stores them as its layout says).
    pub plan: Plan,
    pub rope_theta: f64,
}

impl SynthSpec {
    /// A tiny Llama that runs in milliseconds.
    pub fn tiny(arch: Arch, format: Format, seed: u64) -> SynthSpec {
        let wide = format.block_elems() > 32;
        SynthSpec {
            arch,
            hidden_size: if wide { 256 } else { 64 },
            intermediate_size: if wide { 512 } else { 128 },
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: if wide { 64 } else { 16 },
            max_positions: 512,
            tied_embeddings: !matches!(arch, Arch::Qwen2 | Arch::Phi3),
            format,
            seed,
            plan: tiny_plan(arch, if wide { 512 } else { 128 }),
            rope_theta: if arch == Arch::Gemma3 {
                1_000_000.0
            } else {
                10_000.0
            },
        }
        .with_layers(if arch == Arch::Gemma3 { 6 } else { 2 })
    }

    fn with_layers(self, layers: usize) -> SynthSpec {
        SynthSpec { layers, ..self }
    }

    /// A tiny model whose rows fit the groups of `quant` (64 wide for
    /// groups up to 64, 256 for 128), for [`write_mlx`].
    pub fn tiny_affine(arch: Arch, quant: &MlxQuantization, seed: u64) -> SynthSpec {
        let groups = std::iter::once(quant.default)
            .chain(quant.overrides.values().flatten().copied())
            .map(|a| a.group());
        let wide = groups.max().unwrap_or(32) > 64;
        let like = if wide { Format::Q4K } else { Format::F32 };
        SynthSpec {
            format: Format::F32,
            ..SynthSpec::tiny(arch, like, seed)
        }
    }

    /// The configuration [`write_hf`] writes for this spec.
    pub fn config(&self) -> ModelConfig {
        ModelConfig {
            arch: self.arch,
            vocab_size: self.vocab_size(),
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            layers: self.layers,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            rms_eps: 1e-6,
            rope_theta: self.rope_theta,
            rope_style: RopeStyle::Half,
            max_positions: self.max_positions,
            tied_embeddings: self.tied_embeddings,
            qkv_bias: family::of(self.arch).qkv_bias,
            qk_norm: family::of(self.arch).qk_norm,
            plan: self.plan,
        }
    }

    /// 256 byte symbols plus the control tokens.
    pub fn vocab_size(&self) -> usize {
        256 + SPECIALS.len()
    }
}

/// A tiny model's plan: small windows, so short tests cross them.
fn tiny_plan(arch: Arch, ff: usize) -> Plan {
    let window = |global_every| {
        Some(SlidingWindow {
            size: 8,
            global_every,
        })
    };
    let experts = Some(Experts {
        count: 4,
        used: 2,
        ff,
        norm_top_k: true,
    });
    let gemma = Plan {
        activation: Activation::GeluTanh,
        embed_scale: true,
        post_norms: true,
        ..Plan::default()
    };
    match arch {
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => Plan::default(),
        Arch::Qwen3Moe | Arch::Mixtral => Plan {
            experts,
            ..Plan::default()
        },
        Arch::Mistral => Plan {
            sliding_window: window(None),
            ..Plan::default()
        },
        Arch::Gemma2 => Plan {
            sliding_window: window(Some(2)),
            attn_softcap: Some(50.0),
            final_softcap: Some(30.0),
            ..gemma
        },
        Arch::Gemma3 => Plan {
            sliding_window: window(Some(6)),
            local_rope_theta: Some(10_000.0),
            ..gemma
        },
    }
}

/// GPT-2's map from bytes to printable characters.
fn byte_symbols() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = printable.into_iter().zip(chars).collect();
    pairs.sort();
    pairs
        .into_iter()
        .map(|(_, c)| char::from_u32(c).expect("valid symbol"))
        .collect()
}

fn vocab_tokens() -> Vec<String> {
    byte_symbols()
        .into_iter()
        .map(String::from)
        .chain(SPECIALS.iter().map(|s| s.to_string()))
        .collect()
}

/// The byte-level tokenizer of synthetic models.
pub fn tokenizer() -> Tokenizer {
    let vocab: tokenizers::models::bpe::Vocab = vocab_tokens()
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, Vec::new())
        .build()
        .expect("valid vocabulary");
    let mut tk = Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
    tk.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    tk.add_special_tokens(SPECIALS.map(|s| AddedToken::from(s, true)))
        .expect("valid tokens");
    tk
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        // splitmix64: a deterministic stream for a seed.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// One random tensor, by GGUF name: `experts` matrices of `rows x cols`
/// one after another (1 for a plain tensor); `matrix` is false for norms
/// and biases (1-D, f32).
struct Tensor {
    name: String,
    experts: usize,
    rows: usize,
    cols: usize,
    values: Vec<f32>,
    matrix: bool,
}

impl Tensor {
    /// Expert `e`'s values.
    fn expert(&self, e: usize) -> &[f32] {
        &self.values[e * self.rows * self.cols..][..self.rows * self.cols]
    }
}

/// Every tensor of the model.
fn tensors(spec: &SynthSpec) -> Vec<Tensor> {
    let mut rng = Rng(spec.seed);
    let (h, ff, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size());
    let (qw, kvw) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
    let fused = family::of(spec.arch).fused;
    let mut out = Vec::new();
    let mut matrices =
        |out: &mut Vec<_>, name: String, experts: usize, rows: usize, cols: usize| {
            let scale = 1.0 / (cols as f32).sqrt();
            let values = (0..experts * rows * cols)
                .map(|_| rng.next() * scale * 1.7)
                .collect();
            out.push(Tensor {
                name,
                experts,
                rows,
                cols,
                values,
                matrix: true,
            });
        };
    matrices(&mut out, "token_embd.weight".into(), 1, v, h);
    let mut norms = Vec::new();
    let c = spec.config();
    for i in 0..spec.layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        if fused {
            matrices(&mut out, n("attn_qkv.weight"), 1, qw + 2 * kvw, h);
        } else {
            matrices(&mut out, n("attn_q.weight"), 1, qw, h);
            matrices(&mut out, n("attn_k.weight"), 1, kvw, h);
            matrices(&mut out, n("attn_v.weight"), 1, kvw, h);
        }
        matrices(&mut out, n("attn_output.weight"), 1, h, qw);
        match spec.plan.experts {
            Some(e) => {
                matrices(&mut out, n("ffn_gate_inp.weight"), 1, e.count, h);
                matrices(&mut out, n("ffn_gate_exps.weight"), e.count, e.ff, h);
                matrices(&mut out, n("ffn_up_exps.weight"), e.count, e.ff, h);
                matrices(&mut out, n("ffn_down_exps.weight"), e.count, h, e.ff);
            }
            None if fused => {
                matrices(&mut out, n("ffn_up.weight"), 1, 2 * ff, h);
                matrices(&mut out, n("ffn_down.weight"), 1, h, ff);
            }
            None => {
                matrices(&mut out, n("ffn_gate.weight"), 1, ff, h);
                matrices(&mut out, n("ffn_up.weight"), 1, ff, h);
                matrices(&mut out, n("ffn_down.weight"), 1, h, ff);
            }
        }
        norms.push((n("attn_norm.weight"), h));
        norms.push((n("ffn_norm.weight"), h));
        if spec.plan.post_norms {
            norms.push((n("post_attention_norm.weight"), h));
            norms.push((n("post_ffw_norm.weight"), h));
        }
        if c.qkv_bias {
            norms.push((n("attn_q.bias"), qw));
            norms.push((n("attn_k.bias"), kvw));
            norms.push((n("attn_v.bias"), kvw));
        }
        if c.qk_norm {
            norms.push((n("attn_q_norm.weight"), spec.head_dim));
            norms.push((n("attn_k_norm.weight"), spec.head_dim));
        }
    }
    if !spec.tied_embeddings {
        matrices(&mut out, "output.weight".into(), 1, v, h);
    }
    norms.push(("output_norm.weight".into(), h));
    let mut rng = Rng(spec.seed ^ 0xA5A5);
    for (name, len) in norms {
        let bias = name.ends_with(".bias");
        let values = (0..len)
            .map(|_| {
                if bias {
                    rng.next() * 0.1
                } else {
                    1.0 + rng.next() * 0.2
                }
            })
            .collect();
        out.push(Tensor {
            name,
            experts: 1,
            rows: 1,
            cols: len,
            values,
            matrix: false,
        });
    }
    out
}

/// Whether a layout stores norm weights as `w` around zero (the forward
/// multiplies by `1 + w`): Gemma's Hugging Face files.
fn offset_norms(spec: &SynthSpec, name: &str) -> bool {
    matches!(spec.arch, Arch::Gemma2 | Arch::Gemma3) && name.ends_with("norm.weight")
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |e| ModelError::io(path, e)
}

/// The `config.json` of a spec.
fn hf_config(spec: &SynthSpec) -> serde_json::Value {
    let mut config = serde_json::json!({
        "architectures": [spec.arch.hf_class()],
        "model_type": spec.arch.name(),
        "vocab_size": spec.vocab_size(),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tied_embeddings,
        "eos_token_id": 256 + 2,
        "bos_token_id": 256,
    });
    let p = &spec.plan;
    let mut set = |k: &str, v: serde_json::Value| config[k] = v;
    if let Some(e) = p.experts {
        set("num_experts_per_tok", e.used.into());
        if spec.arch == Arch::Mixtral {
            set("num_local_experts", e.count.into());
        } else {
            set("num_experts", e.count.into());
            set("moe_intermediate_size", e.ff.into());
            set("norm_topk_prob", e.norm_top_k.into());
        }
    }
    if let Some(w) = p.sliding_window {
        set("sliding_window", w.size.into());
        if let Some(n) = w.global_every {
            set("sliding_window_pattern", n.into());
        }
    }
    if let Some(t) = p.local_rope_theta {
        set("rope_local_base_freq", t.into());
    }
    if let Some(cap) = p.attn_softcap {
        set("attn_logit_softcapping", (cap as f64).into());
    }
    if let Some(cap) = p.final_softcap {
        set("final_logit_softcapping", (cap as f64).into());
    }
    if p.embed_scale {
        set("query_pre_attn_scalar", spec.head_dim.into());
        set("hidden_activation", "gelu_pytorch_tanh".into());
    }
    config
}

/// Writes a Hugging Face directory (config.json, tokenizer.json,
/// tokenizer_config.json, model.safetensors); `spec.format` must be a float format.
pub fn write_hf(dir: &Path, spec: &SynthSpec) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let (dtype, width) = match spec.format {
        Format::F32 => (Dtype::F32, 4),
        Format::F16 => (Dtype::F16, 2),
        Format::Bf16 => (Dtype::BF16, 2),
        other => {
            return Err(ModelError::Unsupported(format!(
                "safetensors fixtures are float, not {other}"
            )))
        }
    };
    let config = hf_config(spec);
    let write = |name: &str, text: String| std::fs::write(dir.join(name), text).map_err(io(dir));
    write(
        "config.json",
        serde_json::to_string_pretty(&config).expect("json"),
    )?;
    write(
        "tokenizer_config.json",
        serde_json::to_string_pretty(&serde_json::json!({
            "chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": "<|endoftext|>",
        }))
        .expect("json"),
    )?;
    tokenizer()
        .save(dir.join("tokenizer.json"), false)
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;

    let fam = family::of(spec.arch);
    let mut bufs: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = Vec::new();
    for t in tensors(spec) {
        let (dt, fmt) = if t.matrix {
            (dtype, spec.format)
        } else {
            (Dtype::F32, Format::F32)
        };
        let names: Vec<String> = if t.experts > 1 {
            (0..t.experts)
                .map(|e| (fam.hf_expert)(&t.name, e))
                .collect()
        } else {
            vec![crate::hf::hf_name_of(&t.name, fam)]
        };
        for (e, hf) in names.into_iter().enumerate() {
            let mut vals = t.expert(e).to_vec();
            if offset_norms(spec, &t.name) {
                vals.iter_mut().for_each(|v| *v -= 1.0);
            }
            let m = Matrix::from_f32(fmt, t.rows, t.cols, &vals)?;
            let bytes: Vec<u8> = match m.storage() {
                Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::Ggml(_) | Storage::Affine(_) => unreachable!("float format"),
            };
            debug_assert_eq!(
                bytes.len(),
                t.rows * t.cols * if t.matrix { width } else { 4 }
            );
            let shape = if t.matrix {
                vec![t.rows, t.cols]
            } else {
                vec![t.cols]
            };
            bufs.push((hf, shape, bytes, dt));
        }
    }
    let views: Vec<(String, TensorView)> = bufs
        .iter()
        .map(|(n, s, b, d)| {
            (
                n.clone(),
                TensorView::new(*d, s.clone(), b).expect("consistent view"),
            )
        })
        .collect();
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| ModelError::Malformed(e.to_string()))
}

fn ggml_dtype(format: Format) -> GgmlDType {
    match format {
        Format::F32 => GgmlDType::F32,
        Format::F16 => GgmlDType::F16,
        Format::Bf16 => GgmlDType::BF16,
        Format::Q4_0 => GgmlDType::Q4_0,
        Format::Q4_1 => GgmlDType::Q4_1,
        Format::Q5_0 => GgmlDType::Q5_0,
        Format::Q5_1 => GgmlDType::Q5_1,
        Format::Q8_0 => GgmlDType::Q8_0,
        Format::Q2K => GgmlDType::Q2K,
        Format::Q3K => GgmlDType::Q3K,
        Format::Q4K => GgmlDType::Q4K,
        Format::Q5K => GgmlDType::Q5K,
        Format::Q6K => GgmlDType::Q6K,
    }
}

/// A matrix's values as GGUF stores them (little-endian floats or blocks).
fn storage_bytes(m: &Matrix) -> Vec<u8> {
    match m.storage() {
        Storage::Ggml(b) => GgmlBlocks::as_bytes(b).to_vec(),
        Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::Affine(_) => unreachable!("GGUF formats only"),
    }
}

/// The GGUF keys of a spec's plan (those llama.cpp reads).
fn plan_metadata(spec: &SynthSpec) -> Vec<(String, gguf_file::Value)> {
    use gguf_file::Value;
    let arch = spec.arch.gguf_name();
    let p = &spec.plan;
    let mut meta = Vec::new();
    let mut put = |k: &str, v: Value| meta.push((format!("{arch}.{k}"), v));
    if let Some(e) = p.experts {
        put("expert_count", Value::U32(e.count as u32));
        put("expert_used_count", Value::U32(e.used as u32));
        if spec.arch != Arch::Mixtral {
            put("expert_feed_forward_length", Value::U32(e.ff as u32));
        }
    }
    // A `llama` GGUF carries no window (Mistral's files are Llama's).
    if let Some(w) = p.sliding_window.filter(|_| arch != "llama") {
        put("attention.sliding_window", Value::U32(w.size as u32));
    }
    if let Some(cap) = p.attn_softcap {
        put("attn_logit_softcapping", Value::F32(cap));
    }
    if let Some(cap) = p.final_softcap {
        put("final_logit_softcapping", Value::F32(cap));
    }
    meta
}

/// Writes a GGUF file with the tokenizer and ChatML template in its metadata.
pub fn write_gguf(path: &Path, spec: &SynthSpec) -> Result<()> {
    use gguf_file::Value;
    let arch = spec.arch.gguf_name();
    let mut qtensors: Vec<(String, QTensor)> = Vec::new();
    for t in tensors(spec) {
        let fmt = if t.matrix { spec.format } else { Format::F32 };
        let all_rows = t.experts * t.rows;
        let bytes = storage_bytes(&Matrix::from_f32(fmt, all_rows, t.cols, &t.values)?);
        let dims = match (t.matrix, t.experts) {
            (false, _) => vec![t.cols],
            (true, 1) => vec![t.rows, t.cols],
            (true, n) => vec![n, t.rows, t.cols],
        };
        let q = qtensor_from_ggml(ggml_dtype(fmt), &bytes, dims, &candle_core::Device::Cpu)
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        qtensors.push((t.name, q));
    }
    let tokens = vocab_tokens();
    let types: Vec<Value> = (0..tokens.len())
        .map(|i| Value::I32(if i < 256 { 1 } else { 3 }))
        .collect();
    let u32v = |v: usize| Value::U32(v as u32);
    let meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.embedding_length"), u32v(spec.hidden_size)),
        (
            format!("{arch}.feed_forward_length"),
            u32v(spec.intermediate_size),
        ),
        (format!("{arch}.block_count"), u32v(spec.layers)),
        (format!("{arch}.attention.head_count"), u32v(spec.heads)),
        (
            format!("{arch}.attention.head_count_kv"),
            u32v(spec.kv_heads),
        ),
        (format!("{arch}.attention.key_length"), u32v(spec.head_dim)),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        (
            format!("{arch}.rope.freq_base"),
            Value::F32(spec.rope_theta as f32),
        ),
        (format!("{arch}.context_length"), u32v(spec.max_positions)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("gpt2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        ("tokenizer.ggml.merges".into(), Value::Array(Vec::new())),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.bos_token_id".into(), u32v(256)),
        ("tokenizer.ggml.eos_token_id".into(), u32v(258)),
        (
            "tokenizer.chat_template".into(),
            Value::String(CHATML_TEMPLATE.into()),
        ),
    ];
    let mut meta = meta;
    meta.extend(plan_metadata(spec));
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> =
        qtensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io(path))?);
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)
        .map_err(|e| ModelError::Malformed(e.to_string()))
}

/// The random tensors in memory, as f32 matrices by GGUF name.
struct MemSource(HashMap<String, (usize, usize, Vec<f32>)>);

impl TensorSource for MemSource {
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let (r, c, v) = self
            .0
            .get(name)
            .ok_or_else(|| ModelError::Malformed(format!("no synthetic tensor {name}")))?;
        if r * c != rows * cols {
            return Err(ModelError::Malformed(format!(
                "{name}: {r}x{c}, not {rows}x{cols}"
            )));
        }
        Ok(Matrix::from_f32(Format::F32, rows, cols, v)?)
    }

    fn expert(
        &mut self,
        name: &str,
        e: usize,
        count: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        let (r, c, v) = self
            .0
            .get(name)
            .ok_or_else(|| ModelError::Malformed(format!("no synthetic tensor {name}")))?;
        if *r != count * rows || *c != cols {
            return Err(ModelError::Malformed(format!("{name}: {r}x{c}")));
        }
        let mine = &v[e * rows * cols..][..rows * cols];
        Ok(Matrix::from_f32(Format::F32, rows, cols, mine)?)
    }
}

/// Writes an MLX affine checkpoint of the random model: the same f32
/// weights [`write_hf`] writes, quantized by `opts` (`spec.format` is not
/// used). Tokenizer, template and special tokens are those of `write_hf`.
pub fn write_mlx(dir: &Path, spec: &SynthSpec, opts: &QuantizeOptions) -> Result<()> {
    let map = tensors(spec)
        .into_iter()
        .map(|t| (t.name, (t.experts * t.rows, t.cols, t.values)))
        .collect();
    let model = crate::weights::build(spec.config(), &mut MemSource(map))?;
    let bundle = Bundle {
        name: "synthetic".into(),
        model,
        tokenizer: tokenizer(),
        chat_template: Some(CHATML_TEMPLATE.into()),
        bos_token: Some(SPECIALS[0].into()),
        eos_token: Some(SPECIALS[2].into()),
        eos_ids: vec![256 + 2],
        add_bos: None,
        defaults: GenerationDefaults::default(),
    };
    crate::mlx::write(&bundle, opts, dir)
}
