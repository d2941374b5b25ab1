//! Tokenizers built from what a model ships: a `tokenizer.json`, a
//! character vocabulary (`vocab.json`), or a GGUF file's BPE metadata.

use crate::error::{ModelError, Result};
use crate::gguf::Metadata;
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::models::bpe::BPE;
use tokenizers::models::ModelWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// The BPE word cache of `tokenizers` lives in thread-locals keyed by model
/// instance and outlives the model: every tokenizer built and used on a
/// thread left up to 10,000 cached words behind it forever (a process
/// loading models grew without bound). Tokenizers here keep no cache:
/// merging a word is cheap next to a forward pass.
const BPE_CACHE_CAPACITY: usize = 0;

/// GPT-2 style word splitting with one digit per piece (SmolLM).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn regex_split(pattern: &str) -> Result<PreTokenizerWrapper> {
    let split = Split::new(
        SplitPattern::Regex(pattern.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(tok_err)?;
    Ok(PreTokenizerWrapper::Split(split))
}

/// The pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let bytes = |regex| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, regex));
    Ok(match pre {
        "qwen2" | "deepseek-r1-qwen" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            regex_split(QWEN2_PATTERN)?,
            bytes(false),
        ])),
        "llama-bpe" | "llama3" | "smaug-bpe" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            regex_split(LLAMA3_PATTERN)?,
            bytes(false),
        ])),
        "smollm" | "starcoder" | "refact" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            bytes(true),
        ])),
        _ => bytes(true),
    })
}

/// Builds the byte-level BPE tokenizer a GGUF file describes.
pub(crate) fn from_gguf(md: &Metadata) -> Result<Tokenizer> {
    let model = md.str("tokenizer.ggml.model").unwrap_or("gpt2");
    if model != "gpt2" {
        return Err(ModelError::Unsupported(format!(
            "GGUF tokenizer model '{model}' is not supported (supported: gpt2 byte-level BPE)"
        )));
    }
    let tokens = md
        .strings("tokenizer.ggml.tokens")
        .ok_or_else(|| tok_err("GGUF has no tokenizer.ggml.tokens"))?;
    if tokens.len() > u32::MAX as usize {
        return Err(tok_err("GGUF has more tokens than 32-bit ids can name"));
    }
    let merges = md.strings("tokenizer.ggml.merges").unwrap_or_default();
    let types = md.ints("tokenizer.ggml.token_type").unwrap_or_default();
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let merges: Vec<(String, String)> = merges
        .iter()
        .filter_map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
        })
        .collect();
    // Every merge must join two tokens into a third: the BPE builder
    // assumes the joined token fits the longest one it has.
    if let Some((a, b)) = merges.iter().find(|(a, b)| {
        !(vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}")))
    }) {
        return Err(tok_err(format!(
            "GGUF merge '{a} {b}' joins tokens that are not in the vocabulary"
        )));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .cache_capacity(BPE_CACHE_CAPACITY)
        .build()
        .map_err(tok_err)?;
    let mut tk = Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(pre_tokenizer(
        md.str("tokenizer.ggml.pre").unwrap_or("gpt2"),
    )?));
    tk.with_decoder(Some(ByteLevelDecoder::default()));
    // Control (3) tokens are special; user-defined (4) ones are matched
    // whole but kept in decoded text.
    if types.len() > tokens.len() {
        return Err(tok_err(format!(
            "GGUF has {} token types for {} tokens",
            types.len(),
            tokens.len()
        )));
    }
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, t)| **t == 3 || **t == 4)
        .map(|(token, t)| AddedToken::from(token.to_string(), *t == 3))
        .collect();
    tk.add_special_tokens(added).map_err(tok_err)?;
    Ok(tk)
}

/// A character-level tokenizer from `vocab.json` (mathformer): every
/// character is one token, `<...>` entries are special.
pub(crate) fn from_char_vocab(path: &Path, unk: Option<&str>) -> Result<Tokenizer> {
    let json = crate::hf::read_json(path)?;
    let map = json
        .as_object()
        .ok_or_else(|| tok_err("vocab.json is not an object"))?;
    let vocab: tokenizers::models::bpe::Vocab = map
        .iter()
        .filter_map(|(k, v)| v.as_u64().map(|id| (k.clone(), id as u32)))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab.clone(), Vec::new())
        .cache_capacity(BPE_CACHE_CAPACITY);
    if let Some(unk) = unk.filter(|u| vocab.contains_key(*u)) {
        builder = builder.unk_token(unk.to_string());
    }
    let mut tk = Tokenizer::new(builder.build().map_err(tok_err)?);
    tk.with_decoder(Some(Fuse::new()));
    let special: Vec<AddedToken> = vocab
        .keys()
        .filter(|k| k.len() > 1 && k.starts_with('<') && k.ends_with('>'))
        .map(|k| AddedToken::from(k.clone(), true))
        .collect();
    tk.add_special_tokens(special).map_err(tok_err)?;
    Ok(tk)
}

pub(crate) fn from_file(path: &Path) -> Result<Tokenizer> {
    let mut tk = Tokenizer::from_file(path)
        .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
    // `tokenizer.json` cannot say "no cache": a capacity of 0 stores no
    // words (each thread keeps only an empty map per loaded model).
    if let ModelWrapper::BPE(bpe) = tk.get_model() {
        let mut bpe = bpe.clone();
        bpe.resize_cache(BPE_CACHE_CAPACITY);
        tk.with_model(bpe);
    }
    Ok(tk)
}
