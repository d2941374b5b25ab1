//! Chat templates with hostile messages: any template source and any
//! messages render or answer an error, within the render limits.
//!
//! Input: the template source, a NUL byte, then the messages as JSON (an
//! array of message objects, or anything else, wrapped as one message's
//! content). Without a NUL, the bytes are a message's content rendered by
//! the real ChatML template SmolLM2 and Qwen2.5 ship.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use tensorfold_engine::ChatTemplate;

const CHATML: &str =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}\
{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fuzz_target!(|data: &[u8]| {
    let (source, messages) = match data.iter().position(|&b| b == 0) {
        Some(at) => (
            String::from_utf8_lossy(&data[..at]).into_owned(),
            &data[at + 1..],
        ),
        None => (CHATML.to_string(), data),
    };
    let messages = match serde_json::from_slice::<Value>(messages) {
        Ok(Value::Array(list)) => list,
        Ok(other) => vec![json!({"role": "user", "content": other})],
        Err(_) => vec![json!({"role": "user", "content": String::from_utf8_lossy(messages)})],
    };
    let Ok(template) = ChatTemplate::new(&source, Some("<s>"), Some("</s>")) else {
        return;
    };
    let vars = serde_json::Map::from_iter([("tools".to_string(), json!([{"type": "function"}]))]);
    let _ = template.render(&messages, true, &vars);
});
