//! A GGUF (version 3) writer that takes tensor data one tensor at a time,
//! so a file of many gigabytes is written without holding its weights.
//!
//! The header names every tensor with its shape, type and offset up front;
//! sizes follow from shape and type, so the data can come later, in order.

use candle_core::quantized::gguf_file::Value;
use std::io::{self, Write};
use tensorfold_quant::Format;

const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;
/// GGUF's default alignment of the data section and of every tensor in it.
pub(crate) const ALIGNMENT: usize = 32;

/// A tensor as the header describes it.
#[derive(Clone)]
pub(crate) struct TensorHeader {
    pub name: String,
    /// Row-major shape: `[rows, cols]`, or `[len]` for a vector.
    pub shape: Vec<usize>,
    pub format: Format,
}

impl TensorHeader {
    pub fn bytes(&self) -> usize {
        let cols = *self.shape.last().expect("a tensor has a dimension");
        let rows: usize = self.shape.iter().rev().skip(1).product();
        self.format.matrix_bytes(rows, cols)
    }
}

/// GGML's type ids (`enum ggml_type`).
fn ggml_type(format: Format) -> u32 {
    match format {
        Format::F32 => 0,
        Format::F16 => 1,
        Format::Q4_0 => 2,
        Format::Q4_1 => 3,
        Format::Q5_0 => 6,
        Format::Q5_1 => 7,
        Format::Q8_0 => 8,
        Format::Q2K => 10,
        Format::Q3K => 11,
        Format::Q4K => 12,
        Format::Q5K => 13,
        Format::Q6K => 14,
        Format::Bf16 => 30,
    }
}

fn padding(len: usize) -> usize {
    (ALIGNMENT - len % ALIGNMENT) % ALIGNMENT
}

/// Writes the header, then takes each tensor's bytes in header order.
pub(crate) struct GgufStream<W: Write> {
    out: W,
    /// Data bytes of each tensor, and how many have been written.
    sizes: Vec<usize>,
    written: usize,
}

impl<W: Write> GgufStream<W> {
    pub fn new(
        mut out: W,
        metadata: &[(String, Value)],
        tensors: &[TensorHeader],
    ) -> io::Result<Self> {
        let mut header = Vec::new();
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_string(&mut header, key);
            header.extend_from_slice(&value_type(value).to_le_bytes());
            put_value(&mut header, value)?;
        }
        let mut offset = 0usize;
        for t in tensors {
            put_string(&mut header, &t.name);
            header.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            // GGML lists dimensions fastest first: columns, then rows.
            for &d in t.shape.iter().rev() {
                header.extend_from_slice(&(d as u64).to_le_bytes());
            }
            header.extend_from_slice(&ggml_type(t.format).to_le_bytes());
            header.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += t.bytes() + padding(t.bytes());
        }
        header.resize(header.len() + padding(header.len()), 0);
        out.write_all(&header)?;
        Ok(GgufStream {
            out,
            sizes: tensors.iter().map(TensorHeader::bytes).collect(),
            written: 0,
        })
    }

    /// Writes the next tensor's data, given as consecutive parts.
    pub fn tensor(&mut self, parts: &[Vec<u8>]) -> io::Result<()> {
        let expected = *self
            .sizes
            .get(self.written)
            .ok_or_else(|| invalid("more tensors than the header names"))?;
        let got: usize = parts.iter().map(Vec::len).sum();
        if got != expected {
            return Err(invalid(&format!(
                "tensor data is {got} bytes, the header says {expected}"
            )));
        }
        for p in parts {
            self.out.write_all(p)?;
        }
        self.out.write_all(&[0u8; ALIGNMENT][..padding(got)])?;
        self.written += 1;
        Ok(())
    }

    /// Checks every tensor was written and flushes.
    pub fn finish(mut self) -> io::Result<W> {
        if self.written < self.sizes.len() {
            return Err(invalid("fewer tensors than the header names"));
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// GGUF's metadata value types (`enum gguf_type`).
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(buf: &mut Vec<u8>, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_string(buf, s),
        Value::Array(items) => {
            // An empty array's element type is never read; GGUF wants one anyway.
            let kind = items.first().map_or(4, value_type);
            if items.iter().any(|i| value_type(i) != kind) {
                return Err(invalid("a GGUF array holds one value type"));
            }
            buf.extend_from_slice(&kind.to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                put_value(buf, i)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::Content;

    #[test]
    fn candle_reads_back_what_the_stream_writes() {
        let meta = vec![
            ("general.name".to_string(), Value::String("x".into())),
            (
                "a.list".to_string(),
                Value::Array(vec![Value::I32(1), Value::I32(-2)]),
            ),
            ("a.eps".to_string(), Value::F32(1e-5)),
        ];
        let tensors = [
            TensorHeader {
                name: "m".into(),
                shape: vec![2, 32],
                format: Format::Q8_0,
            },
            TensorHeader {
                name: "v".into(),
                shape: vec![3],
                format: Format::F32,
            },
        ];
        let mut w = GgufStream::new(Vec::new(), &meta, &tensors).unwrap();
        let block = vec![7u8; 34];
        w.tensor(&[block.clone(), block]).unwrap();
        assert!(w.tensor(&[vec![0u8; 8]]).is_err(), "3 f32 are 12 bytes");
        w.tensor(&[vec![0u8; 4], vec![1u8; 8]]).unwrap();
        let bytes = w.finish().unwrap();
        let content = Content::read(&mut std::io::Cursor::new(&bytes)).unwrap();
        assert_eq!(content.metadata["a.list"].to_vec().unwrap().len(), 2);
        let m = &content.tensor_infos["m"];
        assert_eq!(m.shape.dims(), [2, 32]);
        let v = &content.tensor_infos["v"];
        assert_eq!(content.tensor_data_offset as usize % ALIGNMENT, 0);
        let at = content.tensor_data_offset as usize + v.offset as usize;
        assert_eq!(&bytes[at..at + 12], &[0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]);
    }
}
