//! The reasoning channel: models that think (Qwen3, DeepSeek-R1) write
//! `<think>...</think>` before the answer; the reasoning goes to
//! `reasoning_content`, the rest to `content`. Templates that open the block
//! in the prompt leave the reply starting inside it.

use tensorfold_engine::{Completion, Engine};

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether a reply to `prompt` has its reasoning split off: `Some(inside)`
/// when the model's template speaks of `</think>` and the request did not
/// ask `reasoning_format: "none"`; `inside` when the prompt opened the block.
pub fn channel(engine: &Engine, prompt: &[u32], format: Option<&str>) -> Option<bool> {
    let bundle = engine.bundle();
    let thinks = bundle
        .chat_template
        .as_deref()
        .is_some_and(|t| t.contains(CLOSE));
    if !thinks || format == Some("none") {
        return None;
    }
    // Enough tokens to spell the tag however the vocabulary splits it.
    let tail = &prompt[prompt.len().saturating_sub(16)..];
    let tail = bundle.tokenizer.decode(tail, false).unwrap_or_default();
    Some(tail.trim_end().ends_with(OPEN))
}

/// Reply tokens up to the end of the reasoning (its closing tag included).
pub fn tokens(engine: &Engine, c: &Completion, reasoning: Option<&str>) -> usize {
    if reasoning.is_none_or(str::is_empty) {
        return 0;
    }
    let Some(end) = c.text.find(CLOSE).map(|i| i + CLOSE.len()) else {
        return c.completion_tokens; // still thinking when the reply ended
    };
    let mut spelled = 0;
    for (i, &t) in c.tokens.iter().enumerate() {
        spelled += engine.decode(&[t]).len();
        if spelled >= end {
            return i + 1;
        }
    }
    c.completion_tokens
}

/// Splits streamed text into reasoning and content, holding back what
/// could be the start of a tag until the next delta says.
#[derive(Debug, Clone)]
pub struct ThinkSplit {
    inside: bool,
    /// Whether an opening tag may still come (only at the reply's start).
    may_open: bool,
    /// Just past the closing tag: the blank lines before the answer go.
    after_close: bool,
    held: String,
}

/// A piece of the reply, by channel.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
}

impl ThinkSplit {
    /// `inside`: the prompt already opened the block.
    pub fn new(inside: bool) -> ThinkSplit {
        ThinkSplit {
            inside,
            may_open: !inside,
            after_close: false,
            held: String::new(),
        }
    }

    /// Takes the next delta; returns what can be told apart now.
    pub fn push(&mut self, delta: &str) -> Parts {
        self.held.push_str(delta);
        let mut out = Parts::default();
        loop {
            if self.may_open {
                let lead = self.held.trim_start();
                if lead.starts_with(OPEN) {
                    let at = self.held.len() - lead.len();
                    self.held.drain(..at + OPEN.len());
                    self.inside = true;
                    self.may_open = false;
                    continue;
                }
                if !lead.is_empty() && !OPEN.starts_with(lead) {
                    self.may_open = false;
                } else {
                    return out;
                }
            }
            if !self.inside {
                if self.after_close {
                    let trimmed = self.held.trim_start_matches('\n').len();
                    self.held.drain(..self.held.len() - trimmed);
                    if self.held.is_empty() {
                        return out;
                    }
                    self.after_close = false;
                }
                out.content.push_str(&std::mem::take(&mut self.held));
                return out;
            }
            if let Some(i) = self.held.find(CLOSE) {
                out.reasoning.push_str(&self.held[..i]);
                self.held.drain(..i + CLOSE.len());
                self.inside = false;
                self.after_close = true;
                continue;
            }
            let keep = partial_suffix(&self.held, CLOSE);
            let cut = self.held.len() - keep;
            out.reasoning.push_str(&self.held[..cut]);
            self.held.drain(..cut);
            return out;
        }
    }

    /// The end of the reply: whatever was held back.
    /// [`ThinkSplit::push`], and on the reply's last delta also what
    /// [`ThinkSplit::finish`] releases.
    pub fn take(&mut self, delta: &str, finished: bool) -> Parts {
        let mut parts = self.push(delta);
        if finished {
            let rest = self.finish();
            parts.reasoning.push_str(&rest.reasoning);
            parts.content.push_str(&rest.content);
        }
        parts
    }

    pub fn finish(&mut self) -> Parts {
        let rest = std::mem::take(&mut self.held);
        let mut out = Parts::default();
        if self.inside {
            out.reasoning = rest;
        } else {
            out.content = rest;
        }
        out
    }

    /// Splits a whole reply.
    pub fn split(text: &str, inside: bool) -> Parts {
        let mut s = ThinkSplit::new(inside);
        let mut out = s.push(text);
        let rest = s.finish();
        out.reasoning.push_str(&rest.reasoning);
        out.content.push_str(&rest.content);
        out
    }
}

/// Bytes at the end of `text` that begin `tag` (a tag that may be cut).
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_reply_splits() {
        let p = ThinkSplit::split("<think>\nLet me see.\n</think>\n\nParis.", false);
        assert_eq!(p.reasoning, "\nLet me see.\n");
        assert_eq!(p.content, "Paris.");
        let p = ThinkSplit::split("Let me see.</think>Paris.", true);
        assert_eq!(
            (p.reasoning.as_str(), p.content.as_str()),
            ("Let me see.", "Paris.")
        );
        let p = ThinkSplit::split("Paris <think> is not a tag here", false);
        assert_eq!(p.content, "Paris <think> is not a tag here");
        let p = ThinkSplit::split("<think>cut short", false);
        assert_eq!(
            (p.reasoning.as_str(), p.content.as_str()),
            ("cut short", "")
        );
    }

    #[test]
    fn streamed_deltas_split_as_the_whole() {
        let text = "<think>\nHmm, a </thi trap.\n</think>\n\nThe answer <think> stays.";
        let whole = ThinkSplit::split(text, false);
        for size in 1..8 {
            let mut s = ThinkSplit::new(false);
            let mut got = Parts::default();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(size) {
                let p = s.push(&piece.iter().collect::<String>());
                got.reasoning += &p.reasoning;
                got.content += &p.content;
            }
            let p = s.finish();
            got.reasoning += &p.reasoning;
            got.content += &p.content;
            assert_eq!(got, whole, "pieces of {size}");
        }
    }
}
