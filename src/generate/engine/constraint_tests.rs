//! Constrained replies from the tiny chat model (random weights: unconstrained it writes no call):
//! greedy and sampled, each reply is calls of the request's tools in the Hermes syntax, their
//! arguments of the tool's schema, checked here by hand.

use std::sync::Arc;

use serde_json::{json, Value};

use super::tests::{collect, request, tiny_model, tokenizer};
use super::*;
use crate::data::parse_tool_calls;
use crate::generate::constrained::tool_choice::{tool_call_grammar, CallSyntax, ToolChoice};
use crate::generate::sampling::SamplingParams;
use crate::generate::stop::FinishReason;

fn tools() -> Vec<Value> {
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["rain", "wind"]}, "maxItems": 2},
    }, "required": ["city", "unit"]});
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": weather}}),
        json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
            "zone": {"enum": ["utc", "local"]}}, "required": ["zone"]}}}),
    ]
}

/// Whether `arguments` are of `get_weather`'s or `get_time`'s schema (checked key by key).
fn valid_arguments(name: &str, arguments: &Value) -> bool {
    let Some(object) = arguments.as_object() else { return false };
    match name {
        "get_time" => object.len() == 1 && ["utc", "local"].contains(&object["zone"].as_str().unwrap_or("")),
        "get_weather" => {
            let known = ["city", "days", "unit", "hourly", "tags"];
            object.keys().all(|k| known.contains(&k.as_str()))
                && object.get("city").and_then(Value::as_str).is_some_and(|c| c.chars().count() <= 8)
                && ["celsius", "fahrenheit"]
                    .contains(&object.get("unit").and_then(Value::as_str).unwrap_or(""))
                && object.get("days").is_none_or(|d| d.is_i64() || d.is_u64())
                && object.get("hourly").is_none_or(Value::is_boolean)
                && object.get("tags").is_none_or(|t| {
                    t.as_array().is_some_and(|t| t.len() <= 2 && t.iter().all(|x| x == "rain" || x == "wind"))
                })
        }
        _ => false,
    }
}

fn engine() -> Engine {
    Engine::start(
        tiny_model(None),
        tokenizer(),
        vec![2],
        EngineConfig { max_batch: 8, max_seq_len: 1024, enforce_eager: false, max_prefill_tokens: None },
    )
    .unwrap()
}

fn prompt() -> Vec<u32> {
    tokenizer()
        .encode("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n", false)
        .unwrap()
        .get_ids()
        .to_vec()
}

#[test]
fn constrained_replies_are_calls_of_the_tools_with_arguments_of_their_schemas() {
    let engine = engine();
    let sampled = SamplingParams { temperature: 1.0, ..SamplingParams::greedy() };
    let plain = collect(engine.submit(request(prompt(), sampled.clone(), vec![0, 1], 200)).unwrap(), 2);
    assert!(plain.iter().all(|r| parse_tool_calls(&r.text).is_empty()), "unconstrained, no call: {plain:?}");

    for parallel in [false, true] {
        let choice = ToolChoice::Required { parallel };
        let grammar = Arc::new(tool_call_grammar(&tools(), &choice, CallSyntax::Hermes).unwrap());
        for params in [SamplingParams::greedy(), sampled.clone()] {
            let seeds: Vec<u64> = (0..6).collect();
            let constrained =
                Request { constraint: Some(grammar.clone()), ..request(prompt(), params, seeds, 400) };
            let replies = collect(engine.submit(constrained).unwrap(), 6);
            for reply in replies {
                let calls = parse_tool_calls(&reply.text);
                // one call ends the reply; after each of several the random model may go on
                // making calls until its budget ends
                let ends = if parallel {
                    &[FinishReason::Stop, FinishReason::Length][..]
                } else {
                    &[FinishReason::Stop]
                };
                assert!(
                    reply.finish.is_some_and(|f| ends.contains(&f)),
                    "{:?}: {}",
                    reply.finish,
                    reply.text
                );
                assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{}", reply.text);
                for call in calls {
                    assert!(valid_arguments(&call.name, &call.arguments), "{call} in {:?}", reply.text);
                }
                assert!(reply.text.starts_with("<tool_call>\n{\"name\": \""), "{}", reply.text);
                if reply.finish == Some(FinishReason::Stop) {
                    assert!(reply.text.ends_with("}\n</tool_call>"), "{}", reply.text);
                }
            }
        }
    }
}

#[test]
fn a_named_function_is_the_one_called() {
    let engine = engine();
    let choice = ToolChoice::Function("get_time".into());
    let grammar = Arc::new(tool_call_grammar(&tools(), &choice, CallSyntax::Hermes).unwrap());
    let sampled = SamplingParams { temperature: 1.0, ..SamplingParams::greedy() };
    let constrained = Request { constraint: Some(grammar), ..request(prompt(), sampled, vec![3, 4, 5], 200) };
    for reply in collect(engine.submit(constrained).unwrap(), 3) {
        let calls = parse_tool_calls(&reply.text);
        assert_eq!(calls.len(), 1, "{}", reply.text);
        assert_eq!(calls[0].name, "get_time");
        assert!(valid_arguments("get_time", &calls[0].arguments), "{}", reply.text);
        // the grammar's end ends the reply: no end-of-turn token is sampled after it
        assert_eq!(reply.finish, Some(FinishReason::Stop));
        assert!(!reply.tokens.contains(&2));
    }
}

/// The mask (the tokens grouped by their first character, plain tokens inside a string judged by
/// their length) allows exactly what walking every token's whole text allows, and the end-of-turn
/// id only where the grammar may end, at every character of a call's text, from the first to past
/// the last; each allowed token keeps its own logit.
#[test]
fn the_mask_allows_what_a_walk_of_every_token_allows() {
    use super::constraint::TokenConstraint;
    let tokenizer = tokenizer();
    let reply_text = text::ReplyText::new(&tokenizer);
    let texts = reply_text.token_texts();
    let choice = ToolChoice::Required { parallel: false };
    let grammar = tool_call_grammar(&tools(), &choice, CallSyntax::Hermes).unwrap();
    let mut matcher = grammar.matcher();
    // a free string of at most 8 characters ("city") among fixed texts and enums
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris TX\", \"unit\": \"celsius\"}}\n</tool_call>";
    let stop = [2u32];
    let vocab = tokenizer.get_vocab_size(true);
    let mut buf = [0u8; 4];
    for (i, ch) in call.chars().map(Some).chain([None]).enumerate() {
        let walked: Vec<bool> = (0..vocab)
            .map(|id| match stop.contains(&(id as u32)) {
                true => matcher.can_end(),
                false => texts.get(id).is_some_and(|t| matcher.allows(t)),
            })
            .collect();
        // logits that differ by token, so a logit put back at the wrong id shows
        let logits: Vec<f32> = (0..vocab).map(|id| id as f32).collect();
        let masked = TokenConstraint::new(matcher.clone(), texts.clone(), &stop).masked(&logits);
        assert_eq!(masked.is_ok(), walked.contains(&true), "after {i} characters");
        if let Ok(masked) = masked {
            let allowed: Vec<bool> = masked.iter().map(|&l| l > f32::NEG_INFINITY).collect();
            assert_eq!(allowed, walked, "after {i} characters");
            let kept = masked.iter().enumerate().filter(|(_, l)| l.is_finite());
            assert!(kept.into_iter().all(|(id, &l)| l == id as f32), "after {i} characters: a logit moved");
        }
        if let Some(ch) = ch {
            assert!(matcher.feed(ch.encode_utf8(&mut buf)), "the call's character {i}, {ch:?}");
        }
    }
    assert!(matcher.can_end(), "the call is complete");
}
