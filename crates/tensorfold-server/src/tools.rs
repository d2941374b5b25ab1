//! Tool calls in the model's own format: the Hermes/Qwen
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks that
//! both registry models' templates teach, parsed with serde_json and typed
//! by each function's JSON schema.

use serde_json::{json, Value};

pub const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A parsed call: function name and its arguments object.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

fn call_of(v: &Value) -> Option<ToolCall> {
    let name = v["name"].as_str()?;
    Some(ToolCall {
        name: name.to_string(),
        arguments: match &v["arguments"] {
            Value::String(s) => serde_json::from_str(s).unwrap_or(json!({})),
            Value::Null => json!({}),
            other => other.clone(),
        },
    })
}

/// A reply that is nothing but a call object (or a list of them), bare or
/// in a ```json fence, naming offered functions: small models often answer
/// so instead of writing the tags.
fn bare_calls(text: &str, offered: &[&str]) -> Option<Vec<ToolCall>> {
    let t = text.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .unwrap_or(t);
    let t = t.strip_suffix("```").unwrap_or(t).trim();
    let items = match serde_json::from_str::<Value>(t).ok()? {
        Value::Array(a) => a,
        v => vec![v],
    };
    let calls: Vec<ToolCall> = items.iter().filter_map(call_of).collect();
    let valid = calls.len() == items.len()
        && calls
            .iter()
            .all(|c| offered.contains(&c.name.as_str()) && c.arguments.is_object());
    valid.then_some(calls)
}

/// Splits a reply into its text before the first call and the calls.
/// Blocks that do not parse as a call stay in the text.
pub fn parse(text: &str, offered: &[&str]) -> (String, Vec<ToolCall>) {
    let Some(first) = text.find(OPEN) else {
        return match bare_calls(text, offered) {
            Some(calls) => (String::new(), calls),
            None => (text.to_string(), Vec::new()),
        };
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(OPEN) {
        let body_start = start + OPEN.len();
        let end = rest[body_start..].find(CLOSE).map(|e| body_start + e);
        let body = &rest[body_start..end.unwrap_or(rest.len())];
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .as_ref()
            .and_then(call_of)
        {
            Some(call) => calls.push(call),
            None => return (text.to_string(), Vec::new()),
        }
        rest = match end {
            Some(e) => &rest[e + CLOSE.len()..],
            None => "",
        };
    }
    (text[..first].trim_end().to_string(), calls)
}

/// Converts argument values to the types the schema declares, where the
/// model wrote them as another JSON type ("5" for an integer, say).
pub fn type_arguments(args: &Value, schema: &Value) -> Value {
    let Value::Object(map) = args else {
        return args.clone();
    };
    let props = &schema["properties"];
    let typed = map
        .iter()
        .map(|(k, v)| {
            let ty = props[k]["type"].as_str().unwrap_or("");
            let v = match (ty, v) {
                ("integer", Value::String(s)) => s
                    .trim()
                    .parse::<i64>()
                    .map(Value::from)
                    .unwrap_or(v.clone()),
                ("number", Value::String(s)) => s
                    .trim()
                    .parse::<f64>()
                    .map(Value::from)
                    .unwrap_or(v.clone()),
                ("boolean", Value::String(s)) => match s.trim() {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    _ => v.clone(),
                },
                ("string", Value::Number(n)) => Value::String(n.to_string()),
                ("object", o @ Value::Object(_)) => type_arguments(o, &props[k]),
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    Value::Object(typed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_blocks_and_keeps_leading_text() {
        let (text, calls) = parse(
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            &["get_weather"],
        );
        assert_eq!(text, "Let me check.");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"})
            }]
        );
    }

    #[test]
    fn broken_blocks_stay_text() {
        let (text, calls) = parse("<tool_call>{not json}</tool_call>", &[]);
        assert!(calls.is_empty());
        assert_eq!(text, "<tool_call>{not json}</tool_call>");
    }

    #[test]
    fn a_fenced_call_object_naming_an_offered_tool_is_a_call() {
        let reply =
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```";
        assert_eq!(parse(reply, &["get_weather"]).1.len(), 1);
        assert!(
            parse(reply, &["other"]).1.is_empty(),
            "only offered functions"
        );
        assert!(parse("{\"name\": \"x\"} and more", &["x"]).1.is_empty());
    }

    #[test]
    fn arguments_follow_the_schema() {
        let schema = json!({"properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "s": {"type": "string"}}});
        let typed = type_arguments(&json!({"n": "5", "x": "2.5", "s": 7}), &schema);
        assert_eq!(typed, json!({"n": 5, "x": 2.5, "s": "7"}));
    }
}
