//! The tensors a model's plan needs, checked against a file's header
//! before any weight is read: `inspect` (and so `info` and `load`) refuses
//! a file whose plan lacks a tensor or has one the forward would leave
//! unused (an expert, a rope factor table), naming the architecture and
//! the tensors.
//!
//! The check runs the same [`crate::weights::build`] that loads the
//! weights, against a source that answers from the header alone, so the
//! list of a block's weights stays in one place.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::weights::TensorSource;
use std::collections::{BTreeSet, HashMap};
use tensorfold_quant::{Format, Matrix};

/// How a file names a tensor the build asks for: a GGUF name, and the
/// expert index for one expert's matrix.
pub(crate) type Namer<'a> = dyn Fn(&str, Option<usize>) -> Vec<String> + 'a;

struct HeaderSource<'a> {
    /// Elements of each tensor the header lists, by the file's name.
    present: HashMap<String, usize>,
    namer: &'a Namer<'a>,
    asked: BTreeSet<String>,
    missing: BTreeSet<String>,
    wrong: Vec<String>,
}

impl HeaderSource<'_> {
    fn ask(&mut self, gguf: &str, expert: Option<usize>, elements: usize) {
        for name in (self.namer)(gguf, expert) {
            match self.present.get(&name) {
                None => {
                    self.missing.insert(name);
                }
                Some(&n) if n != elements => {
                    self.wrong
                        .push(format!("{name} has {n} values, the plan needs {elements}"));
                    self.asked.insert(name);
                }
                Some(_) => {
                    self.asked.insert(name);
                }
            }
        }
    }
}

fn placeholder() -> Result<Matrix> {
    Ok(Matrix::from_f32(Format::F32, 0, 0, &[])?)
}

impl TensorSource for HeaderSource<'_> {
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.ask(name, None, rows * cols);
        placeholder()
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.ask(name, None, len);
        Ok(vec![0.0; len])
    }

    fn expert(
        &mut self,
        name: &str,
        e: usize,
        count: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        // A GGUF file holds every expert in one tensor; a Hugging Face
        // checkpoint one tensor per expert.
        let whole = (self.namer)(name, None);
        if whole.iter().any(|n| self.present.contains_key(n)) {
            if e == 0 {
                self.ask(name, None, count * rows * cols);
            }
        } else {
            self.ask(name, Some(e), rows * cols);
        }
        placeholder()
    }
}

/// Checks that `tensors` (the file's names and element counts) are those
/// `config`'s plan needs. With `strict`, a tensor the plan leaves unused is
/// refused too.
pub(crate) fn check(
    config: &ModelConfig,
    tensors: impl Iterator<Item = (String, usize)>,
    namer: &Namer<'_>,
    strict: bool,
) -> Result<()> {
    let mut src = HeaderSource {
        present: tensors.collect(),
        namer,
        asked: BTreeSet::new(),
        missing: BTreeSet::new(),
        wrong: Vec::new(),
    };
    crate::weights::build(config.clone(), &mut src)?;
    let unused: Vec<&String> = if strict {
        src.present
            .keys()
            .filter(|n| !src.asked.contains(*n))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    } else {
        Vec::new()
    };
    if src.missing.is_empty() && src.wrong.is_empty() && unused.is_empty() {
        return Ok(());
    }
    let list = |names: Vec<&String>| {
        let shown: Vec<&str> = names.iter().take(4).map(|s| s.as_str()).collect();
        let more = names.len().saturating_sub(shown.len());
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("{}{tail}", shown.join(", "))
    };
    let mut why = Vec::new();
    if !src.missing.is_empty() {
        why.push(format!("lacks {}", list(src.missing.iter().collect())));
    }
    if !src.wrong.is_empty() {
        why.push(src.wrong.join("; "));
    }
    if !unused.is_empty() {
        why.push(format!(
            "has tensors its forward would not use: {}",
            list(unused)
        ));
    }
    let features = config.plan.features();
    let plan = if features.is_empty() {
        String::new()
    } else {
        format!(" with {}", features.join(", "))
    };
    Err(ModelError::Unsupported(format!(
        "architecture '{}'{plan}: the file {}",
        config.arch.name(),
        why.join("; ")
    )))
}
