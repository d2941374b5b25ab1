//! Chat templates: the model's own Jinja template rendered with minijinja,
//! with the Python string methods and helpers Hugging Face templates use.

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

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
        tmpl.render(Value::from_serialize(&ctx)).map_err(|e| {
            let mut msg = format!("chat template: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            msg
        })
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
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", None, None).unwrap();
        let err = t.render(&[], true, &Default::default()).unwrap_err();
        assert!(err.contains("no system role"), "{err}");
    }
}
