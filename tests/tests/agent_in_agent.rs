//! The agent-in-agent example, driven by scripted models (and by Claude when a key is set).

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

#[path = "../examples/agent_in_agent.rs"]
mod example;

use std::sync::{Arc, Mutex};

use example::{agent_in_agent, AnthropicModel, BoxFuture, Message, Model, Reply};
use runpython_core::ToolDefinition;
use serde_json::{json, Value};

/// One scripted turn: the reply as a function of the conversation so far.
type Turn = Box<dyn Fn(&[Message]) -> Reply + Send>;

/// A model that answers from a script: each turn is a function of the conversation so far.
struct Scripted {
    turns: Mutex<Vec<Turn>>,
    seen_tools: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(turns: Vec<Turn>) -> Arc<Self> {
        Arc::new(Self {
            turns: Mutex::new(turns.into_iter().rev().collect()),
            seen_tools: Mutex::new(Vec::new()),
        })
    }
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripted").finish_non_exhaustive()
    }
}

impl Model for Scripted {
    fn respond<'a>(
        &'a self,
        conversation: &'a [Message],
        tools: &'a [ToolDefinition],
    ) -> BoxFuture<'a, Result<Reply, String>> {
        *self.seen_tools.lock().unwrap() = tools.iter().map(|t| t.description.clone()).collect();
        let turn = self.turns.lock().unwrap().pop();
        Box::pin(async move {
            let turn = turn.ok_or("the script ran out of turns")?;
            Ok(turn(conversation))
        })
    }
}

/// The envelope in the conversation's last tool result.
fn last_envelope(conversation: &[Message]) -> Value {
    match conversation.last() {
        Some(Message::ToolResult { content, .. }) => serde_json::from_str(content).unwrap(),
        other => panic!("expected a tool result, got {other:?}"),
    }
}

fn run_python(code: &str) -> Reply {
    Reply::ToolCall {
        id: "call-1".into(),
        name: "run_python".into(),
        input: json!({"code": code}),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn outer_agent_code_asks_an_inner_agent_that_runs_python() {
    let inner = Scripted::new(vec![
        Box::new(|_| run_python("6 * 7")),
        Box::new(|c| Reply::Text(last_envelope(c)["return_value"].to_string())),
    ]);
    let outer = Scripted::new(vec![
        Box::new(|_| run_python("answer = ask_agent('What is 6 * 7?')\nint(answer) + 1")),
        Box::new(|c| {
            Reply::Text(format!(
                "The answer is {}",
                last_envelope(c)["return_value"]
            ))
        }),
    ]);
    let agent = agent_in_agent(outer.clone(), inner.clone()).unwrap();
    assert_eq!(
        agent.ask("6 * 7, plus one?").await.unwrap(),
        "The answer is 43"
    );
    // The outer model was told about ask_agent in run_python's description; the inner one was not.
    assert!(outer.seen_tools.lock().unwrap()[0].contains("def ask_agent(question: str)"));
    assert!(!inner.seen_tools.lock().unwrap()[0].contains("ask_agent"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_inner_agent_failure_raises_in_the_outer_code() {
    let inner = Scripted::new(vec![]);
    let outer = Scripted::new(vec![
        Box::new(|_| {
            run_python(
                "try:\n    ask_agent('?')\nexcept Exception as e:\n    r = type(e).__name__\nr",
            )
        }),
        Box::new(|c| Reply::Text(last_envelope(c)["return_value"].to_string())),
    ]);
    let agent = agent_in_agent(outer, inner).unwrap();
    assert_eq!(agent.ask("go").await.unwrap(), "\"AgentError\"");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs ANTHROPIC_API_KEY and network"]
async fn claude_as_both_agents() {
    let model: Arc<dyn Model> = Arc::new(AnthropicModel::from_env().unwrap());
    let agent = agent_in_agent(Arc::clone(&model), model).unwrap();
    let answer = agent
        .ask("From your Python code, call ask_agent to find the 20th prime number, then reply with its square as digits only.")
        .await
        .unwrap();
    assert!(answer.contains("5041"), "{answer}");
}
