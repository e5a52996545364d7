//! Tool calls in a reply as OpenAI's API returns them: parsed with the data module's parser
//! (Hermes `<tool_call>`, Llama JSON, Mistral `[TOOL_CALLS]`) into `tool_calls` entries with an
//! `id`, `type: "function"` and the arguments as a JSON string; the text before the calls is the
//! message's `content`. While streaming, `ToolHold` sends plain text as it comes and holds back
//! what may be a call, so the calls go out whole at the end (as `delta.tool_calls`).

use serde_json::{json, Value};

use crate::data::{parse_tool_calls, ToolCall, TOOL_CALL_TOKENS};

/// A fresh call id: `call_` and 24 random letters and digits.
pub fn call_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let tail: String = (0..24).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect();
    format!("call_{tail}")
}

/// A call as a message's `tool_calls` holds it (`index` too in a streamed delta).
pub fn call_json(call: &ToolCall, index: Option<usize>) -> Value {
    let arguments = serde_json::to_string(&call.arguments).unwrap_or_else(|_| "{}".into());
    let mut out = json!({
        "id": call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    });
    if let Some(i) = index {
        out["index"] = i.into();
    }
    out
}

/// Where the first tool-call marker starts in `text`, if it has one.
fn first_marker(text: &str) -> Option<usize> {
    TOOL_CALL_TOKENS.iter().filter_map(|m| text.find(m)).min()
}

/// A reply split into its content (the text before its calls, trimmed; `None` when that is
/// empty) and its calls; a reply without a well-formed call is all content.
pub fn split_reply(text: &str) -> (Option<String>, Vec<ToolCall>) {
    let calls = parse_tool_calls(text);
    if calls.is_empty() {
        return (Some(text.to_string()), calls);
    }
    // a Llama call is the whole reply (a JSON object): no content
    let before = first_marker(text).map_or("", |at| &text[..at]).trim();
    ((!before.is_empty()).then(|| before.to_string()), calls)
}

/// The streaming side of `split_reply`: text is released as it comes unless it may be a call (a
/// reply that starts with `{`, or anything from a marker on, or the end of the text that may
/// begin one); `finish` gives what was held and the calls it holds.
#[derive(Debug, Default)]
pub struct ToolHold {
    text: String,
    released: usize,
}

impl ToolHold {
    /// Adds a piece of the reply; returns the text that is surely not part of a call.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        let start = self.text.trim_start();
        if start.is_empty() || start.starts_with('{') {
            return String::new();
        }
        let safe = match first_marker(&self.text) {
            Some(at) => at,
            None => self.text.len() - partial_marker_len(&self.text),
        };
        let safe = safe.max(self.released);
        let out = self.text[self.released..safe].to_string();
        self.released = safe;
        out
    }

    /// The reply's end: the held text that is not a call (all of it where no call parses) and
    /// the calls.
    pub fn finish(self) -> (String, Vec<ToolCall>) {
        let held = &self.text[self.released..];
        let calls = parse_tool_calls(&self.text);
        if calls.is_empty() {
            return (held.to_string(), calls);
        }
        (String::new(), calls)
    }
}

/// The longest end of `text` that is a proper start of a tool-call marker.
fn partial_marker_len(text: &str) -> usize {
    let longest = TOOL_CALL_TOKENS.iter().map(|m| m.len()).max().unwrap_or(0);
    (text.len().saturating_sub(longest)..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .find(|&i| TOOL_CALL_TOKENS.iter().any(|m| m.starts_with(&text[i..])))
        .map_or(0, |i| text.len() - i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str =
        "<tool_call>\n{\"name\": \"lookup_order\", \"arguments\": {\"order_id\": \"A1\"}}\n</tool_call>";

    #[test]
    fn a_reply_splits_into_content_and_calls() {
        let (content, calls) = split_reply(&format!("Let me check. {CALL}"));
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 1);
        let j = call_json(&calls[0], None);
        assert_eq!(j["type"], "function");
        assert_eq!(j["function"]["name"], "lookup_order");
        assert_eq!(j["function"]["arguments"], "{\"order_id\":\"A1\"}");
        assert!(j["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(j["id"].as_str().unwrap().len(), 29);
        let (content, calls) = split_reply(CALL);
        assert_eq!((content, calls.len()), (None, 1));
        let (content, calls) = split_reply("{\"name\": \"f\", \"parameters\": {}}");
        assert_eq!((content, calls.len()), (None, 1), "a Llama call");
        assert_eq!(
            split_reply("Hello <tool_call> broken"),
            (Some("Hello <tool_call> broken".into()), vec![])
        );
    }

    /// Streams `pieces` through a hold: what it released, what it gave at the end, the calls.
    fn stream(pieces: &[&str]) -> (String, String, usize) {
        let mut hold = ToolHold::default();
        let released: String = pieces.iter().map(|p| hold.push(p)).collect();
        let (rest, calls) = hold.finish();
        (released, rest, calls.len())
    }

    #[test]
    fn plain_text_streams_and_calls_are_held() {
        assert_eq!(stream(&["Hel", "lo ", "there"]), ("Hello there".into(), String::new(), 0));
        // a marker split over pieces is held from its first byte
        let pieces = ["Sure. <tool", "_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"];
        assert_eq!(stream(&pieces), ("Sure. ".into(), String::new(), 1));
        // text that looked like a marker's start is released once it is not
        let (released, rest, n) = stream(&["a <tool", "box> b"]);
        assert_eq!((released + &rest, n), ("a <toolbox> b".into(), 0));
        // a reply that starts with `{` may be a Llama call: held whole, released if it is not
        assert_eq!(stream(&[" {\"a\":", " 1}"]), (String::new(), " {\"a\": 1}".into(), 0));
        assert_eq!(stream(&["{\"name\": \"f\",", " \"parameters\": {}}"]), (String::new(), String::new(), 1));
        // a marker without a well-formed call: its text comes at the end
        assert_eq!(stream(&["x <tool_call> y"]), ("x ".into(), "<tool_call> y".into(), 0));
    }
}
