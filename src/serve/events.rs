//! A request's samples on the engine: its engine requests submitted (one per prompt, their
//! events merged into one numbering of choices), and the events gathered into each choice's
//! text, tokens and finish reason for a whole (non-streamed) response. Dropping what `submit`
//! returns drops the engine's receivers, which cancels the requests: a client that hangs up frees
//! its place.

use axum::http::StatusCode;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::time::Instant;

use super::errors::ApiError;
use crate::generate::engine::{Engine, Event, Request, SubmitError};
use crate::generate::sampling::Sampled;
use crate::generate::stop::FinishReason;

/// A submission refused by the engine, as the client is told (`what`: `messages` or `prompt`).
pub fn submit_error(e: SubmitError, what: &str) -> ApiError {
    match e {
        SubmitError::PromptTooLong { prompt, max } => ApiError::field(
            what,
            format!(
                "This model's maximum context length is {max} tokens. However, your {what} resulted in \
                 {prompt} tokens. Please reduce the length of the {what}."
            ),
        ),
        SubmitError::UnknownAdapter(name) => ApiError::model_not_found(&name),
        SubmitError::InvalidParams(message) => {
            let param = message.split_whitespace().next().unwrap_or("").to_string();
            ApiError::field(&param, message)
        }
        SubmitError::Stopped => {
            ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", "The engine has stopped.")
        }
    }
}

/// Submits `requests` (each of `per_request` samples); their events come out of one receiver,
/// request k's sample i as choice `k * per_request + i`.
pub fn submit(
    engine: &Engine,
    requests: Vec<Request>,
    per_request: usize,
    what: &str,
) -> Result<UnboundedReceiver<Event>, ApiError> {
    let receivers = requests
        .into_iter()
        .map(|r| engine.submit(r).map_err(|e| submit_error(e, what)))
        .collect::<Result<Vec<_>, _>>()?;
    if receivers.len() == 1 {
        return Ok(receivers.into_iter().next().expect("one receiver"));
    }
    let (tx, merged) = unbounded_channel();
    for (k, mut rx) in receivers.into_iter().enumerate() {
        let tx = tx.clone();
        let offset = k * per_request;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    // the client is gone: dropping `rx` cancels the engine's request
                    _ = tx.closed() => break,
                    event = rx.recv() => {
                        let Some(event) = event else { break };
                        if tx.send(renumber(event, offset)).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }
    Ok(merged)
}

fn renumber(event: Event, offset: usize) -> Event {
    match event {
        Event::Token { index, sampled, text } => Event::Token { index: index + offset, sampled, text },
        Event::Finished { index, reason, text, completion_tokens } => {
            Event::Finished { index: index + offset, reason, text, completion_tokens }
        }
        failed => failed,
    }
}

/// One choice gathered whole.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    pub text: String,
    pub tokens: Vec<Sampled>,
    pub finish: Option<FinishReason>,
    pub completion_tokens: usize,
}

/// The error of a request past its time limit.
pub fn timeout_error(timeout_s: u64) -> ApiError {
    ApiError {
        code: Some("timeout"),
        ..ApiError::status(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            format!("The request took longer than this server allows ({timeout_s} s, --request-timeout-s)."),
        )
    }
}

/// The next event before `deadline`: `Err` for a deadline passed, `Ok(None)` for an engine that
/// dropped the request.
pub async fn next_event(
    rx: &mut UnboundedReceiver<Event>,
    deadline: Instant,
    timeout_s: u64,
) -> Result<Option<Event>, ApiError> {
    tokio::time::timeout_at(deadline, rx.recv()).await.map_err(|_| timeout_error(timeout_s))
}

/// Every choice's events until all `choices` finished.
pub async fn collect(
    mut rx: UnboundedReceiver<Event>,
    choices: usize,
    deadline: Instant,
    timeout_s: u64,
) -> Result<Vec<Choice>, ApiError> {
    let mut out = vec![Choice::default(); choices];
    let mut left = choices;
    while left > 0 {
        match next_event(&mut rx, deadline, timeout_s).await? {
            Some(Event::Token { index, sampled, text }) => {
                let c = out.get_mut(index).ok_or_else(|| ApiError::internal("an event of no choice"))?;
                c.text.push_str(&text);
                c.tokens.push(sampled);
            }
            Some(Event::Finished { index, reason, text, completion_tokens }) => {
                let c = out.get_mut(index).ok_or_else(|| ApiError::internal("an event of no choice"))?;
                c.text.push_str(&text);
                c.finish = Some(reason);
                c.completion_tokens = completion_tokens;
                left -= 1;
            }
            Some(Event::Failed(message)) => return Err(ApiError::internal(message)),
            None => return Err(ApiError::internal("the engine ended the request before it finished")),
        }
    }
    Ok(out)
}
