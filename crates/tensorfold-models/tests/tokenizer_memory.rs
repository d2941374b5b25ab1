//! Building and using a GGUF tokenizer again and again keeps memory flat.
//!
//! Found by fuzzing (`fuzz/seeds/gguf_tokenizer/oom_bpe_cache_per_tokenizer.txt`):
//! the BPE word cache of `tokenizers` outlives each tokenizer in
//! thread-locals, so a process that built one tokenizer after another grew
//! by kilobytes each time until it ran out of memory. Its own test binary:
//! the allocator counts every thread's bytes.

use candle_core::quantized::gguf_file::{write, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;
use tensorfold_models::synth::{write_hf, SynthSpec};
use tensorfold_models::{load, Arch, Format, GgufFile};

/// The system allocator, counting the bytes currently allocated.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's
// arguments; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc`/`realloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's pointer, layout and size are passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The tests run one at a time: the counter sees every thread.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The fuzz target's input as a GGUF file: the first line names the
/// pre-tokenizer, the second holds token types (digits), then tokens up to
/// an empty line and merges after it. Returns the file and text to encode.
fn gguf_from_seed(seed: &Path, out: &Path) -> String {
    let data = std::fs::read(seed).expect("seed");
    let text = String::from_utf8_lossy(&data);
    let mut lines = text.split('\n');
    let pre = lines.next().unwrap_or_default().to_string();
    let types: Vec<Value> = lines
        .next()
        .unwrap_or_default()
        .bytes()
        .map(|b| Value::I32(i32::from(b) - i32::from(b'0')))
        .collect();
    let tokens: Vec<Value> = lines
        .by_ref()
        .take_while(|l| !l.is_empty())
        .map(|l| Value::String(l.to_string()))
        .collect();
    let merges: Vec<Value> = lines.map(|l| Value::String(l.to_string())).collect();
    let entries = [
        ("general.architecture", Value::String("llama".into())),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre)),
        ("tokenizer.ggml.tokens", Value::Array(tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.merges", Value::Array(merges)),
    ];
    let metadata: Vec<(&str, &Value)> = entries.iter().map(|(k, v)| (*k, v)).collect();
    let mut file = std::fs::File::create(out).expect("scratch file");
    write(&mut file, &metadata, &[]).expect("GGUF writer");
    text.chars().rev().take(64).collect()
}

fn build_and_encode(path: &Path, text: &str) -> usize {
    let tokenizer = GgufFile::open(path)
        .expect("the seed is a readable GGUF file")
        .tokenizer()
        .expect("the seed makes a tokenizer");
    let ids = tokenizer
        .encode(text, false)
        .expect("encode")
        .get_ids()
        .to_vec();
    tokenizer.decode(&ids, false).expect("decode");
    ids.len()
}

#[test]
fn rebuilding_a_gguf_tokenizer_leaves_no_memory_behind() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let seed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds/gguf_tokenizer/oom_bpe_cache_per_tokenizer.txt");
    let dir: PathBuf =
        std::env::temp_dir().join(format!("tf-tokenizer-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.gguf");
    let sample = gguf_from_seed(&seed, &path);
    let text = format!("{sample} hello world, the 12 quick foxes: don't stop!");
    // The first build initialises lazily built statics (regexes).
    assert!(build_and_encode(&path, &text) > 0);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    const ROUNDS: isize = 200;
    for _ in 0..ROUNDS {
        build_and_encode(&path, &text);
    }
    let grown = LIVE_BYTES.load(Ordering::Relaxed) - before;
    std::fs::remove_dir_all(&dir).ok();
    // Before the fix each round left about 5 KB behind (1 MB here).
    assert!(
        grown < 64 * 1024,
        "{ROUNDS} tokenizers left {grown} bytes allocated"
    );
}

/// `tokenizer.json` tokenizers (and their clones) keep no word cache either.
#[test]
fn cloning_a_hugging_face_tokenizer_leaves_no_words_behind() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("tf-tokenizer-memory-hf-{}", std::process::id()));
    write_hf(&dir, &SynthSpec::tiny(Arch::Llama, Format::F32, 1)).expect("tiny model");
    let bundle = load(&dir).expect("tiny model loads");
    std::fs::remove_dir_all(&dir).ok();
    let text = "hello world, the 12 quick foxes: don't stop! ".repeat(8);
    let encode = |tokenizer: &tokenizers::Tokenizer| {
        tokenizer
            .encode(text.as_str(), false)
            .expect("encode")
            .len()
    };
    assert!(encode(&bundle.tokenizer.clone()) > 0);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    const ROUNDS: isize = 200;
    for _ in 0..ROUNDS {
        encode(&bundle.tokenizer.clone());
    }
    let grown = LIVE_BYTES.load(Ordering::Relaxed) - before;
    // Each clone still leaves an empty per-thread map (under 100 bytes).
    assert!(
        grown < 64 * 1024,
        "{ROUNDS} tokenizer clones left {grown} bytes allocated"
    );
}
