//! Tool calls through the real chat templates:
//!
//! - configs/templates/chatml-tools.jinja given as `model.chat_template` renders the tool rows of
//!   scripts/golden/chat_tools.py as transformers' `apply_chat_template(..., tools=...,
//!   chat_template=FILE)` does (tests/golden/chatml_tools.json from scripts/golden/chatml_tools.py),
//!   whole and as generation prompts, with the same token ids, and masks them for training;
//! - for every family of tests/fixtures/tokenizers that renders tool calls (and chatml-tools), an
//!   assistant tool-call turn rendered by the template, with the prompt before it stripped and
//!   its tokens decoded as generation decodes them, parses back into the calls it was rendered from.

mod common;
use common::Scratch;
use std::path::{Path, PathBuf};

use lora_ft::data::{message_tool_calls, parse_tool_calls, ChatTokenizer, Conversation, Message};
use lora_ft::generate::decode_reply;
use serde_json::Value as Json;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn chatml_tools() -> ChatTokenizer {
    let template = repo("configs/templates/chatml-tools.jinja");
    ChatTokenizer::load(&repo("tests/fixtures/tiny-chat"), Some(&template)).unwrap()
}

#[test]
fn chatml_tools_renders_like_transformers() {
    let golden: Json =
        serde_json::from_str(&std::fs::read_to_string(repo("tests/golden/chatml_tools.json")).unwrap())
            .unwrap();
    let tok = chatml_tools();
    let cases = golden["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for (i, case) in cases.iter().enumerate() {
        let conv = Conversation::parse(case["line"].as_str().unwrap(), 1).unwrap();
        let tools = conv.tools.as_deref();
        let text = tok.template().render_tools(&conv.messages, tools, false).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "case {i}: text");
        let assistant = conv.messages.iter().enumerate().filter(|(_, m)| m.role == "assistant");
        let prompts: Vec<String> = assistant
            .map(|(k, _)| tok.template().render_tools(&conv.messages[..k], tools, true).unwrap())
            .collect();
        let expected: Vec<&str> =
            case["prompts"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
        assert_eq!(prompts, expected, "case {i}: generation prompts");
        let ids = tok.tokenizer().encode(text.as_str(), false).unwrap().get_ids().to_vec();
        let golden_ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        assert_eq!(ids, golden_ids, "case {i}: token ids");
        // trainable: every assistant turn (replies and tool calls) has trained tokens
        let example = tok.encode_with_tools(&conv.messages, tools).unwrap();
        assert_eq!(example.input_ids, golden_ids);
        assert!(example.trained_tokens() > 0, "case {i}");
    }
    // a row without tools renders as the model's own ChatML would (no tool system turn)
    assert_eq!(
        cases[3]["text"].as_str().unwrap(),
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
    );
}

fn folder(family: &str, vocab: &str) -> Scratch {
    common::tokenizer_folder(family, vocab)
}

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "lookup_order", "description": "Look up an order.", "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description": "The order number."}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "track_parcel", "description": "Track a parcel.", "parameters": {"type": "object", "properties": {"tracking_number": {"type": "string", "description": "The tracking number."}, "detailed": {"type": "boolean", "description": "More."}}}}}]"#;

/// The row's calls: two (one where the template takes one per turn), arguments with a nested
/// value, a number and a boolean.
fn conversation(calls: usize) -> Conversation {
    let call = |id: &str, name: &str, arguments: &str| {
        format!(
            r#"{{"type": "function", "id": "{id}", "function": {{"name": "{name}", "arguments": {arguments}}}}}"#
        )
    };
    let all = [
        call("k8L7m6N5b", "lookup_order", r#"{"order_id": "FH-1234567"}"#),
        call(
            "P0o9I8u7Y",
            "track_parcel",
            r#"{"tracking_number": "JD0142", "detailed": true, "n": [1, 2.5]}"#,
        ),
    ];
    let row = format!(
        r#"{{"tools": {}, "messages": [{{"role": "user", "content": "Where is my order FH-1234567?"}}, {{"role": "assistant", "content": null, "tool_calls": [{}]}}]}}"#,
        TOOLS.replace('\n', " "),
        all[..calls].join(", ")
    );
    Conversation::parse(&row, 1).unwrap()
}

/// The reply text of the tool-call turn as a model would generate it: the full render less the
/// generation prompt, tokenized, and decoded as `lora_ft::generate` decodes generated ids.
fn generated_text(tok: &ChatTokenizer, conv: &Conversation) -> String {
    let tools = conv.tools.as_deref();
    let full = tok.template().render_tools(&conv.messages, tools, false).unwrap();
    let prompt = tok.template().render_tools(&conv.messages[..1], tools, true).unwrap();
    let reply =
        full.strip_prefix(prompt.as_str()).unwrap_or_else(|| panic!("{prompt:?} does not start {full:?}"));
    let ids = tok.tokenizer().encode(reply, false).unwrap().get_ids().to_vec();
    decode_reply(tok.tokenizer(), &ids).unwrap()
}

#[test]
fn tool_calls_round_trip_through_each_familys_template() {
    let families = [
        ("llama-3.2", "llama3", 1),
        ("llama-3.3", "llama3", 1),
        ("qwen2.5", "qwen2.5", 2),
        ("qwen3", "qwen3", 2),
        ("mistral-v0.3", "mistral-v0.3", 2),
        ("mistral-nemo", "tekken", 2),
    ];
    let mut seen = Vec::new();
    for (family, vocab, calls) in families {
        let dir = folder(family, vocab);
        let mut tok = ChatTokenizer::from_dir(&dir.0).unwrap();
        tok.template_mut().set_variable("date_string", minijinja::Value::from("05 Mar 2025"));
        let conv = conversation(calls);
        let text = generated_text(&tok, &conv);
        let parsed = parse_tool_calls(&text);
        let reference = message_tool_calls(&conv.messages[1]);
        assert_eq!(reference.len(), calls);
        assert_eq!(parsed, reference, "{family}: {text:?}");
        seen.push(format!("{family}: {}", text.trim().chars().take(14).collect::<String>()));
    }
    let conv = conversation(2);
    let text = generated_text(&chatml_tools(), &conv);
    assert_eq!(parse_tool_calls(&text), message_tool_calls(&conv.messages[1]), "chatml-tools: {text:?}");
    // the markers a family writes its calls with survive decoding (special tokens or not)
    eprintln!("{seen:#?}");
    assert!(seen.iter().any(|s| s.starts_with("mistral-nemo: [TOOL_CALLS]")), "{seen:?}");
    assert!(seen.iter().any(|s| s.starts_with("qwen2.5: <tool_call>")), "{seen:?}");
    assert!(seen.iter().any(|s| s.starts_with("llama-3.2: {\"name\"")), "{seen:?}");
}

/// A reply that names a call the row does not offer still parses (scoring counts it wrong);
/// the reference side comes from the row's `tool_calls`, arguments as JSON values.
#[test]
fn reference_calls_read_string_arguments_as_json() {
    let row = r#"{"tools": [{"type": "function", "function": {"name": "f"}}], "messages": [{"role": "user", "content": "u"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1, \"b\": [true]}"}}]}]}"#;
    let conv = Conversation::parse(&row.replace('\n', " "), 1).unwrap();
    let calls = message_tool_calls(&conv.messages[1]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "f");
    assert_eq!(calls[0].arguments, serde_json::json!({"b": [true], "a": 1}));
    assert_eq!(message_tool_calls(&Message::new("assistant", "text")), []);
}
