//! The exactness suite: every case is served serially (`draft: false`) and
//! drafted, and the two replies must be the same tokens and the same bytes.

use crate::{models_dir, synth_model};
use std::path::PathBuf;
use tensorfold_engine::{
    BackendChoice, DrafterChoice, Engine, GenerateRequest, Prompt, SamplingParams,
};
use tensorfold_models::mlx::{MlxQuantization, QuantizeOptions};
use tensorfold_models::synth::{self, SynthSpec};
use tensorfold_models::{Affine, ScaleDtype};
use tensorfold_models::{Arch, Format};

/// One model of the suite with the drafters that apply to it.
struct Subject {
    name: String,
    target: PathBuf,
    draft: Option<PathBuf>,
    chat: bool,
    /// Large models run the fast case set even in the full suite.
    heavy: bool,
}

pub struct Outcome {
    pub case: String,
    pub identical: bool,
    pub tokens: usize,
    pub tokens_per_round: f64,
}

fn subjects(full: bool) -> Vec<Subject> {
    let tiny = |name: &str, arch, format, seed, gguf| {
        synth_model(name, &SynthSpec::tiny(arch, format, seed), gguf)
    };
    // One random Llama drafts for both tiny targets: all share the synthetic tokenizer.
    let tiny_draft = tiny("exact-draft-q8_0", Arch::Llama, Format::Q8_0, 22, true);
    let mut out = vec![
        Subject {
            name: "tiny-llama-q4_1".into(),
            target: tiny("exact-llama-q4_1", Arch::Llama, Format::Q4_1, 21, true),
            draft: Some(tiny_draft.clone()),
            chat: true,
            heavy: false,
        },
        Subject {
            name: "tiny-qwen2-bf16".into(),
            target: tiny("exact-qwen2-bf16", Arch::Qwen2, Format::Bf16, 23, false),
            draft: Some(tiny_draft.clone()),
            chat: true,
            heavy: false,
        },
        Subject {
            name: "tiny-qwen3-q6_k".into(),
            target: tiny("exact-qwen3-q6_k", Arch::Qwen3, Format::Q6K, 24, true),
            draft: None,
            chat: true,
            heavy: false,
        },
        Subject {
            name: "tiny-llama-affine3".into(),
            target: tiny_affine(),
            draft: Some(tiny_draft.clone()),
            chat: true,
            heavy: false,
        },
    ];
    // Every family with a plan of its own: experts, windows, soft caps,
    // fused weights (Mistral in its Hugging Face layout, whose window GGUF
    // files do not carry).
    let families = [
        (Arch::Qwen3Moe, Format::Q4K, 31, true),
        (Arch::Mistral, Format::Bf16, 32, false),
        (Arch::Phi3, Format::Q5_0, 33, true),
        (Arch::Gemma3, Format::Q4_1, 34, true),
        (Arch::Gemma2, Format::Bf16, 35, false),
        (Arch::Mixtral, Format::Q6K, 36, true),
    ];
    for (arch, format, seed, gguf) in families {
        let name = format!("tiny-{}-{}", arch.name(), format.name().to_lowercase());
        out.push(Subject {
            target: tiny(&format!("exact-{}", &name[5..]), arch, format, seed, gguf),
            name,
            draft: Some(tiny_draft.clone()),
            chat: true,
            heavy: false,
        });
    }
    let m = models_dir();
    let real = [
        (
            "mathformer-add",
            m.join("mathformer/addformer"),
            None,
            false,
        ),
        (
            "smollm2-135m",
            m.join("smollm2-135m-instruct-q4_1.gguf"),
            None,
            true,
        ),
    ];
    let required = std::env::var_os("TENSORFOLD_REQUIRE_MODELS").is_some();
    for (name, target, draft, chat) in real {
        if !target.exists() && required {
            panic!("{} is missing: run `cargo xtask models`", target.display());
        }
        if target.exists() {
            out.push(Subject {
                name: name.into(),
                target,
                draft,
                chat,
                heavy: false,
            });
        }
    }
    let (q05, q15) = (
        m.join("qwen2.5-coder-0.5b-instruct.gguf"),
        m.join("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    );
    if full && required && !(q05.exists() && q15.exists()) {
        panic!("the Qwen2.5-Coder pair is missing: run `cargo xtask models --all`");
    }
    if full && q05.exists() && q15.exists() {
        out.push(Subject {
            name: "qwen2.5-coder-1.5b".into(),
            target: q15,
            draft: Some(q05),
            chat: true,
            heavy: true,
        });
    }
    out
}

/// A random Llama in MLX affine layout: 3-bit groups of 32, 8-bit embeddings.
fn tiny_affine() -> PathBuf {
    let mut quantization = MlxQuantization::uniform(Affine::new(3, 32).unwrap());
    quantization.overrides.insert(
        "model.embed_tokens".into(),
        Some(Affine::new(8, 64).unwrap()),
    );
    let spec = SynthSpec::tiny_affine(Arch::Llama, &quantization, 25);
    let dir = std::env::temp_dir().join(format!("tensorfold-exact-affine-{}", std::process::id()));
    if !dir.join("config.json").exists() {
        let opts = QuantizeOptions {
            quantization,
            scales: ScaleDtype::Bf16,
            rule: tensorfold_models::QuantRule::Search,
        };
        synth::write_mlx(&dir, &spec, &opts).expect("affine fixture");
    }
    dir
}

fn samplers(full: bool) -> Vec<(&'static str, SamplingParams)> {
    let s = |temperature, top_k, top_p, min_p, seed| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
    };
    let mut v = vec![
        ("greedy", SamplingParams::greedy()),
        ("t0.8,k40,seed1", s(0.8, Some(40), 1.0, 0.0, Some(1))),
    ];
    if full {
        v.push(("t1.0,p0.9,seed2", s(1.0, None, 0.9, 0.0, Some(2))));
        v.push(("t0.7,minp0.05,noseed", s(0.7, None, 1.0, 0.05, None)));
    }
    v
}

const CODE: &str = "Here is some code:\n\nfn area(w: f64, h: f64) -> f64 {\n    w * h\n}\n\nfn perimeter(w: f64, h: f64) -> f64 {\n    2.0 * (w + h)\n}\n\nRepeat the code exactly, then rename `w` to `width`.";
const CHAT: &str = "Tell me about the history of the bicycle in three sentences.";

fn prompts(s: &Subject) -> Vec<(&'static str, Prompt)> {
    if !s.chat {
        return vec![
            ("sum", Prompt::Text("3+4=".into())),
            ("sum2", Prompt::Text("12+30=".into())),
        ];
    }
    vec![
        ("code", Prompt::chat_user(CODE)),
        ("chat", Prompt::chat_user(CHAT)),
    ]
}

/// Request shapes beyond the plain one: stops and length edges.
fn shapes(full: bool) -> Vec<(&'static str, usize, Vec<String>, bool)> {
    let mut v = vec![("max48", 48, vec![], false), ("max1", 1, vec![], false)];
    if full {
        v.push(("max2", 2, vec![], false));
        v.push((
            "stop",
            48,
            vec!["\n\n".to_string(), "the".to_string()],
            false,
        ));
        v.push(("ignore_eos", 40, vec![], true));
    }
    v
}

/// What a run of the suite found.
pub struct Report {
    pub outcomes: Vec<Outcome>,
    /// Subjects the backend refused, with its reason.
    pub skipped: Vec<(String, String)>,
}

/// Streams served together in each subject's batch cases.
pub const BATCH_STREAMS: usize = 16;

/// Runs the suite with the target on `backend`; `on_case` sees each
/// outcome as it finishes.
pub fn run(full: bool, backend: BackendChoice, on_case: &mut dyn FnMut(&Outcome)) -> Report {
    run_subjects(full, backend, "", on_case)
}

/// [`run`] over the subjects whose name contains `only`.
pub fn run_subjects(
    full: bool,
    backend: BackendChoice,
    only: &str,
    on_case: &mut dyn FnMut(&Outcome),
) -> Report {
    let mut report = Report {
        outcomes: Vec::new(),
        skipped: Vec::new(),
    };
    let outcomes = &mut report.outcomes;
    for s in subjects(full).into_iter().filter(|s| s.name.contains(only)) {
        let mut engine = Engine::load(&s.target).expect("suite model loads");
        if let Err(e) = engine.set_backend(backend) {
            report.skipped.push((s.name.clone(), e.to_string()));
            continue;
        }
        let mut drafters = vec![
            ("context", DrafterChoice::Context),
            ("auto", DrafterChoice::Auto),
        ];
        if let Some(d) = &s.draft {
            engine.set_draft_model(d).expect("draft pair");
            drafters.push(("model", DrafterChoice::Model));
        }
        for (pname, prompt) in prompts(&s) {
            let wide = full && !s.heavy;
            for (sname, sampling) in samplers(wide) {
                for (shape, max_tokens, stop, ignore_eos) in shapes(wide) {
                    let mut req = GenerateRequest::new(prompt.clone());
                    req.max_tokens = max_tokens;
                    req.sampling = sampling.clone();
                    req.stop = stop.clone();
                    req.ignore_eos = ignore_eos;
                    req.draft = false;
                    let serial = engine.generate(&req, &mut |_| true).expect("serial run");
                    req.draft = true;
                    for (dname, choice) in &drafters {
                        engine.set_drafter(*choice).unwrap();
                        let mut streamed = String::new();
                        let drafted = engine
                            .generate(&req, &mut |d| {
                                streamed.push_str(d);
                                true
                            })
                            .expect("drafted run");
                        let o = Outcome {
                            case: format!("{}/{pname}/{sname}/{shape}/{dname}", s.name),
                            identical: drafted.tokens == serial.tokens
                                && drafted.text == serial.text
                                && streamed == serial.text
                                && drafted.finish_reason == serial.finish_reason,
                            tokens: serial.completion_tokens,
                            tokens_per_round: drafted.draft.tokens_per_round(),
                        };
                        on_case(&o);
                        outcomes.push(o);
                    }
                }
            }
        }
        engine.set_drafter(DrafterChoice::Auto).unwrap();
        for o in batch_cases(&engine, &s, full) {
            on_case(&o);
            outcomes.push(o);
        }
    }
    report
}

/// [`BATCH_STREAMS`] requests (prompts, samplers and lengths mixed, every
/// other one drafted) served in one batch, each against itself served
/// alone without drafts.
fn batch_cases(engine: &Engine, s: &Subject, full: bool) -> Vec<Outcome> {
    let prompts = prompts(s);
    let samplers = samplers(full && !s.heavy);
    let requests: Vec<GenerateRequest> = (0..BATCH_STREAMS)
        .map(|i| {
            let mut req = GenerateRequest::new(prompts[i % prompts.len()].1.clone());
            req.sampling = samplers[(i / prompts.len()) % samplers.len()].1.clone();
            req.max_tokens = 8 + (i * 7) % 40;
            req.ignore_eos = i % 4 == 3;
            req.draft = i % 2 == 0;
            req
        })
        .collect();
    let mut batch = engine.batch();
    let ids: Vec<_> = requests
        .iter()
        .map(|r| {
            let prepared = engine.prepare(r.clone()).expect("batch request");
            batch
                .admit(prepared, |_: &str| true)
                .expect("fits the budget")
        })
        .collect();
    let mut together = vec![None; requests.len()];
    while !batch.is_empty() {
        for (id, done) in batch.step() {
            let i = ids.iter().position(|&x| x == id).expect("admitted here");
            together[i] = Some(done.expect("batched stream"));
        }
    }
    drop(batch);
    requests
        .iter()
        .zip(together)
        .enumerate()
        .map(|(i, (req, got))| {
            let got = got.expect("every stream finishes");
            let mut solo = req.clone();
            solo.draft = false;
            let alone = engine.generate(&solo, &mut |_| true).expect("solo run");
            Outcome {
                case: format!("{}/batch{BATCH_STREAMS}/stream{i}", s.name),
                identical: got.tokens == alone.tokens
                    && got.text == alone.text
                    && got.finish_reason == alone.finish_reason,
                tokens: alone.completion_tokens,
                tokens_per_round: got.draft.tokens_per_round(),
            }
        })
        .collect()
}
