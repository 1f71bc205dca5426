//! The `delegate {instance, prompt}` tool: the agent hands a prompt to
//! another instance on this machine and gets its answer as the call's
//! output, or a recorded failure naming the bus code.
//!
//! The call's delegation id is made from its run and call id, which a
//! recovered call gets again: a call the crash left open is sent again
//! (the tool is `idempotent`) and the other instance, seeing the same
//! delegation, answers with its first outcome instead of running the
//! prompt twice. The depth travels: a call inside a run that was itself
//! delegated here sends that run's depth plus one, so a loop of
//! delegations stops at `max_depth` wherever it turns.

use std::path::PathBuf;

use serde_json::{Value, json};
use spool_journal::Principal;
use spool_journal::event::Effect;
use spool_runtime::engine::ToolSpec;
use spool_runtime::{BoxFuture, Tool, ToolContext, ToolOutcome};
use spool_wire::bus::{BusResponse, ErrorCode};
use tokio_util::sync::CancellationToken;

use crate::client::{Options, Route, talk};
use crate::config::BusSection;
use crate::server::{AUTHENTICATOR, DEPTH_ATTRIBUTE};

/// The tool's name.
pub const NAME: &str = "delegate";

/// `delegate`, for an instance named on the bus.
#[derive(Clone, Debug)]
pub struct Delegate {
    from: String,
    peers: Vec<String>,
    max_depth: u64,
    registry: PathBuf,
    options: Options,
}

impl Delegate {
    /// The tool `[bus]` describes: it delegates as `section.instance`, to
    /// its peers, found in its registry.
    #[must_use]
    pub fn new(section: &BusSection) -> Self {
        Self {
            from: section.instance.clone(),
            peers: section.peers.clone(),
            max_depth: section.max_depth,
            registry: section.registry_path(),
            options: section.options(),
        }
    }

    /// The checks made before anything is sent: the bus is on, the target
    /// is a peer, the depth is below the maximum.
    fn check(&self, instance: &str, depth: u64) -> Result<(), (ErrorCode, String)> {
        if self.peers.is_empty() {
            return Err((
                ErrorCode::BusDisabled,
                format!("instance {} has no bus peers", self.from),
            ));
        }
        if !self
            .peers
            .iter()
            .any(|peer| peer == "*" || peer == instance)
        {
            return Err((
                ErrorCode::PeerNotAllowed,
                format!("instance `{instance}` is not a peer of {}", self.from),
            ));
        }
        if depth >= self.max_depth {
            return Err((
                ErrorCode::MaxDepthExceeded,
                format!(
                    "a delegation {depth} hops deep reaches this instance's maximum of {}",
                    self.max_depth
                ),
            ));
        }
        Ok(())
    }
}

/// How deep a delegation from a run made by `principal` goes: one past
/// the run's own depth when the bus made it, else one.
#[must_use]
pub fn next_depth(principal: Option<&Principal>) -> u64 {
    principal
        .filter(|p| p.authenticator == AUTHENTICATOR)
        .and_then(|p| p.attributes.get(DEPTH_ATTRIBUTE))
        .and_then(|depth| depth.parse::<u64>().ok())
        .map_or(1, |depth| depth.saturating_add(1))
}

/// The delegation id of a call: the same for every execution of it, and
/// another for a call of another turn ([`ToolContext::stable_id`]).
#[must_use]
pub fn delegation_id(context: &ToolContext) -> String {
    context.stable_id("delegation")
}

/// What the model reads of a failure: the bus code first, so it (and
/// whoever reads the recorded failure) can tell a refusal from an outage.
fn failure_text(instance: &str, code: &ErrorCode, retryable: bool, message: &str) -> String {
    let retry = if retryable {
        "retryable"
    } else {
        "not retryable"
    };
    format!("bus error {code} ({retry}) from instance {instance}: {message}")
}

impl Tool for Delegate {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.into(),
            description:
                "Hand a prompt to another agent instance on this machine and wait for its answer."
                    .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "instance": {"type": "string", "minLength": 1, "description": "The instance's name on the bus."},
                    "prompt": {"type": "string", "description": "What to ask it."}
                },
                "required": ["instance", "prompt"],
                "additionalProperties": false
            }),
        }
    }

    fn effect(&self) -> Effect {
        // The other instance runs a delegation id once: sending it again
        // after a crash gets the first outcome.
        Effect::Idempotent
    }

    fn call<'a>(
        &'a self,
        _input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async {
            ToolOutcome::Error(
                "`delegate` runs inside a run: its delegation id is made from the call's".into(),
            )
        })
    }

    fn call_in<'a>(
        &'a self,
        context: &'a ToolContext,
        input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            let instance = input["instance"].as_str().unwrap_or_default().to_owned();
            let prompt = input["prompt"].as_str().unwrap_or_default();
            let depth = next_depth(context.principal.as_ref());
            if let Err((code, message)) = self.check(&instance, depth) {
                let retryable = code.retryable();
                return ToolOutcome::Error(failure_text(&instance, &code, retryable, &message));
            }
            let route = Route::Registry {
                path: self.registry.clone(),
                instance: instance.clone(),
            };
            let sent = talk(
                &self.from,
                &route,
                prompt,
                depth,
                Some(delegation_id(context)),
                &self.options,
            );
            let answer: BusResponse = tokio::select! {
                answer = sent => answer,
                () = cancel.cancelled() => {
                    // The delegated run is cancelled with the turn that
                    // asked for it, where the other instance can hear it.
                    let told = crate::client::cancel(
                        &self.from,
                        &route,
                        &delegation_id(context),
                        CANCEL_TIMEOUT,
                    )
                    .await;
                    let told = match told {
                        Ok(outcome) => format!("its run there: {outcome}"),
                        Err((code, why)) => format!("its run there could not be told ({code}: {why})"),
                    };
                    return ToolOutcome::Error(format!(
                        "the delegation to {instance} was cancelled with its turn; {told}"
                    ));
                }
            };
            if answer.success {
                return ToolOutcome::Output(Value::String(answer.text().to_owned()));
            }
            let code = answer.code().unwrap_or(ErrorCode::Unclassified);
            ToolOutcome::Error(failure_text(
                &instance,
                &code,
                answer.is_retryable(),
                answer.error.as_deref().unwrap_or("the delegation failed"),
            ))
        })
    }
}

/// How long telling the other instance of a cancel may take before the
/// cancelled turn ends without it.
const CANCEL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_the_bus_made_delegates_one_hop_deeper_and_any_other_run_at_one() {
        let delegated = Principal {
            authenticator: AUTHENTICATOR.into(),
            kind: "instance".into(),
            id: "reviewer".into(),
            attributes: [(DEPTH_ATTRIBUTE.to_owned(), "2".to_owned())].into(),
        };
        assert_eq!(next_depth(Some(&delegated)), 3);
        // A token's principal with a `depth` attribute is not a hop.
        let token = Principal {
            authenticator: "token".into(),
            ..delegated
        };
        assert_eq!(next_depth(Some(&token)), 1);
        assert_eq!(next_depth(None), 1);
    }

    #[test]
    fn a_calls_delegation_id_is_the_same_each_time_and_another_calls_differs() {
        let run = spool_journal::RunId::new("run_a").unwrap();
        let turn = |t: &str| spool_journal::TurnId::new(t).unwrap();
        let context = ToolContext::new(run.clone(), turn("turn_1"), "call_1");
        assert_eq!(
            delegation_id(&context),
            delegation_id(&ToolContext::new(run.clone(), turn("turn_1"), "call_1"))
        );
        for other in [
            ToolContext::new(run.clone(), turn("turn_1"), "call_2"),
            // The same call id in the next turn is another call.
            ToolContext::new(run.clone(), turn("turn_2"), "call_1"),
            ToolContext::new(
                spool_journal::RunId::new("run_b").unwrap(),
                turn("turn_1"),
                "call_1",
            ),
        ] {
            assert_ne!(delegation_id(&context), delegation_id(&other));
        }
    }
}
