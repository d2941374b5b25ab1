//! Chat templates: the model's own Jinja template rendered with minijinja,
//! with the Python string methods and helpers Hugging Face templates use.

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

/// Instructions one render may run: a real template spends a few hundred
/// per message, so only a runaway loop reaches this, after about a tenth
/// of a second of one core (a hostile template must not cost seconds).
const RENDER_FUEL: u64 = 5_000_000;
/// Bytes one render may write: far more than any context window holds.
const RENDER_BYTES: usize = 64 << 20;
/// Nesting of calls, macros and includes.
const RENDER_DEPTH: usize = 64;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    // Templates only print dates; a fixed clock keeps prompts reproducible.
    let _ = format;
    "01 Jan 2026".to_string()
}

impl ChatTemplate {
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_recursion_limit(RENDER_DEPTH);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| format!("chat template: {e}"))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
        })
    }

    /// Renders `messages` (OpenAI-shaped JSON objects). `extra` holds
    /// template variables such as `tools` and `chat_template_kwargs`.
    pub fn render(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, Json>,
    ) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut ctx = extra.clone();
        ctx.insert("messages".into(), Json::Array(messages.to_vec()));
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        let mut out = Bounded(Vec::new());
        tmpl.render_captured_to(Value::from_serialize(&ctx), &mut out)
            .map_err(|e| {
                let mut msg = format!("chat template: {e}");
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(&format!(": {s}"));
                    src = s.source();
                }
                msg
            })?;
        String::from_utf8(out.0).map_err(|e| format!("chat template: {e}"))
    }
}

/// A buffer that refuses to grow past [`RENDER_BYTES`].
struct Bounded(Vec<u8>);

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > RENDER_BYTES {
            return Err(std::io::Error::other(format!(
                "the rendered prompt exceeds {RENDER_BYTES} bytes"
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_chatml_with_python_methods() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            None,
            None,
        )
        .unwrap();
        let out = t
            .render(
                &[json!({"role": "user", "content": "  hi "})],
                true,
                &Default::default(),
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn runaway_templates_end_with_an_error() {
        let render = |src: &str| {
            let t = ChatTemplate::new(src, None, None).unwrap();
            t.render(
                &[json!({"role": "user", "content": "x"})],
                true,
                &Default::default(),
            )
        };
        let endless =
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
        let err = render(endless).unwrap_err();
        assert!(err.contains("fuel"), "{err}");
        // Found by fuzzing: four million empty prints.
        let prints =
            "{% for i in range(0250) %}{% for j in range(16874) %}{{ c }}{% endfor %}{% endfor %}";
        assert!(render(prints).unwrap_err().contains("fuel"));
        let huge = "{% for a in range(10000) %}{{ 'x' * 100000 }}{% endfor %}";
        assert!(render(huge).is_err());
        let deep = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        assert!(render(deep).is_err());
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", None, None).unwrap();
        let err = t.render(&[], true, &Default::default()).unwrap_err();
        assert!(err.contains("no system role"), "{err}");
    }
}
