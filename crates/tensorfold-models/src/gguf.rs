//! GGUF files: header, configuration, tensors and tokenizer metadata.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::family;
use crate::gguf_scan;
use crate::weights::TensorSource;
use candle_core::quantized::gguf_file::{Content, Value};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use tensorfold_quant::{Format, Matrix};

/// An open GGUF file whose header has been read (no tensor data yet).
pub struct GgufFile {
    path: PathBuf,
    file: BufReader<File>,
    content: Content,
}

/// A value of the metadata as the few shapes TensorFold reads.
pub(crate) struct Metadata<'a>(pub &'a HashMap<String, Value>);

impl Metadata<'_> {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    pub fn usize(&self, key: &str) -> Option<usize> {
        match self.get(key)? {
            Value::U8(v) => Some(*v as usize),
            Value::U16(v) => Some(*v as usize),
            Value::U32(v) => Some(*v as usize),
            Value::U64(v) => Some(*v as usize),
            Value::I32(v) if *v >= 0 => Some(*v as usize),
            Value::I64(v) if *v >= 0 => Some(*v as usize),
            _ => None,
        }
    }

    pub fn f64(&self, key: &str) -> Option<f64> {
        match self.get(key)? {
            Value::F32(v) => Some(*v as f64),
            Value::F64(v) => Some(*v),
            _ => None,
        }
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn strings(&self, key: &str) -> Option<Vec<&str>> {
        match self.get(key)? {
            Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    pub fn ints(&self, key: &str) -> Option<Vec<i64>> {
        match self.get(key)? {
            Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    Value::I32(x) => Some(*x as i64),
                    Value::U32(x) => Some(*x as i64),
                    Value::I8(x) => Some(*x as i64),
                    Value::U8(x) => Some(*x as i64),
                    Value::I64(x) => Some(*x),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }
}

impl GgufFile {
    /// Reads the header; refuses a file that is not GGUF or is truncated.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        let mut file = BufReader::new(file);
        let in_file = |e: ModelError| {
            ModelError::Malformed(format!("{}: not a readable GGUF file: {e}", path.display()))
        };
        let layout = gguf_scan::scan(&mut file).map_err(in_file)?;
        let content = Content::read(&mut file).map_err(|e| {
            // candle appends a backtrace when RUST_BACKTRACE is set: keep the message.
            let e = e.to_string();
            let first = e.lines().next().unwrap_or_default();
            ModelError::Malformed(format!(
                "{}: not a readable GGUF file: {first}",
                path.display()
            ))
        })?;
        let file_len = file
            .get_ref()
            .metadata()
            .map_err(|e| ModelError::io(path, e))?
            .len();
        check_tensors(&content, layout.alignment, file_len).map_err(in_file)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            file,
            content,
        })
    }

    pub(crate) fn metadata(&self) -> Metadata<'_> {
        Metadata(&self.content.metadata)
    }

    /// Every tensor's name, shape (rows, cols) and format.
    pub fn tensors(&self) -> Result<Vec<(String, Vec<usize>, Format)>> {
        let mut out = Vec::new();
        for (name, info) in &self.content.tensor_infos {
            let format = Format::from_ggml(info.ggml_dtype).ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "tensor {name} is {:?}, a quant type TensorFold does not run \
                     (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)",
                    info.ggml_dtype
                ))
            })?;
            out.push((name.clone(), info.shape.dims().to_vec(), format));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// The model configuration from the metadata alone.
    pub fn config(&self) -> Result<ModelConfig> {
        let md = self.metadata();
        let arch_name = md.str("general.architecture").ok_or_else(|| {
            ModelError::Malformed("GGUF metadata lacks general.architecture".into())
        })?;
        let fam = family::by_gguf(arch_name, &md).ok_or_else(|| {
            ModelError::Unsupported(format!(
                "architecture '{arch_name}' is not supported (supported: {})",
                family::supported()
            ))
        })?;
        if let Some(kind) = md.str(&format!("{arch_name}.rope.scaling.type")) {
            if kind != "none" {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling '{kind}' is not supported"
                )));
            }
        }
        let need = |k: &str| {
            md.usize(&format!("{arch_name}.{k}")).ok_or_else(|| {
                ModelError::Malformed(format!("GGUF metadata lacks {arch_name}.{k}"))
            })
        };
        let hidden = need("embedding_length")?;
        let heads = need("attention.head_count")?;
        let embd = self
            .content
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| {
                ModelError::Malformed("GGUF file has no token_embd.weight tensor".into())
            })?;
        let vocab = embd.shape.dims().first().copied().unwrap_or(0);
        let head_dim = md
            .usize(&format!("{arch_name}.attention.key_length"))
            .unwrap_or(hidden / heads.max(1));
        let plan = (fam.gguf_plan)(&md)?;
        if let Some(n) = md
            .usize(&format!("{arch_name}.expert_count"))
            .filter(|n| *n > 0 && plan.experts.is_none())
        {
            return Err(ModelError::Unsupported(format!(
                "architecture '{arch_name}' with {n} experts: TensorFold routes experts only \
                 for {}",
                family::with_experts()
            )));
        }
        let dense_ff = match plan.experts {
            // An MoE file may state no dense width: the blocks have none.
            Some(_) => md
                .usize(&format!("{arch_name}.feed_forward_length"))
                .unwrap_or(0),
            None => need("feed_forward_length")?,
        };
        Ok(ModelConfig {
            arch: fam.arch,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: dense_ff,
            layers: need("block_count")?,
            heads,
            kv_heads: md
                .usize(&format!("{arch_name}.attention.head_count_kv"))
                .unwrap_or(heads),
            head_dim,
            rms_eps: md
                .f64(&format!("{arch_name}.attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
            rope_theta: md
                .f64(&format!("{arch_name}.rope.freq_base"))
                .unwrap_or(10_000.0),
            rope_style: fam.gguf_rope,
            max_positions: need("context_length")?,
            tied_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
            qkv_bias: fam.qkv_bias,
            qk_norm: fam.qk_norm,
            plan,
        })
    }

    /// The tokenizer the metadata describes.
    pub fn tokenizer(&self) -> Result<tokenizers::Tokenizer> {
        crate::tokenizer::from_gguf(&self.metadata())
    }

    pub fn chat_template(&self) -> Option<String> {
        self.metadata()
            .str("tokenizer.chat_template")
            .map(str::to_owned)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Every tensor's shape, block layout and data must lie inside the file,
/// aligned as the header says.
fn check_tensors(content: &Content, alignment: u64, file_len: u64) -> Result<()> {
    for (name, info) in &content.tensor_infos {
        let bad = |what: String| Err(ModelError::Malformed(format!("tensor {name}: {what}")));
        let dims = info.shape.dims();
        let Some(elems) = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) else {
            return bad(format!("shape {dims:?} overflows"));
        };
        if info.offset % alignment != 0 {
            return bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                info.offset
            ));
        }
        // Unsupported formats are refused by name in `tensors`.
        let Some(format) = Format::from_ggml(info.ggml_dtype) else {
            continue;
        };
        let row = dims.last().copied().unwrap_or(1);
        if !row.is_multiple_of(format.block_elems()) {
            return bad(format!(
                "rows of {row} values do not fill {} blocks of {}",
                format.name(),
                format.block_elems()
            ));
        }
        let bytes =
            ((elems / format.block_elems()) as u64).checked_mul(format.block_bytes() as u64);
        let end = content
            .tensor_data_offset
            .checked_add(info.offset)
            .zip(bytes)
            .and_then(|(start, bytes)| start.checked_add(bytes));
        if end.is_none_or(|end| end > file_len) {
            return bad("truncated: its data lies past the end of the file".into());
        }
    }
    Ok(())
}

impl GgufFile {
    /// Reads `rows x cols` elements of tensor `name` from its element
    /// `first_row * cols` on.
    fn read_rows(
        &mut self,
        name: &str,
        total_rows: usize,
        first_row: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| ModelError::Malformed(format!("GGUF file has no tensor {name}")))?;
        let elems = info.shape.elem_count();
        if elems != total_rows * cols || info.shape.dims().last() != Some(&cols) {
            return Err(ModelError::Malformed(format!(
                "tensor {name} has shape {:?}, expected {total_rows}x{cols}",
                info.shape.dims()
            )));
        }
        let format = Format::from_ggml(info.ggml_dtype).ok_or_else(|| {
            ModelError::Unsupported(format!("tensor {name}: {:?}", info.ggml_dtype))
        })?;
        let mut bytes = vec![0u8; format.matrix_bytes(rows, cols)];
        let start = self.content.tensor_data_offset
            + info.offset
            + format.matrix_bytes(first_row, cols) as u64;
        let path = self.path.clone();
        self.file
            .seek(SeekFrom::Start(start))
            .map_err(|e| ModelError::io(&path, e))?;
        self.file.read_exact(&mut bytes).map_err(|e| {
            ModelError::Malformed(format!(
                "{}: tensor {name} is truncated: {e}",
                path.display()
            ))
        })?;
        Ok(Matrix::from_bytes(format, rows, cols, &bytes)?)
    }
}

impl TensorSource for GgufFile {
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.read_rows(name, rows, 0, rows, cols)
    }

    /// Every expert's matrix lies whole in one 3-D tensor, expert after expert.
    fn expert(
        &mut self,
        name: &str,
        e: usize,
        count: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        self.read_rows(name, count * rows, e * rows, rows, cols)
    }
}
