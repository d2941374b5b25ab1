//! Constrained decoding with llguidance: a [`Grammar`] (a JSON schema, any
//! JSON object, a Lark or GBNF grammar, a regular expression) compiled for
//! the model's vocabulary, and the per-reply [`Constraint`] that masks each
//! row's logits.
//!
//! Exactness: a row's mask is a function of the reply tokens before it
//! alone. The matcher holds the accepted tokens plus, while a round's rows
//! are picked, the drafts whose rows were already picked equal to them, so
//! a drafted row is masked as serial decode masks the same position.

use crate::engine::{Engine, EngineError};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// What a reply must match, before compilation.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON schema (`response_format: json_schema`).
    JsonSchema(serde_json::Value),
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// llguidance's Lark dialect, or GBNF (rules written `name ::= ...`).
    Grammar(String),
    /// A regular expression the whole reply matches.
    Regex(String),
}

/// A grammar compiled for one engine's vocabulary; each reply clones it.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    spec: Arc<GrammarSpec>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("spec", &self.spec).finish()
    }
}

impl Grammar {
    pub fn spec(&self) -> &GrammarSpec {
        &self.spec
    }
}

/// The parser factory for a vocabulary: built once per engine.
pub(crate) struct Compiler {
    factory: ParserFactory,
}

impl Compiler {
    /// Reads the model's tokenizer into llguidance's token trie; the
    /// model's end-of-reply ids are the trie's EOS tokens.
    pub(crate) fn new(engine: &Engine) -> Result<Compiler, String> {
        let bundle = engine.bundle();
        let json = bundle
            .tokenizer
            .to_string(false)
            .map_err(|e| format!("tokenizer: {e}"))?;
        let mut byte_tokenizer =
            toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes())
                .map_err(|e| format!("this model's tokenizer cannot drive a grammar: {e}"))?;
        if !bundle.eos_ids.is_empty() {
            byte_tokenizer.set_eos_tokens(&bundle.eos_ids);
        }
        let env: TokEnv = byte_tokenizer
            .into_tok_env(Some(bundle.model.config.vocab_size))
            .map_err(|e| format!("token trie: {e}"))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Compiler { factory })
    }

    pub(crate) fn compile(&self, spec: GrammarSpec) -> Result<Grammar, EngineError> {
        let top = match &spec {
            GrammarSpec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema.clone()),
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"}))
            }
            GrammarSpec::Grammar(text) if is_gbnf(text) => {
                TopLevelGrammar::from_lark(gbnf_to_lark(text))
            }
            GrammarSpec::Grammar(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| EngineError::Invalid(format!("the grammar does not compile: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(EngineError::Invalid(format!(
                "the grammar does not compile: {e}"
            )));
        }
        Ok(Grammar {
            matcher,
            spec: Arc::new(spec),
        })
    }
}

/// GBNF writes rules as `name ::= ...`; Lark as `name: ...`.
fn is_gbnf(text: &str) -> bool {
    text.lines().any(|l| l.contains("::="))
}

/// GBNF to llguidance's Lark: `::=` becomes `:`, rule names lose their
/// dashes (Lark names are identifiers) and `root` is the start rule.
/// Strings, character classes, repetition and `#` comments read the same.
fn gbnf_to_lark(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut quoted: Option<char> = None;
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if !word.is_empty() {
            let name = word.replace('-', "_");
            out.push_str(if name == "root" { "start" } else { &name });
            word.clear();
        }
    };
    while let Some(c) = chars.next() {
        if let Some(q) = quoted {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == q {
                quoted = None;
            }
            continue;
        }
        match c {
            '"' | '[' => {
                flush(&mut word, &mut out);
                quoted = Some(if c == '[' { ']' } else { '"' });
                out.push(c);
            }
            '#' => {
                flush(&mut word, &mut out);
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            c if c.is_alphanumeric() || c == '_' || (c == '-' && !word.is_empty()) => word.push(c),
            ':' if chars.peek() == Some(&':') => {
                flush(&mut word, &mut out);
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                }
                out.push(':');
            }
            _ => {
                flush(&mut word, &mut out);
                out.push(c);
            }
        }
    }
    flush(&mut word, &mut out);
    out
}

/// One reply's matcher. `ahead` holds drafts consumed for the rows after
/// them, not yet accepted; `in_flight` the drafts the round verifies.
pub(crate) struct Constraint {
    matcher: Matcher,
    eos_ids: Vec<u32>,
    in_flight: Vec<u32>,
    ahead: usize,
}

impl Constraint {
    pub(crate) fn new(grammar: &Grammar, eos_ids: &[u32]) -> Constraint {
        Constraint {
            matcher: grammar.matcher.deep_clone(),
            eos_ids: eos_ids.to_vec(),
            in_flight: Vec::new(),
            ahead: 0,
        }
    }

    /// The drafts the grammar allows after the accepted tokens: cut at the
    /// first it rejects. They are kept to mask the rows that follow them.
    pub(crate) fn cut_drafts(&mut self, mut drafts: Vec<u32>) -> Vec<u32> {
        self.settle(0);
        let valid = self.matcher.validate_tokens(&drafts).unwrap_or(0);
        drafts.truncate(valid);
        self.in_flight = drafts.clone();
        drafts
    }

    /// The allowed tokens of the row `drafted` drafts past the accepted
    /// tokens (`None`: only an end of reply is left).
    pub(crate) fn mask(&mut self, drafted: usize) -> Option<SimpleVob> {
        self.settle(drafted);
        if self.matcher.is_stopped() {
            return None;
        }
        self.matcher.compute_mask().ok()
    }

    /// Makes the matcher hold the accepted tokens and `drafted` in-flight
    /// drafts.
    fn settle(&mut self, drafted: usize) {
        if self.ahead > drafted {
            let _ = self.matcher.rollback(self.ahead - drafted);
            self.ahead = drafted;
        }
        let upto = drafted.min(self.in_flight.len());
        if self.ahead < upto {
            let _ = self
                .matcher
                .consume_tokens(&self.in_flight[self.ahead..upto]);
            self.ahead = upto;
        }
    }

    /// Takes the reply's next token (a kept draft was consumed already).
    pub(crate) fn accept(&mut self, token: u32) {
        if self.ahead > 0 && self.in_flight.first() == Some(&token) {
            self.in_flight.remove(0);
            self.ahead -= 1;
            return;
        }
        self.settle(0);
        self.in_flight.clear();
        let _ = self.matcher.consume_token(token);
    }

    /// `row` with every token the grammar forbids at -inf; where only an
    /// end of reply is left, the model's end-of-reply tokens alone.
    pub(crate) fn apply(&self, mask: Option<&SimpleVob>, row: &[f32]) -> Vec<f32> {
        let mut out = vec![f32::NEG_INFINITY; row.len()];
        match mask {
            Some(mask) if mask.num_set() > 0 => {
                for (i, (o, &l)) in out.iter_mut().zip(row).enumerate() {
                    if mask.is_allowed(i as u32) {
                        *o = l;
                    }
                }
            }
            _ => {
                for &e in &self.eos_ids {
                    if let Some(o) = out.get_mut(e as usize) {
                        *o = row[e as usize];
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbnf_reads_as_lark() {
        let g = "root ::= answer # the reply\nanswer ::= \"yes\" | \"no-way\" | [a-z-]+\n";
        assert_eq!(
            gbnf_to_lark(g),
            "start : answer \nanswer : \"yes\" | \"no-way\" | [a-z-]+\n"
        );
        assert!(is_gbnf(g) && !is_gbnf("start: \"a\""));
    }
}
