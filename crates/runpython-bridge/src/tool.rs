//! The `Tool` trait, closures as tools, and `ToolSet`.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::Error;

/// The arguments of one call, as the code passed them. Tools with a JSON Schema receive everything by
/// name in `kwargs` (the generated Python signature binds positional arguments to their names first);
/// schemaless tools receive `args` and `kwargs` exactly as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolArgs {
    /// Positional arguments.
    #[serde(default)]
    pub args: Vec<Value>,
    /// Keyword arguments, in the order written.
    #[serde(default)]
    pub kwargs: Map<String, Value>,
    /// This call's idempotency key, `<run id>.<ordinal>`, filled by a bridge that knows its run
    /// ([`crate::Bridge::with_run_id`]): the same for the same call when a resumed run makes it again,
    /// so a tool with side effects can tell a repeated call from a new one. Not part of the arguments
    /// (never serialized, not in the journal's hash).
    #[serde(skip)]
    pub call_id: Option<String>,
}

impl ToolArgs {
    /// The argument named `name`: a keyword argument, or else nothing.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.kwargs.get(name)
    }

    /// Positional argument `index`, else keyword `name`: convenient for schemaless tools.
    pub fn arg(&self, index: usize, name: &str) -> Option<&Value> {
        self.args.get(index).or_else(|| self.kwargs.get(name))
    }
}

/// The `kind` of [`ToolError::suspend`].
pub(crate) const SUSPEND_KIND: &str = "runpython.Suspend";

/// A tool's failure, raised in the code as an exception. `kind` names the exception class: a Python
/// built-in (`ValueError`, `KeyError`, `TimeoutError`) keeps its type; anything else becomes a
/// `ToolError` subclass of that name whose message carries the kind and the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ToolError {
    /// Exception class name.
    #[serde(rename = "type")]
    pub kind: String,
    /// Human-readable message.
    pub message: String,
}

impl ToolError {
    /// An error of class `kind`.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
        }
    }

    /// Not a failure: the tool asks for a human decision about `request`. The run stops (the child is
    /// killed, the journal kept) and is resumed later with the decision as this call's result.
    pub fn suspend(request: Value) -> Self {
        Self::new(SUSPEND_KIND, request.to_string())
    }

    /// True for [`ToolError::suspend`].
    pub fn is_suspension(&self) -> bool {
        self.kind == SUSPEND_KIND
    }

    /// A `ValueError`: the arguments were wrong.
    pub fn value_error(message: impl Into<String>) -> Self {
        Self::new("ValueError", message)
    }
}

/// Something the code can call. Implement it for a type, or use [`tool_fn`] for a closure.
pub trait Tool: Send + Sync {
    /// The name the code calls it by.
    fn name(&self) -> &str;
    /// What it does, for the generated stub a model reads.
    fn description(&self) -> &str {
        ""
    }
    /// JSON Schema of the input (an object with `properties`), or `None` for a tool that takes
    /// `*args, **kwargs` as written.
    fn input_schema(&self) -> Option<&Value> {
        None
    }
    /// True when a call's result depends only on its arguments and it has no side effects, so a run
    /// that called only pure tools may be memoized. Default: false.
    fn is_pure(&self) -> bool {
        false
    }
    /// True for the host's own plumbing (artifact access): served like any tool, but not defined as a
    /// global in the code nor listed in stubs. Default: false.
    fn is_hidden(&self) -> bool {
        false
    }
    /// True for a tool whose arguments and result are runpython's tagged JSON (exact Python values:
    /// tuples, sets, dates, bytes, dataclasses...; see `runpython_core::VALUES_PY`), as a host's
    /// Python callables take and give them. The child encodes this tool's arguments and decodes its
    /// result with that codec; other tools get and give plain JSON. Default: false.
    fn typed_values(&self) -> bool {
        false
    }
    /// True for a tool that runs other runs (a nested `run_python`): under a [`crate::CallBudget`]
    /// its call holds no slot of the tree's concurrent calls (the runs it starts take theirs for their
    /// own calls). Default: false.
    fn runs_nested(&self) -> bool {
        false
    }
    /// Run the call. An `Err` reaches the code as an exception.
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>>;
    /// Continue a call that suspended with `request` (the payload of its [`ToolError::suspend`]), now
    /// that `decision` is known. `None` (the default): the decision itself is the call's result. A tool
    /// that runs something suspendable (a nested run) resumes it here, and may suspend again.
    fn resume(
        &self,
        request: Value,
        decision: Value,
    ) -> Option<BoxFuture<'static, Result<Value, ToolError>>> {
        let _ = (request, decision);
        None
    }
}

/// A tool made from a closure or an async function; see [`tool_fn`].
pub struct FnTool<F> {
    name: String,
    description: String,
    schema: Option<Value>,
    pure: bool,
    function: F,
}

impl<F> FnTool<F> {
    /// Declares the tool pure (see [`Tool::is_pure`]).
    pub fn pure(mut self) -> Self {
        self.pure = true;
        self
    }
}

impl<F> fmt::Debug for FnTool<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTool")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A tool from a name, a description, an optional JSON Schema and an async closure.
///
/// ```
/// use runpython_bridge::{tool_fn, ToolError};
/// use serde_json::{json, Value};
///
/// let double = tool_fn(
///     "double",
///     "Twice x.",
///     Some(json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})),
///     |args| async move {
///         let x = args.get("x").and_then(Value::as_i64).ok_or_else(|| ToolError::value_error("x must be an integer"))?;
///         Ok(json!(x * 2))
///     },
/// );
/// ```
pub fn tool_fn<F, Fut>(
    name: impl Into<String>,
    description: impl Into<String>,
    schema: Option<Value>,
    function: F,
) -> FnTool<F>
where
    F: Fn(ToolArgs) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    FnTool {
        name: name.into(),
        description: description.into(),
        schema,
        pure: false,
        function,
    }
}

impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(ToolArgs) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn input_schema(&self) -> Option<&Value> {
        self.schema.as_ref()
    }
    fn is_pure(&self) -> bool {
        self.pure
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        Box::pin((self.function)(args))
    }
}

/// One parameter of a tool, read from its schema in property order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Param {
    /// Property name.
    pub(crate) name: String,
    /// Listed in `required`.
    pub(crate) required: bool,
    /// The schema's `default`, else `null` for an optional parameter.
    pub(crate) default: Value,
    /// The property's own schema.
    #[serde(skip)]
    pub(crate) schema: Value,
}

/// The parameters a schema declares, required and optional, in property order.
pub(crate) fn params_of(schema: &Value) -> Vec<Param> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .map(|(name, prop)| Param {
                    name: name.clone(),
                    required: required.contains(&name.as_str()),
                    default: prop.get("default").cloned().unwrap_or(Value::Null),
                    schema: prop.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The tools a run exposes, by name.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.tools.keys()).finish()
    }
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool; a second tool with the same name, or a schema parameter that is not a Python
    /// identifier, is an error.
    pub fn insert(&mut self, tool: impl Tool + 'static) -> Result<(), Error> {
        self.insert_arc(Arc::new(tool))
    }

    /// Adds a shared tool.
    pub fn insert_arc(&mut self, tool: Arc<dyn Tool>) -> Result<(), Error> {
        let name = tool.name().to_owned();
        if name.is_empty() {
            return Err(Error::InvalidTool {
                name,
                reason: "the name is empty".into(),
            });
        }
        if let Some(schema) = tool.input_schema() {
            for p in params_of(schema) {
                if !is_python_identifier(&p.name) {
                    return Err(Error::InvalidTool {
                        name,
                        reason: format!(
                            "parameter {:?} is not a Python identifier; rename the schema property",
                            p.name
                        ),
                    });
                }
            }
        }
        if self.tools.contains_key(&name) {
            return Err(Error::InvalidTool {
                name,
                reason: "a tool of that name is already in the set".into(),
            });
        }
        self.tools.insert(name, tool);
        Ok(())
    }

    /// Looks a tool up by name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// The tools, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.values()
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// A stable digest of the set's names, descriptions, schemas and purity, for memo keys.
    pub fn fingerprint(&self) -> String {
        let mut text = String::new();
        for tool in self.iter() {
            let schema = tool
                .input_schema()
                .map(Value::to_string)
                .unwrap_or_default();
            text.push_str(&format!(
                "{}\u{0}{}\u{0}{schema}\u{0}{}\u{0}{}\u{1}",
                tool.name(),
                tool.description(),
                tool.is_pure(),
                tool.typed_values()
            ));
        }
        text
    }

    /// What the child needs to generate one function per tool: name, description and parameters
    /// (`None` for schemaless tools).
    pub(crate) fn client_specs(&self) -> Vec<ToolClientSpec> {
        self.iter()
            .map(|t| ToolClientSpec {
                name: t.name().to_owned(),
                description: t.description().to_owned(),
                params: t.input_schema().map(params_of),
                hidden: t.is_hidden(),
                typed: t.typed_values(),
            })
            .collect()
    }
}

/// One tool as the child's client builds its function: part of [`crate::ClientSpec`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolClientSpec {
    name: String,
    description: String,
    /// The parameters its schema declares, in order (`None`: a schemaless tool, `*args, **kwargs`).
    params: Option<Vec<Param>>,
    /// The host's plumbing, reached through the runner's helpers, not defined as a function.
    hidden: bool,
    /// Its arguments and result cross as runpython's tagged JSON (exact values).
    typed: bool,
}

impl ToolClientSpec {
    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Whether `name` is a Python identifier that is not a keyword (usable as a global or a parameter).
pub fn is_python_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && !PYTHON_KEYWORDS.contains(&name)
}

const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn params_follow_property_order_and_required() {
        let schema = json!({"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer", "default": 10}, "tag": {"type": "string"}
        }, "required": ["query"]});
        let params = params_of(&schema);
        let names: Vec<_> = params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["query", "limit", "tag"]);
        assert!(params[0].required && !params[1].required);
        assert_eq!(params[1].default, json!(10));
        assert_eq!(params[2].default, Value::Null);
    }

    #[test]
    fn duplicate_and_non_identifier_parameters_are_refused() {
        let mut set = ToolSet::new();
        let t = || tool_fn("t", "", None, |_| async { Ok(Value::Null) });
        set.insert(t()).unwrap();
        assert!(matches!(set.insert(t()), Err(Error::InvalidTool { .. })));
        let bad = tool_fn(
            "u",
            "",
            Some(json!({"properties": {"not-ok": {}}})),
            |_| async { Ok(Value::Null) },
        );
        assert!(matches!(set.insert(bad), Err(Error::InvalidTool { .. })));
    }
}
