//! Random-weight GGUF files of real model shapes and real size, which
//! TensorFold and llama.cpp both load: how models of billions of weights
//! reach a machine that cannot download any, for side-by-side timings.
//!
//! A tensor's values come from a stream seeded by (seed, tensor, chunk of
//! rows), so the file is the same whatever the thread count. Tensors are
//! generated and quantized one at a time, their row chunks in parallel, and
//! written as soon as they are done: memory holds one quantized tensor.

use super::mix::{fallback, Role, SynthQuant};
use super::shapes::Shape;
use super::stream::{GgufStream, TensorHeader, ALIGNMENT};
use super::vocab::Vocabulary;
use super::{storage_bytes, Rng};
use crate::config::Arch;
use crate::error::{ModelError, Result};
use candle_core::quantized::gguf_file::Value;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use tensorfold_quant::{Format, Matrix};

/// Values generated and quantized as one piece of work: big enough to
/// amortize the hand-off, small enough to spread a tensor over every core.
const CHUNK_VALUES: usize = 1 << 18;

/// A random model of a real shape.
#[derive(Debug, Clone)]
pub struct ShapedSpec {
    pub shape: Shape,
    pub quant: SynthQuant,
    pub seed: u64,
}

/// A tensor stored in another format than the mix asked for, because its
/// rows are not whole k-quant super-blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct Fallback {
    pub tensor: String,
    pub cols: usize,
    pub wanted: Format,
    pub stored: Format,
}

/// What [`write_shaped_gguf`] wrote.
#[derive(Debug, Clone)]
pub struct ShapedReport {
    pub file_bytes: u64,
    pub parameters: usize,
    /// Tensor count per storage format name.
    pub formats: BTreeMap<&'static str, usize>,
    pub fallbacks: Vec<Fallback>,
}

/// How a tensor's random values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Values {
    /// Uniform at about 1/sqrt(cols), so activations keep their scale.
    Matrix,
    /// Near 1, as a trained RMSNorm weight.
    Norm,
    /// Small, as a trained bias.
    Bias,
}

struct Planned {
    header: TensorHeader,
    wanted: Format,
    values: Values,
}

impl Planned {
    /// Rows (every expert's, for a tensor of experts) and their length.
    fn rows_cols(&self) -> (usize, usize) {
        match self.header.shape[..] {
            [experts, rows, cols] => (experts * rows, cols),
            [rows, cols] => (rows, cols),
            [len] => (1, len),
            _ => unreachable!("synthetic tensors are 1-D to 3-D"),
        }
    }
}

/// Every tensor of the model in file order, with the format it is stored in.
fn plan(spec: &ShapedSpec) -> Vec<Planned> {
    let s = &spec.shape;
    let (h, ff, v) = (s.hidden_size, s.intermediate_size, s.vocab_size);
    let (qw, kvw) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut out = Vec::new();
    // A tensor of `dims` (row-major, rows of the last), stored as `role`
    // is in layer `layer`.
    let mut add = |name: String, dims: &[usize], role: Role, layer: usize| {
        let cols = *dims.last().expect("a tensor has a dimension");
        let wanted = spec.quant.target(role, layer, s.layers, s.tied_embeddings);
        let format = fallback(wanted, cols).unwrap_or(wanted);
        let (shape, values) = match role {
            Role::Vector if name.ends_with(".bias") => (vec![cols], Values::Bias),
            Role::Vector => (vec![cols], Values::Norm),
            _ => (dims.to_vec(), Values::Matrix),
        };
        out.push(Planned {
            header: TensorHeader {
                name,
                shape,
                format,
            },
            wanted,
            values,
        });
    };
    add("token_embd.weight".into(), &[v, h], Role::TokenEmbd, 0);
    for i in 0..s.layers {
        let n = |t: &str| format!("blk.{i}.{t}");
        add(n("attn_norm.weight"), &[1, h], Role::Vector, i);
        add(n("attn_q.weight"), &[qw, h], Role::AttnQ, i);
        add(n("attn_k.weight"), &[kvw, h], Role::AttnK, i);
        add(n("attn_v.weight"), &[kvw, h], Role::AttnV, i);
        if s.arch == Arch::Qwen2 {
            add(n("attn_q.bias"), &[1, qw], Role::Vector, i);
            add(n("attn_k.bias"), &[1, kvw], Role::Vector, i);
            add(n("attn_v.bias"), &[1, kvw], Role::Vector, i);
        }
        if s.qk_norm() {
            add(n("attn_q_norm.weight"), &[1, s.head_dim], Role::Vector, i);
            add(n("attn_k_norm.weight"), &[1, s.head_dim], Role::Vector, i);
        }
        add(n("attn_output.weight"), &[h, qw], Role::AttnOutput, i);
        add(n("ffn_norm.weight"), &[1, h], Role::Vector, i);
        match s.experts {
            Some(e) => {
                add(n("ffn_gate_inp.weight"), &[e.count, h], Role::Router, i);
                add(
                    n("ffn_gate_exps.weight"),
                    &[e.count, e.ff, h],
                    Role::FfnGate,
                    i,
                );
                add(n("ffn_up_exps.weight"), &[e.count, e.ff, h], Role::FfnUp, i);
                add(
                    n("ffn_down_exps.weight"),
                    &[e.count, h, e.ff],
                    Role::FfnDown,
                    i,
                );
            }
            None => {
                add(n("ffn_gate.weight"), &[ff, h], Role::FfnGate, i);
                add(n("ffn_up.weight"), &[ff, h], Role::FfnUp, i);
                add(n("ffn_down.weight"), &[h, ff], Role::FfnDown, i);
            }
        }
    }
    add("output_norm.weight".into(), &[1, h], Role::Vector, 0);
    if !s.tied_embeddings {
        add("output.weight".into(), &[v, h], Role::Output, 0);
    }
    out
}

/// The splitmix64 finalizer: a well-mixed 64-bit value of `z`.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream of one chunk of one tensor: independent of which thread
/// draws it or when.
fn chunk_rng(seed: u64, tensor: usize, chunk: usize) -> Rng {
    Rng(mix(mix(seed ^ mix(tensor as u64 + 1)) ^ chunk as u64))
}

/// The stored bytes of tensor `index`, as consecutive chunks of whole rows.
fn tensor_data(t: &Planned, seed: u64, index: usize) -> Result<Vec<Vec<u8>>> {
    let (rows, cols) = t.rows_cols();
    let rows_per_chunk = (CHUNK_VALUES / cols).max(1);
    let chunks: Vec<usize> = (0..rows).step_by(rows_per_chunk).collect();
    chunks
        .par_iter()
        .enumerate()
        .map(|(c, &first)| {
            let n = rows_per_chunk.min(rows - first);
            let mut rng = chunk_rng(seed, index, c);
            let scale = 1.7 / (cols as f32).sqrt();
            let draw = |rng: &mut Rng| match t.values {
                Values::Matrix => rng.next() * scale,
                Values::Norm => 1.0 + rng.next() * 0.2,
                Values::Bias => rng.next() * 0.1,
            };
            let vals: Vec<f32> = (0..n * cols).map(|_| draw(&mut rng)).collect();
            // GGML blocks never straddle rows, so chunks of whole rows
            // quantize to exactly the bytes of the whole tensor.
            let m = Matrix::from_f32(t.header.format, n, cols, &vals)?;
            Ok(storage_bytes(&m))
        })
        .collect()
}

fn metadata(spec: &ShapedSpec) -> Result<Vec<(String, Value)>> {
    let s = &spec.shape;
    let arch = s.arch.name();
    let u32v = |v: usize| Value::U32(v as u32);
    let mut meta = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (
            "general.name".into(),
            Value::String(format!("random-{}", s.name)),
        ),
        (
            "general.file_type".into(),
            Value::U32(spec.quant.file_type()),
        ),
        ("general.quantization_version".into(), Value::U32(2)),
        ("general.alignment".into(), u32v(ALIGNMENT)),
    ];
    let model = [
        ("vocab_size", u32v(s.vocab_size)),
        ("context_length", u32v(s.context_length)),
        ("embedding_length", u32v(s.hidden_size)),
        ("feed_forward_length", u32v(s.intermediate_size)),
        ("block_count", u32v(s.layers)),
        ("attention.head_count", u32v(s.heads)),
        ("attention.head_count_kv", u32v(s.kv_heads)),
        ("attention.key_length", u32v(s.head_dim)),
        ("attention.value_length", u32v(s.head_dim)),
        ("attention.layer_norm_rms_epsilon", Value::F32(s.rms_eps)),
        ("rope.freq_base", Value::F32(s.rope_theta)),
        ("rope.dimension_count", u32v(s.head_dim)),
    ];
    meta.extend(model.into_iter().map(|(k, v)| (format!("{arch}.{k}"), v)));
    if let Some(e) = s.experts {
        let experts = [
            ("expert_count", u32v(e.count)),
            ("expert_used_count", u32v(e.used)),
            ("expert_feed_forward_length", u32v(e.ff)),
        ];
        meta.extend(experts.into_iter().map(|(k, v)| (format!("{arch}.{k}"), v)));
    }
    meta.extend(Vocabulary::new(s.vocab_size)?.metadata(s.pre_tokenizer));
    Ok(meta)
}

/// Writes header and data to `path`; returns the file's size.
fn write_all(path: &Path, spec: &ShapedSpec, tensors: &[Planned]) -> Result<u64> {
    let io = |e| ModelError::io(path, e);
    let headers: Vec<TensorHeader> = tensors.iter().map(|t| t.header.clone()).collect();
    let file = std::fs::File::create(path).map_err(io)?;
    let out = std::io::BufWriter::with_capacity(8 << 20, file);
    let mut gguf = GgufStream::new(out, &metadata(spec)?, &headers).map_err(io)?;
    for (index, t) in tensors.iter().enumerate() {
        gguf.tensor(&tensor_data(t, spec.seed, index)?)
            .map_err(io)?;
    }
    let out = gguf.finish().map_err(io)?;
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(file.metadata().map_err(io)?.len())
}

/// Writes the random model `spec` describes to `path` (through
/// `path.partial`, renamed when complete, so a broken run leaves no file
/// that looks whole).
pub fn write_shaped_gguf(path: &Path, spec: &ShapedSpec) -> Result<ShapedReport> {
    let s = &spec.shape;
    if s.layers == 0 || s.heads == 0 || s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
        return Err(ModelError::Unsupported(format!(
            "{}: {} layers, {} heads over {} kv heads is not a runnable shape",
            s.name, s.layers, s.heads, s.kv_heads
        )));
    }
    let tensors = plan(spec);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| ModelError::io(parent, e))?;
    }
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let file_bytes = write_all(&partial, spec, &tensors).inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    std::fs::rename(&partial, path).map_err(|e| ModelError::io(path, e))?;

    let mut formats = BTreeMap::new();
    let mut fallbacks = Vec::new();
    for t in &tensors {
        *formats.entry(t.header.format.name()).or_insert(0) += 1;
        if t.header.format != t.wanted {
            fallbacks.push(Fallback {
                tensor: t.header.name.clone(),
                cols: t.rows_cols().1,
                wanted: t.wanted,
                stored: t.header.format,
            });
        }
    }
    Ok(ShapedReport {
        file_bytes,
        parameters: tensors
            .iter()
            .map(|t| t.header.shape.iter().product::<usize>())
            .sum(),
        formats,
        fallbacks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Experts;
    use crate::{GgufFile, Logits};

    /// A Llama whose rows are all whole k-quant super-blocks, small enough
    /// to write and run in a unit test.
    fn small(layers: usize) -> Shape {
        Shape {
            name: "test-256",
            vocab_size: 512,
            hidden_size: 256,
            intermediate_size: 512,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            ..Shape::named("llama3.2-1b").unwrap()
        }
        .with_layers(layers)
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("tensorfold-synth-{}-{name}", std::process::id()))
    }

    fn formats_of(path: &Path) -> BTreeMap<String, Format> {
        let f = GgufFile::open(path).unwrap();
        f.tensors()
            .unwrap()
            .into_iter()
            .map(|(n, _, f)| (n, f))
            .collect()
    }

    #[test]
    fn q4_k_m_is_llama_cpps_mix_and_the_model_runs() {
        let path = tmp("q4km.gguf");
        let spec = ShapedSpec {
            shape: small(8),
            quant: SynthQuant::Q4KM,
            seed: 5,
        };
        let report = write_shaped_gguf(&path, &spec).unwrap();
        assert!(report.fallbacks.is_empty(), "{:?}", report.fallbacks);
        assert_eq!(report.parameters, spec.shape.parameters());
        assert_eq!(report.file_bytes, std::fs::metadata(&path).unwrap().len());
        let formats = formats_of(&path);
        // Tied: the embeddings are the head, and get the head's Q6_K.
        assert_eq!(formats["token_embd.weight"], Format::Q6K);
        for i in 0..8 {
            let more = [0, 3, 6, 7].contains(&i);
            let want = if more { Format::Q6K } else { Format::Q4K };
            assert_eq!(formats[&format!("blk.{i}.attn_v.weight")], want, "{i}");
            assert_eq!(formats[&format!("blk.{i}.ffn_down.weight")], want, "{i}");
            assert_eq!(formats[&format!("blk.{i}.attn_q.weight")], Format::Q4K);
            assert_eq!(formats[&format!("blk.{i}.attn_norm.weight")], Format::F32);
        }
        let file = GgufFile::open(&path).unwrap();
        let md = file.metadata();
        assert_eq!(md.usize("general.file_type"), Some(15));
        assert_eq!(md.str("general.name"), Some("random-test-256"));
        assert_eq!(md.str("tokenizer.ggml.pre"), Some("llama3"));
        let bundle = crate::load(&path).unwrap();
        assert_eq!(bundle.eos_ids, [511], "<|im_end|> ends a reply");
        let mut cache = tensorfold_kv::KvCache::new(bundle.model.config.kv_shape());
        let logits = bundle.model.forward(&[1, 2, 3], &mut cache, Logits::Last);
        assert!(logits.iter().all(|x| x.is_finite()));
        std::fs::remove_file(&path).unwrap();
    }

    /// The mixture-of-experts shape, small: its experts go in one tensor
    /// each, as llama.cpp stores them, the router stays f32, and the model
    /// loads with the file's expert counts and runs.
    #[test]
    fn a_mixture_of_experts_writes_llama_cpps_tensors_and_runs() {
        let path = tmp("moe.gguf");
        let full = Shape::named("qwen3-30b-a3b").unwrap();
        let spec = ShapedSpec {
            shape: Shape {
                name: "test-moe",
                vocab_size: 512,
                hidden_size: 256,
                heads: 4,
                kv_heads: 2,
                head_dim: 128,
                experts: full.experts.map(|e| Experts {
                    count: 8,
                    used: 2,
                    ff: 256,
                    ..e
                }),
                ..full
            }
            .with_layers(2),
            quant: SynthQuant::Q4KM,
            seed: 3,
        };
        let report = write_shaped_gguf(&path, &spec).unwrap();
        assert_eq!(report.parameters, spec.shape.parameters());
        let file = GgufFile::open(&path).unwrap();
        let shapes: BTreeMap<String, Vec<usize>> = file
            .tensors()
            .unwrap()
            .into_iter()
            .map(|(n, shape, _)| (n, shape))
            .collect();
        assert_eq!(shapes["blk.1.ffn_gate_exps.weight"], [8, 256, 256]);
        assert_eq!(shapes["blk.1.ffn_down_exps.weight"], [8, 256, 256]);
        assert_eq!(shapes["blk.1.attn_q_norm.weight"], [128]);
        let formats = formats_of(&path);
        assert_eq!(formats["blk.0.ffn_gate_inp.weight"], Format::F32);
        assert_eq!(formats["blk.0.ffn_up_exps.weight"], Format::Q4K);
        // Of two layers, `use_more_bits` picks the last.
        assert_eq!(formats["blk.0.ffn_down_exps.weight"], Format::Q4K);
        assert_eq!(formats["blk.1.ffn_down_exps.weight"], Format::Q6K);
        assert_eq!(file.metadata().usize("qwen3moe.expert_used_count"), Some(2));
        let bundle = crate::load(&path).unwrap();
        let plan = bundle.model.config.plan;
        assert_eq!(
            plan.experts.map(|e| (e.count, e.used, e.ff)),
            Some((8, 2, 256))
        );
        let mut cache = tensorfold_kv::KvCache::new(bundle.model.config.kv_shape());
        let logits = bundle.model.forward(&[1, 2, 3], &mut cache, Logits::Last);
        assert!(logits.iter().all(|x| x.is_finite()));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_file_depends_on_the_seed_alone_not_the_thread_count() {
        let spec = ShapedSpec {
            // Enough embedding rows for several chunks.
            shape: Shape {
                vocab_size: 3000,
                ..small(2)
            },
            quant: SynthQuant::Uniform(Format::Q8_0),
            seed: 9,
        };
        let write = |name: &str, threads: usize, seed: u64| {
            let path = tmp(name);
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let spec = ShapedSpec {
                seed,
                ..spec.clone()
            };
            pool.install(|| write_shaped_gguf(&path, &spec)).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            bytes
        };
        let one = write("t1.gguf", 1, 9);
        assert_eq!(one, write("t3.gguf", 3, 9));
        assert_ne!(one, write("seed.gguf", 3, 10));
    }

    #[test]
    fn unrunnable_shapes_are_refused() {
        let spec = ShapedSpec {
            shape: small(0),
            quant: SynthQuant::Uniform(Format::F32),
            seed: 0,
        };
        assert!(write_shaped_gguf(&tmp("none.gguf"), &spec).is_err());
    }
}
