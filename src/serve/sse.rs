//! Streamed responses: server-sent events, `data: {chunk}` per piece of text and `data: [DONE]`
//! at the end, as OpenAI sends them (`chat.completion.chunk` with `delta`s, or `text_completion`
//! chunks); with `stream_options.include_usage` a last chunk with `usage` and no choices. With
//! tools, text that may be a call is held back and the calls are sent as `delta.tool_calls` at the
//! end. A client that hangs up drops the body, and with it the engine's receiver.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::chat::usage;
use super::errors::ApiError;
use super::events::next_event;
use super::logprobs;
use super::tool_calls::{call_json, ToolHold};
use crate::data::ChatTokenizer;
use crate::generate::engine::Event;
use crate::generate::sampling::Sampled;

/// Which API's chunks a stream sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `chat.completion.chunk`; `tools`: the replies are read for tool calls.
    Chat {
        tools: bool,
    },
    Completion,
}

/// What a stream's chunks say about their request.
pub struct StreamJob {
    pub api: Api,
    pub id: String,
    pub model: String,
    pub created: u64,
    pub choices: usize,
    pub prompt_tokens: usize,
    pub include_usage: bool,
    pub logprobs: bool,
    pub deadline: Instant,
    pub timeout_s: u64,
}

/// One SSE event.
pub fn frame(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// The stream's state: the engine's events turned into frames.
struct Stream {
    job: StreamJob,
    rx: UnboundedReceiver<Event>,
    tokenizer: Arc<ChatTokenizer>,
    holds: Vec<ToolHold>,
    /// Each choice's tokens not yet sent with a chunk (their log-probs), and its text's length so far.
    pending: Vec<Vec<Sampled>>,
    sent_bytes: Vec<usize>,
    completion_tokens: usize,
    left: usize,
    queue: VecDeque<Bytes>,
    done: bool,
}

/// The streamed response of `rx`'s events.
pub fn respond(job: StreamJob, rx: UnboundedReceiver<Event>, tokenizer: Arc<ChatTokenizer>) -> Response {
    let n = job.choices;
    let mut s = Stream {
        rx,
        tokenizer,
        holds: (0..n).map(|_| ToolHold::default()).collect(),
        pending: vec![Vec::new(); n],
        sent_bytes: vec![0; n],
        completion_tokens: 0,
        left: n,
        queue: VecDeque::new(),
        done: false,
        job,
    };
    if matches!(s.job.api, Api::Chat { .. }) {
        for i in 0..n {
            let chunk = s.chunk(i, json!({"role": "assistant", "content": ""}), None, Value::Null);
            s.queue.push_back(chunk);
        }
    }
    let body = futures_util::stream::unfold(s, |mut s| async move {
        let bytes = s.next().await?;
        Some((Ok::<_, Infallible>(bytes), s))
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(body),
    )
        .into_response()
}

impl Stream {
    /// The next frame; `None` after `[DONE]`.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(bytes) = self.queue.pop_front() {
                return Some(bytes);
            }
            if self.done {
                return None;
            }
            match next_event(&mut self.rx, self.job.deadline, self.job.timeout_s).await {
                Ok(Some(Event::Token { index, sampled, text })) if index < self.holds.len() => {
                    self.token(index, sampled, &text)
                }
                Ok(Some(Event::Finished { index, reason, text, completion_tokens }))
                    if index < self.holds.len() =>
                {
                    self.finished(index, reason.as_str(), &text, completion_tokens)
                }
                Ok(Some(Event::Failed(message))) => self.fail(ApiError::internal(message)),
                Ok(Some(_)) => self.fail(ApiError::internal("an event of no choice")),
                Ok(None) => self.fail(ApiError::internal("the engine ended the request before it finished")),
                Err(e) => self.fail(e),
            }
        }
    }

    fn token(&mut self, index: usize, sampled: Sampled, text: &str) {
        if self.job.logprobs {
            self.pending[index].push(sampled);
        }
        let text = match self.job.api {
            Api::Chat { tools: true } => self.holds[index].push(text),
            _ => text.to_string(),
        };
        if !text.is_empty() {
            self.text(index, &text, None);
        }
    }

    fn finished(&mut self, index: usize, reason: &str, rest: &str, completion_tokens: usize) {
        self.completion_tokens += completion_tokens;
        let mut reason = reason.to_string();
        let mut text = rest.to_string();
        let mut calls = Vec::new();
        if let Api::Chat { tools: true } = self.job.api {
            let hold = std::mem::take(&mut self.holds[index]);
            let mut hold = hold;
            text = hold.push(rest);
            let (held, found) = hold.finish();
            text.push_str(&held);
            calls = found;
        }
        if !text.is_empty() {
            self.text(index, &text, None);
        }
        if !calls.is_empty() {
            reason = "tool_calls".into();
            let calls: Vec<Value> = calls.iter().enumerate().map(|(k, c)| call_json(c, Some(k))).collect();
            let chunk = self.chunk(index, json!({"tool_calls": calls}), None, Value::Null);
            self.queue.push_back(chunk);
        }
        // the last chunk of a choice: its finish reason (and log-probs not sent yet)
        match self.job.api {
            Api::Chat { .. } => {
                let lp = self.take_logprobs(index);
                let chunk = self.chunk(index, json!({}), Some(&reason), lp);
                self.queue.push_back(chunk);
            }
            Api::Completion => self.text(index, "", Some(&reason)),
        }
        self.left -= 1;
        if self.left == 0 {
            tracing::info!(
                "{} ({}, streamed): {} prompt + {} completion tokens",
                self.job.id,
                self.job.model,
                self.job.prompt_tokens,
                self.completion_tokens
            );
            if self.job.include_usage {
                let object = self.object();
                let chunk = json!({
                    "id": self.job.id, "object": object, "created": self.job.created,
                    "model": self.job.model, "choices": [],
                    "usage": usage(self.job.prompt_tokens, self.completion_tokens),
                });
                self.queue.push_back(frame(&chunk.to_string()));
            }
            self.end();
        }
    }

    /// A chunk of `text` for choice `index` (with the log-probs of the tokens since the last one).
    fn text(&mut self, index: usize, text: &str, finish: Option<&str>) {
        let lp = self.take_logprobs(index);
        let chunk = match self.job.api {
            Api::Chat { .. } => self.chunk(index, json!({"content": text}), finish, lp),
            Api::Completion => {
                let choice = json!({"index": index, "text": text, "logprobs": lp, "finish_reason": finish});
                self.wrap(choice)
            }
        };
        self.sent_bytes[index] += text.len();
        self.queue.push_back(chunk);
    }

    fn take_logprobs(&mut self, index: usize) -> Value {
        if !self.job.logprobs {
            return Value::Null;
        }
        let tokens = std::mem::take(&mut self.pending[index]);
        let tokenizer = self.tokenizer.tokenizer();
        match self.job.api {
            Api::Chat { .. } => logprobs::chat(tokenizer, &tokens),
            Api::Completion => logprobs::completion(tokenizer, &tokens, self.sent_bytes[index]),
        }
    }

    fn chunk(&self, index: usize, delta: Value, finish: Option<&str>, logprobs: Value) -> Bytes {
        self.wrap(json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}))
    }

    fn object(&self) -> &'static str {
        match self.job.api {
            Api::Chat { .. } => "chat.completion.chunk",
            Api::Completion => "text_completion",
        }
    }

    fn wrap(&self, choice: Value) -> Bytes {
        let chunk = json!({
            "id": self.job.id, "object": self.object(), "created": self.job.created,
            "model": self.job.model, "choices": [choice],
        });
        frame(&chunk.to_string())
    }

    /// An error in the middle of a stream: sent as an event, then the stream ends.
    fn fail(&mut self, e: ApiError) {
        tracing::warn!("a stream failed: {}", e.message);
        self.queue.push_back(frame(&e.body().to_string()));
        self.end();
    }

    fn end(&mut self) {
        self.queue.push_back(frame("[DONE]"));
        self.done = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::stop::FinishReason;
    use tokio::sync::mpsc::unbounded_channel;

    #[test]
    fn a_frame_is_one_data_line_and_a_blank_line() {
        assert_eq!(&frame("{\"a\":1}")[..], b"data: {\"a\":1}\n\n");
        assert_eq!(&frame("[DONE]")[..], b"data: [DONE]\n\n");
    }

    fn job(api: Api, deadline: Instant) -> StreamJob {
        StreamJob {
            api,
            id: "chatcmpl-1".into(),
            model: "m".into(),
            created: 0,
            choices: 1,
            prompt_tokens: 5,
            include_usage: true,
            logprobs: false,
            deadline,
            timeout_s: 1,
        }
    }

    fn token(text: &str) -> Event {
        let sampled = Sampled { token: 0, raw_logprob: 0.0, sampling_logprob: 0.0, top_logprobs: vec![] };
        Event::Token { index: 0, sampled, text: text.into() }
    }

    /// The stream's `data:` payloads, `[DONE]` as a string.
    async fn payloads(job: StreamJob, events: Vec<Event>) -> Vec<Value> {
        let (tx, rx) = unbounded_channel();
        events.into_iter().for_each(|e| tx.send(e).unwrap());
        let tokenizer = Arc::new(ChatTokenizer::from_dir(&crate::fixtures::smollm2_dir()).unwrap());
        let response = respond(job, rx, tokenizer);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap())
            .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.into())))
            .collect()
    }

    #[tokio::test]
    async fn a_streamed_call_is_held_back_and_sent_as_tool_calls() {
        let events = vec![
            token("Let me check. "),
            token("<tool_call>\n{\"name\": \"lookup_order\", "),
            token("\"arguments\": {\"order_id\": \"A1\"}}\n</tool_call>"),
            Event::Finished {
                index: 0,
                reason: FinishReason::Stop,
                text: String::new(),
                completion_tokens: 3,
            },
        ];
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let p = payloads(job(Api::Chat { tools: true }, far), events).await;
        assert_eq!(p[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(p[1]["choices"][0]["delta"]["content"], "Let me check. ");
        let call = &p[2]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["function"]["name"], "lookup_order");
        assert_eq!(call["function"]["arguments"], "{\"order_id\":\"A1\"}");
        assert_eq!(p[3]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(p[4]["usage"]["completion_tokens"], 3);
        assert_eq!(p[4]["choices"], json!([]));
        assert_eq!(p[5], "[DONE]");
        assert_eq!(p.len(), 6);
    }

    #[tokio::test]
    async fn a_stream_past_its_deadline_ends_with_an_error_event() {
        let (tx, rx) = unbounded_channel::<Event>();
        let tokenizer = Arc::new(ChatTokenizer::from_dir(&crate::fixtures::smollm2_dir()).unwrap());
        let response = respond(job(Api::Completion, Instant::now()), rx, tokenizer);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains("\"code\":\"timeout\""), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        drop(tx);
        // an engine that fails mid-stream: its message as an error event
        let p = payloads(
            job(Api::Completion, Instant::now() + std::time::Duration::from_secs(60)),
            vec![token("a"), Event::Failed("out of memory".into())],
        )
        .await;
        assert_eq!(p[0]["choices"][0]["text"], "a");
        assert_eq!(p[1]["error"]["message"], "out of memory");
        assert_eq!(p[2], "[DONE]");
    }
}
