//! The hidden tool behind the exception a refused connection raises in the code: the runner asks the
//! host why, and names the rule in the `PermissionError`.

use runpython_bridge::{BoxFuture, Tool, ToolArgs, ToolError};
use runpython_egress::EgressQuery;
use serde_json::Value;

/// Name of the hidden tool the runner calls after a connect failed with `EACCES`.
pub(crate) const WHY_REFUSED: &str = "runpython_network_refusal";

/// Answers `{host, port}` with why the run's network refused it (or null).
#[derive(Debug)]
pub(crate) struct WhyRefused {
    pub query: EgressQuery,
}

impl Tool for WhyRefused {
    fn name(&self) -> &str {
        WHY_REFUSED
    }
    fn is_hidden(&self) -> bool {
        true
    }
    fn is_pure(&self) -> bool {
        true
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let host = args
            .get("host")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let port = args.get("port").and_then(Value::as_u64).unwrap_or(0);
        let reason = u16::try_from(port)
            .ok()
            .and_then(|port| self.query.refusal_reason(&host, port));
        Box::pin(async move { Ok(reason.map_or(Value::Null, Value::String)) })
    }
}
