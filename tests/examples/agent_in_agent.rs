//! Agent in agent: an outer agent loop drives `run_python`; the code it writes calls `ask_agent`, a host
//! tool backed by an inner agent loop that itself drives `run_python`.
//!
//! ```sh
//! ANTHROPIC_API_KEY=... cargo run -p runpython-tests --example agent_in_agent -- "What is the 20th prime?"
//! ```
//!
//! The model is behind a small [`Model`] trait: tests script it with canned replies (see
//! `tests/tests/agent_in_agent.rs`); with `ANTHROPIC_API_KEY` set, [`AnthropicModel`] calls the
//! Messages API over HTTPS (reqwest with rustls, already in the tree through the store's S3 client).

#![allow(dead_code)] // the test includes this file for its types and does not use `main`

use std::sync::Arc;

use runpython_core::{tool_fn, RunPython, ToolDefinition, ToolError, ToolFormat};
use serde_json::{json, Value};

/// A boxed future, as a trait object can return it (the one the workspace's traits share).
pub use runpython_bridge::BoxFuture;

/// One entry of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// What the user asked.
    User(String),
    /// The model called a tool.
    ToolCall {
        /// The call's id, echoed in its result.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments.
        input: Value,
    },
    /// A tool's answer.
    ToolResult {
        /// The call's id.
        id: String,
        /// The result (an envelope's JSON for run_python) or the error text.
        content: String,
        /// True when the call could not be served.
        is_error: bool,
    },
}

/// What a model says next: a final answer or one tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The answer; the loop ends.
    Text(String),
    /// A tool to call; the loop answers it and asks again.
    ToolCall {
        /// The call's id.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments.
        input: Value,
    },
}

/// A language model that can call tools.
pub trait Model: Send + Sync + std::fmt::Debug {
    /// The next reply given the conversation so far and the tools on offer.
    fn respond<'a>(
        &'a self,
        conversation: &'a [Message],
        tools: &'a [ToolDefinition],
    ) -> BoxFuture<'a, Result<Reply, String>>;
}

/// A tool-calling loop over one model and one runpython engine.
#[derive(Debug)]
pub struct Agent {
    model: Arc<dyn Model>,
    python: RunPython,
    max_turns: usize,
}

impl Agent {
    /// An agent whose tools are the engine's `run_python` and `get_run_artifact` (and `resume` when
    /// its runs can suspend).
    pub fn new(model: Arc<dyn Model>, python: RunPython) -> Self {
        Self {
            model,
            python,
            max_turns: 8,
        }
    }

    /// Runs the loop until the model answers (or gives up after `max_turns` tool calls).
    pub async fn ask(&self, question: &str) -> Result<String, String> {
        let tools = self.python.tool_definitions();
        let mut conversation = vec![Message::User(question.to_owned())];
        for _ in 0..self.max_turns {
            match self.model.respond(&conversation, &tools).await? {
                Reply::Text(answer) => return Ok(answer),
                Reply::ToolCall { id, name, input } => {
                    let (content, is_error) =
                        match self.python.handle_tool_call(&name, &input).await {
                            Ok(value) => (value.to_string(), false),
                            Err(e) => (e.to_string(), true),
                        };
                    conversation.push(Message::ToolCall {
                        id: id.clone(),
                        name,
                        input,
                    });
                    conversation.push(Message::ToolResult {
                        id,
                        content,
                        is_error,
                    });
                }
            }
        }
        Err(format!(
            "no answer after {} tool calls; stopping",
            self.max_turns
        ))
    }
}

/// The outer agent: its code can call `ask_agent(question)`, answered by an inner agent that has its
/// own model and its own `run_python`.
pub fn agent_in_agent(
    outer: Arc<dyn Model>,
    inner: Arc<dyn Model>,
) -> Result<Agent, runpython_core::Error> {
    let helper = Arc::new(Agent::new(inner, RunPython::builder().build()?));
    let ask_agent = tool_fn(
        "ask_agent",
        "Ask a helper agent (which can run Python itself) a question; returns its answer as text.",
        Some(json!({
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "required": ["question"],
        })),
        move |args| {
            let helper = Arc::clone(&helper);
            async move {
                let question = args
                    .get("question")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ToolError::value_error("question must be a string"))?
                    .to_owned();
                helper
                    .ask(&question)
                    .await
                    .map(Value::String)
                    .map_err(|e| ToolError::new("AgentError", e))
            }
        },
    );
    let python = RunPython::builder().tool(ask_agent).build()?;
    Ok(Agent::new(outer, python))
}

/// Claude through the Anthropic Messages API (`ANTHROPIC_API_KEY`; model from `ANTHROPIC_MODEL`).
pub struct AnthropicModel {
    key: String,
    model: String,
    client: reqwest::Client,
}

impl std::fmt::Debug for AnthropicModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("AnthropicModel")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl AnthropicModel {
    /// From the environment, or `None` without `ANTHROPIC_API_KEY`.
    pub fn from_env() -> Option<Self> {
        let key = std::env::var("ANTHROPIC_API_KEY").ok()?;
        let model =
            std::env::var("ANTHROPIC_MODEL").unwrap_or_else(|_| "claude-sonnet-4-5".to_owned());
        Some(Self {
            key,
            model,
            client: reqwest::Client::new(),
        })
    }
}

/// The conversation as Messages API turns.
fn anthropic_messages(conversation: &[Message]) -> Vec<Value> {
    conversation
        .iter()
        .map(|m| match m {
            Message::User(text) => json!({"role": "user", "content": text}),
            Message::ToolCall { id, name, input } => json!({
                "role": "assistant",
                "content": [{"type": "tool_use", "id": id, "name": name, "input": input}],
            }),
            Message::ToolResult {
                id,
                content,
                is_error,
            } => json!({
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": id, "content": content, "is_error": is_error}],
            }),
        })
        .collect()
}

impl Model for AnthropicModel {
    fn respond<'a>(
        &'a self,
        conversation: &'a [Message],
        tools: &'a [ToolDefinition],
    ) -> BoxFuture<'a, Result<Reply, String>> {
        Box::pin(async move {
            let body = json!({
                "model": self.model,
                "max_tokens": 2048,
                "system": "Answer by running Python with run_python when computation helps. Be brief.",
                "tools": tools.iter().map(|t| t.to_format(ToolFormat::Anthropic)).collect::<Vec<_>>(),
                "messages": anthropic_messages(conversation),
            });
            let response = self
                .client
                .post("https://api.anthropic.com/v1/messages")
                .header("x-api-key", &self.key)
                .header("anthropic-version", "2023-06-01")
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .map_err(|e| format!("the Messages API is unreachable: {e}"))?;
            let status = response.status();
            let text = response.text().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("the Messages API answered {status}: {text}"));
            }
            let reply: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let blocks = reply["content"].as_array().cloned().unwrap_or_default();
            if let Some(call) = blocks.iter().find(|b| b["type"] == "tool_use") {
                return Ok(Reply::ToolCall {
                    id: call["id"].as_str().unwrap_or_default().to_owned(),
                    name: call["name"].as_str().unwrap_or_default().to_owned(),
                    input: call["input"].clone(),
                });
            }
            Ok(Reply::Text(
                blocks
                    .iter()
                    .filter_map(|b| b["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
            ))
        })
    }
}

#[tokio::main]
async fn main() {
    let Some(model) = AnthropicModel::from_env() else {
        eprintln!("agent_in_agent: set ANTHROPIC_API_KEY to run it against Claude");
        std::process::exit(2);
    };
    let question = std::env::args().nth(1).unwrap_or_else(|| {
        "Use ask_agent from your Python code to find the 20th prime, then tell me its square."
            .into()
    });
    let model: Arc<dyn Model> = Arc::new(model);
    let agent = match agent_in_agent(Arc::clone(&model), model) {
        Ok(agent) => agent,
        Err(e) => {
            eprintln!("agent_in_agent: {e}");
            std::process::exit(2);
        }
    };
    match agent.ask(&question).await {
        Ok(answer) => println!("{answer}"),
        Err(e) => {
            eprintln!("agent_in_agent: {e}");
            std::process::exit(1);
        }
    }
}
