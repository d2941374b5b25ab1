//! Turning generated tokens into text: deltas that never split a UTF-8
//! character, and stop strings that are cut out of the reply.

use tokenizers::Tokenizer;

/// Incremental detokenizer with stop-string matching.
pub struct TextStream {
    ids: Vec<u32>,
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
    stops: Vec<String>,
}

/// What pushing a token produced.
pub struct Delta {
    pub text: String,
    /// A stop string matched: the reply is complete.
    pub stopped: bool,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            ids: Vec::new(),
            text: String::new(),
            emitted: 0,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
        }
    }

    /// Adds a token; returns the text that is now safe to show.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Delta {
        self.ids.push(id);
        let decoded = tokenizer.decode(&self.ids, true).unwrap_or_default();
        // An incomplete multi-byte character decodes to U+FFFD: wait for more.
        if decoded.ends_with('\u{FFFD}') {
            return Delta {
                text: String::new(),
                stopped: false,
            };
        }
        self.text = decoded;
        let search_from = self
            .emitted
            .saturating_sub(self.stops.iter().map(|s| s.len()).max().unwrap_or(0));
        let search_from = floor_char(&self.text, search_from);
        let found = self
            .stops
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|i| search_from + i)
            })
            .min();
        if let Some(at) = found {
            self.text.truncate(at);
            return Delta {
                text: self.take(at),
                stopped: true,
            };
        }
        // Hold back a tail that could still become a stop string.
        let hold = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .rev()
                    .filter(|&n| s.is_char_boundary(n))
                    .map(move |n| &s[..n])
            })
            .filter(|p| self.text.ends_with(p))
            .map(|p| p.len())
            .max()
            .unwrap_or(0);
        let upto = self.text.len() - hold;
        Delta {
            text: self.take(upto),
            stopped: false,
        }
    }

    fn take(&mut self, upto: usize) -> String {
        if upto <= self.emitted {
            return String::new();
        }
        let out = self.text[self.emitted..upto].to_string();
        self.emitted = upto;
        out
    }

    /// Hands out whatever was held back (the reply ended without a stop).
    pub fn finish(&mut self) -> String {
        let end = self.text.len();
        self.take(end)
    }

    /// The reply so far, stop string removed.
    pub fn text(&self) -> &str {
        &self.text
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
