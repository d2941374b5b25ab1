//! Request bodies as typed structures, one per route, and the one place
//! that turns a body that does not fit its type into an OpenAI-shaped 400
//! naming the field. Unknown fields are ignored, as OpenAI's API does.

use crate::error::ApiError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Parses `body` as JSON, then as `T`; the error names the field that
/// did not fit (`messages[1].role`, `temperature`).
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value = json_object(body)?;
    typed(&value)
}

/// The body as a JSON object; anything else is a 400.
pub fn json_object(body: &[u8]) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(ApiError::bad_request("request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
    }
}

/// Reads one typed view of an already parsed body.
pub fn typed<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner().to_string();
        if field == "." {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::bad_request(format!("invalid '{field}': {inner}")).param(&field)
        }
    })
}

/// One string or a list of strings (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// `logprobs`: a flag (chat) or a count of alternatives (completions).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    Flag(bool),
    Count(u32),
}

/// A seed: any JSON integer (negative ones wrap, as llama.cpp reads them).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Seed {
    Unsigned(u64),
    Signed(i64),
}

impl Seed {
    pub fn value(self) -> u64 {
        match self {
            Seed::Unsigned(v) => v,
            Seed::Signed(v) => v as u64,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Fields every generating route reads: model, sampling, length, stops,
/// streaming and the engine's extensions.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Generation {
    pub model: Option<String>,
    pub n: Option<u32>,
    pub temperature: Option<f32>,
    /// 0 or less: no top-k cut.
    pub top_k: Option<i64>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub seed: Option<Seed>,
    pub stop: Option<OneOrMany>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub max_output_tokens: Option<u32>,
    pub ignore_eos: Option<bool>,
    pub draft: Option<bool>,
    pub cache_prompt: Option<bool>,
    pub logprobs: Option<Logprobs>,
    pub top_logprobs: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Structured output (chat and completions).
    pub response_format: Option<ResponseFormat>,
    /// A Lark or GBNF grammar the reply matches.
    pub grammar: Option<String>,
    /// A regular expression the reply matches.
    pub regex: Option<String>,
    /// A JSON schema the reply matches (llama.cpp's field).
    pub json_schema: Option<Value>,
}

/// `response_format` of chat and completions.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    pub schema: Option<Value>,
}

/// `text.format` of a response: the same choices, the schema inline.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponsesFormat {
    Text,
    JsonObject,
    JsonSchema { schema: Option<Value> },
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesText {
    pub format: Option<ResponsesFormat>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// A JSON string as OpenAI sends it, or an object.
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolCallIn {
    pub id: Option<String>,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Option<Content>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Function {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON schema of the arguments; an empty object schema when absent.
    #[serde(default = "empty_object_schema")]
    pub parameters: Value,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: Function,
}

fn function_kind() -> String {
    "function".into()
}

#[derive(Debug, Clone, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// `tool_choice`: `none`, `auto`, `required`, or one named function.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named { function: NamedFunction },
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<Message>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    pub reasoning_effort: Option<String>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// `none` leaves `<think>` blocks in the content.
    pub reasoning_format: Option<String>,
    /// Reply tokens the reasoning may take before its block is closed.
    pub max_thinking_tokens: Option<u32>,
}

/// `prompt` of a completion: text, a list of one text, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CompletionPrompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionBody {
    pub prompt: CompletionPrompt,
}

/// `input` of a response: text or a list of messages.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Messages(Vec<Message>),
}

/// `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesBody {
    pub input: ResponseInput,
    pub previous_response_id: Option<String>,
    /// Keep the response for `previous_response_id` and `GET` (default true).
    pub store: Option<bool>,
    pub text: Option<ResponsesText>,
    pub instructions: Option<String>,
    pub reasoning_effort: Option<String>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// `POST /tokenize`: text as it is, or chat messages through the template.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeBody {
    pub content: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<Message>>,
    pub tools: Option<Vec<Tool>>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// With `messages`: end with the assistant's turn opened (default true).
    pub add_generation_prompt: Option<bool>,
    /// Add the model's BOS where it expects one (default true).
    pub add_special: Option<bool>,
    /// Also give each token's text.
    pub with_pieces: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeBody {
    pub tokens: Vec<u32>,
}

/// `system` of a Messages request: text or text blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SystemPrompt {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block of the Anthropic Messages API.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: Option<ToolResultContent>,
        is_error: Option<bool>,
    },
    /// Earlier reasoning sent back; templates drop it from the history.
    Thinking {},
    RedactedThinking {},
    Image {},
    Document {},
}

/// A tool result's content: text or blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ToolResultContent {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum BlockContent {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConversationRole {
    User,
    Assistant,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ConversationMessage {
    pub role: ConversationRole,
    pub content: BlockContent,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AnthropicTool {
    pub name: String,
    pub description: Option<String>,
    #[serde(default = "empty_object_schema")]
    pub input_schema: Value,
}

/// `tool_choice` of a Messages request.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AnthropicToolChoice {
    Auto {},
    Any {},
    None {},
    Tool { name: String },
}

/// `thinking` of a Messages request.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingConfig {
    Enabled { budget_tokens: Option<u32> },
    Disabled {},
}

/// `POST /v1/messages` and `POST /v1/messages/count_tokens`.
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesBody {
    pub model: Option<String>,
    /// Required by `/v1/messages`, not by `count_tokens`.
    pub max_tokens: Option<u32>,
    pub messages: Vec<ConversationMessage>,
    pub system: Option<SystemPrompt>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<AnthropicTool>>,
    pub tool_choice: Option<AnthropicToolChoice>,
    pub thinking: Option<ThinkingConfig>,
    /// Engine extensions, as on the OpenAI routes.
    pub seed: Option<Seed>,
    pub draft: Option<bool>,
    pub cache_prompt: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_field_is_named() {
        let e = parse::<ChatBody>(br#"{"messages": [{"role": "wizard", "content": "hi"}]}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert!(e.message.contains("wizard"), "{}", e.message);
        let e = parse::<Generation>(br#"{"temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse::<ChatBody>(br#"{"model": "m"}"#).unwrap_err();
        assert!(e.message.contains("messages"), "{}", e.message);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let g: Generation =
            parse(br#"{"temperature": 0.5, "frequency_penalty": 0, "user": "x", "stop": "a"}"#)
                .unwrap();
        assert_eq!(g.temperature, Some(0.5));
        assert_eq!(g.stop.unwrap().into_vec(), vec!["a"]);
    }
}
