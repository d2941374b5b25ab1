//! A byte-level BPE vocabulary of any size that both TensorFold and
//! llama.cpp load from GGUF metadata.
//!
//! Ids 0..256 are GPT-2's byte symbols, so any text encodes; 256 is `ĠĠ`,
//! made by the one merge `Ġ Ġ` (llama.cpp refuses a BPE vocabulary without
//! merges); then filler tokens no merge produces, which only fill the
//! vocabulary to the model's real size and decode as ` t<id>`; the last
//! three are the ChatML control tokens.

use super::{byte_symbols, CHATML_TEMPLATE, SPECIALS};
use crate::error::{ModelError, Result};
use candle_core::quantized::gguf_file::Value;

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;

/// The strings, types and merges of the vocabulary, and its BOS and EOS ids.
pub(crate) struct Vocabulary {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: u32,
    pub eos: u32,
}

impl Vocabulary {
    /// The vocabulary of exactly `size` tokens.
    pub fn new(size: usize) -> Result<Vocabulary> {
        let fixed = 256 + 1 + SPECIALS.len();
        if size < fixed {
            return Err(ModelError::Unsupported(format!(
                "a synthetic vocabulary needs at least {fixed} tokens, not {size}"
            )));
        }
        let mut tokens: Vec<String> = byte_symbols().into_iter().map(String::from).collect();
        tokens.push("ĠĠ".into());
        let fillers = tokens.len()..size - SPECIALS.len();
        tokens.extend(fillers.map(|id| format!("Ġt{id}")));
        let first_special = tokens.len() as u32;
        tokens.extend(SPECIALS.iter().map(|s| s.to_string()));
        let types = (0..size)
            .map(|id| {
                if id >= size - SPECIALS.len() {
                    CONTROL
                } else {
                    NORMAL
                }
            })
            .collect();
        Ok(Vocabulary {
            tokens,
            types,
            merges: vec!["Ġ Ġ".into()],
            // <|endoftext|> and <|im_end|>, as Qwen's chat models use them.
            bos: first_special,
            eos: first_special + 2,
        })
    }

    /// The `tokenizer.*` metadata entries for a model whose pre-tokenizer
    /// llama.cpp calls `pre`.
    pub fn metadata(self, pre: &str) -> Vec<(String, Value)> {
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        vec![
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
            ("tokenizer.ggml.tokens".into(), strings(self.tokens)),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(self.types.into_iter().map(Value::I32).collect()),
            ),
            ("tokenizer.ggml.merges".into(), strings(self.merges)),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(self.bos)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(self.eos)),
            // Said outright: llama.cpp would otherwise add BOS for llama3,
            // and both engines should see the same prompt tokens.
            ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
            (
                "tokenizer.chat_template".into(),
                Value::String(CHATML_TEMPLATE.into()),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Metadata;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn tokenizer(size: usize, pre: &str) -> tokenizers::Tokenizer {
        let md: HashMap<String, Value> = Vocabulary::new(size)
            .unwrap()
            .metadata(pre)
            .into_iter()
            .collect();
        crate::tokenizer::from_gguf(&Metadata(&md)).unwrap()
    }

    #[test]
    fn the_vocabulary_has_the_asked_size_one_merge_and_chatml_at_the_end() {
        let v = Vocabulary::new(49_152).unwrap();
        assert_eq!((v.tokens.len(), v.types.len()), (49_152, 49_152));
        assert_eq!(v.merges, ["Ġ Ġ"]);
        let distinct: std::collections::HashSet<_> = v.tokens.iter().collect();
        assert_eq!(distinct.len(), v.tokens.len(), "token strings are unique");
        assert_eq!(v.tokens[v.eos as usize], "<|im_end|>");
        assert_eq!(v.tokens[v.bos as usize], "<|endoftext|>");
        assert_eq!(v.tokens[49_152 - 2], "<|im_start|>");
        assert_eq!(v.types.iter().filter(|t| **t == CONTROL).count(), 3);
        assert!(Vocabulary::new(259).is_err());
    }

    #[test]
    fn the_merge_joins_two_spaces_and_specials_stay_whole() {
        let tk = tokenizer(1000, "qwen2");
        let ids = tk.encode("a    <|im_end|>", false).unwrap();
        // Byte 'a' is id 97; four spaces are two merged pairs.
        assert_eq!(ids.get_ids(), [97, 256, 256, 999], "{:?}", ids.get_tokens());
        assert_eq!(tk.decode(&[300], false).unwrap(), " t300");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn tensorfolds_tokenizer_round_trips_any_text(text in any::<String>(), pre in 0usize..3) {
            let pre = ["llama3", "qwen2", "smollm"][pre];
            let tk = tokenizer(600, pre);
            let ids = tk.encode(text.as_str(), false).unwrap();
            prop_assert_eq!(tk.decode(ids.get_ids(), false).unwrap(), text);
        }
    }
}
