//! Turning generated tokens into text: deltas that never split a UTF-8
//! character, and stop strings that are cut out of the reply.
//!
//! Decoding is incremental, with constant work per token: only a window of
//! the last tokens is decoded, from the start of the last delta. A window
//! starts where the text before it ended on a whole character, and its
//! first tokens decoded to some text, so the decoders' start-of-text rules
//! (a stripped leading space) touch the window's known head alone, and the
//! new text is what the window's decoding adds to that head.

use tokenizers::Tokenizer;

/// Incremental detokenizer with stop-string matching.
pub struct TextStream {
    /// The last tokens: `window[..read]` were decoded into `head` already,
    /// the rest are new.
    window: Vec<u32>,
    read: usize,
    head: String,
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
            window: Vec::new(),
            read: 0,
            head: String::new(),
            text: String::new(),
            emitted: 0,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
        }
    }

    /// Decodes the new token into `text`; `false` while it ends inside a
    /// multi-byte character (the bytes to finish it are still to come).
    fn decode(&mut self, tokenizer: &Tokenizer, id: u32) -> bool {
        self.window.push(id);
        let decoded = tokenizer.decode(&self.window, true).unwrap_or_default();
        // An incomplete multi-byte character decodes to U+FFFD: wait for more.
        if decoded.ends_with('\u{FFFD}') {
            return false;
        }
        match decoded.strip_prefix(self.head.as_str()) {
            Some(new) => self.text.push_str(new),
            // A decoder that rewrote the head (never seen with byte-level
            // or SentencePiece decoders): what the window adds past it.
            None => {
                let from = floor_char(&decoded, self.head.len().min(decoded.len()));
                self.text.push_str(&decoded[from..]);
            }
        }
        // The next window starts at the tokens just decoded, unless they
        // gave no text (a special token left out, a lone space a decoder
        // strips at the start): then it keeps its start.
        let tail = tokenizer
            .decode(&self.window[self.read..], true)
            .unwrap_or_default();
        if tail.is_empty() || tail.ends_with('\u{FFFD}') {
            self.head = decoded;
        } else {
            self.window.drain(..self.read);
            self.head = tail;
        }
        self.read = self.window.len();
        true
    }

    /// Adds a token; returns the text that is now safe to show.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Delta {
        if !self.decode(tokenizer, id) {
            return Delta {
                text: String::new(),
                stopped: false,
            };
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The stream read literally: the whole reply decoded at every token.
    struct WholeReply {
        ids: Vec<u32>,
        text: String,
    }

    impl WholeReply {
        /// The delta, or `None` when the decoding rewrote text it gave
        /// before (byte fallbacks: a valid byte followed by a broken
        /// sequence turns into U+FFFD), which no stream can take back.
        fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Option<String> {
            self.ids.push(id);
            let decoded = tokenizer.decode(&self.ids, true).unwrap();
            if decoded.ends_with('\u{FFFD}') {
                return Some(String::new());
            }
            let delta = decoded.strip_prefix(self.text.as_str())?.to_string();
            self.text = decoded;
            Some(delta)
        }
    }

    /// A SentencePiece-style vocabulary: word pieces with and without the
    /// space mark, a lone space mark, byte fallbacks that make up "€" and
    /// "A", and a special token, under `decoder`.
    fn sentencepiece(decoder: &str) -> Tokenizer {
        let json = format!(
            r#"{{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{{"id":0,"content":"<s>","single_word":false,"lstrip":false,
              "rstrip":false,"normalized":false,"special":true}}],
            "normalizer":null,"pre_tokenizer":null,"post_processor":null,
            "decoder":{decoder},
            "model":{{"type":"BPE","dropout":null,"unk_token":null,
              "continuing_subword_prefix":null,"end_of_word_suffix":null,
              "fuse_unk":false,"byte_fallback":true,
              "vocab":{{"<s>":0,"▁":1,"▁Hello":2,"world":3,"<0xE2>":4,"<0x82>":5,
                "<0xAC>":6,"▁the":7,",":8,"<0x41>":9,"▁▁":10}},"merges":[]}}}}"#
        );
        json.parse().unwrap()
    }

    fn tokenizers() -> Vec<(&'static str, Tokenizer, u32)> {
        let strip = r#"{"type":"Sequence","decoders":[
            {"type":"Replace","pattern":{"String":"▁"},"content":" "},
            {"type":"ByteFallback"},{"type":"Fuse"},
            {"type":"Strip","content":" ","start":1,"stop":0}]}"#;
        let metaspace = r#"{"type":"Sequence","decoders":[
            {"type":"ByteFallback"},
            {"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}]}"#;
        let byte_level = tensorfold_models::synth::tokenizer();
        let vocab = byte_level.get_vocab_size(true) as u32;
        vec![
            ("byte-level", byte_level, vocab),
            ("replace+strip", sentencepiece(strip), 11),
            ("metaspace", sentencepiece(metaspace), 11),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// Deltas, and the reply at the end, are the whole reply's decoding,
        /// whatever the tokens (bytes that never make a character, special
        /// tokens, lone spaces).
        #[test]
        fn the_window_decodes_what_the_whole_reply_decodes(
            picks in proptest::collection::vec(any::<u32>(), 0..60),
        ) {
            for (name, tokenizer, vocab) in tokenizers() {
                let mut stream = TextStream::new(Vec::new());
                let mut whole = WholeReply { ids: Vec::new(), text: String::new() };
                let mut rewrote = false;
                for &p in &picks {
                    // Mostly the first 300 ids (bytes and specials).
                    let id = if p % 4 == 0 { p % vocab } else { p % vocab.min(300) };
                    let delta = stream.push(&tokenizer, id);
                    let Some(expected) = whole.push(&tokenizer, id) else {
                        rewrote = true;
                        break;
                    };
                    prop_assert_eq!(&delta.text, &expected, "{}", name);
                }
                if !rewrote {
                    stream.finish();
                    prop_assert_eq!(stream.text(), whole.text.as_str(), "{}", name);
                }
            }
        }
    }

    #[test]
    fn a_window_stays_short_on_a_long_reply() {
        let tokenizer = tensorfold_models::synth::tokenizer();
        let mut stream = TextStream::new(Vec::new());
        let hello = tokenizer.encode("hello, world! ", false).unwrap();
        for _ in 0..200 {
            for &id in hello.get_ids() {
                stream.push(&tokenizer, id);
                assert!(stream.window.len() <= 2, "{}", stream.window.len());
            }
        }
        assert_eq!(stream.text(), "hello, world! ".repeat(200));
    }

    #[test]
    fn stop_strings_cut_the_reply_across_tokens() {
        let tokenizer = tensorfold_models::synth::tokenizer();
        let mut stream = TextStream::new(vec!["END".into()]);
        let ids = tokenizer.encode("one two EN", false).unwrap();
        let mut shown = String::new();
        for &id in ids.get_ids() {
            let d = stream.push(&tokenizer, id);
            assert!(!d.stopped);
            shown += &d.text;
        }
        assert_eq!(shown, "one two ", "a tail that may become the stop waits");
        let d = stream.push(&tokenizer, tokenizer.token_to_id("D").unwrap());
        assert!(d.stopped && d.text.is_empty());
        assert_eq!(stream.text(), "one two ");
    }
}
