use std::sync::Arc;

use serde_json::{json, Value};

use super::matcher::{Grammar, Item, Matcher};
use super::schema::Node;
use super::tool_choice::{tool_call_grammar, CallSyntax, ToolChoice};
use crate::data::parse_tool_calls;

/// A grammar of one JSON value of `schema`.
fn value(schema: Value) -> Matcher {
    let node = Arc::new(Node::of(&schema).unwrap());
    Grammar::calls("", &[vec![Item::Value(node)]], "", "", false).matcher()
}

/// Whether `text` is a whole text of the grammar (fed in one piece, then character by character).
fn whole(matcher: &Matcher, text: &str) -> bool {
    let mut m = matcher.clone();
    let fed = m.feed(text) && m.can_end();
    let mut c = matcher.clone();
    let chars = text.chars().all(|ch| c.feed(&ch.to_string())) && c.can_end();
    assert_eq!(fed, chars, "{text:?}");
    fed
}

fn weather() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
    }, "required": ["city", "unit"]})
}

#[test]
fn json_values_of_a_schema_are_accepted_and_others_refused() {
    let m = value(weather());
    for good in [
        r#"{"city": "Oslo", "unit": "celsius"}"#,
        r#"{"city":"Oslo","days":3,"unit":"fahrenheit","hourly":false}"#,
        "{ \"city\" : \"a\\\"b\\u00e9\" ,\n \"unit\": \"celsius\", \"tags\": [\"x\", \"y\"]}",
        r#"{"city": "", "unit": "celsius", "where": {"lat": -12.5e+3}}"#,
        r#"{"city": "Oslo", "days": 0, "unit": "celsius", "tags": []}"#,
        r#"{"unit": "celsius", "city": "Oslo"}"#, // any order
    ] {
        assert!(whole(&m, good), "{good}");
    }
    for bad in [
        r#"{"city": "Oslo", "unit": "celsius", "city": "Bergen"}"#, // a property twice
        r#"{"city": "Oslo"}"#,                                      // a required one missing
        r#"{"city": "Oslo", "unit": "kelvin"}"#,                    // not in the enum
        r#"{"city": "Oslo", "days": 1.5, "unit": "celsius"}"#,      // not an integer
        r#"{"city": "Oslo", "days": 01, "unit": "celsius"}"#,       // a leading zero
        r#"{"city": "Amsterdam", "unit": "celsius"}"#,              // past maxLength
        r#"{"city": "Oslo", "unit": "celsius", "x": 1}"#,           // a property not in the schema
        r#"{"city": "Oslo", "unit": "celsius", "tags": [1]}"#,      // an item of the wrong type
        r#"{"city": "Oslo", "unit": "celsius", "tags": ["a", "b", "c"]}"#, // past maxItems
        r#"{"city": "Oslo", "unit": "celsius", "where": {}}"#,      // nested required
        r#"{"city": "Oslo", "unit": "celsius",}"#,
        "{\"city\": \"a\nb\", \"unit\": \"celsius\"}", // a raw newline in a string
        "{\"city\":      \"Oslo\", \"unit\": \"celsius\"}", // more whitespace than allowed
    ] {
        assert!(!whole(&value(weather()), bad), "{bad}");
    }
    // a valid start is allowed but is not yet a whole value
    let mut m = value(weather());
    assert!(m.allows("{\"ci") && m.feed("{\"city\": \"Os"));
    assert!(!m.can_end() && !m.allows("\" }") && m.allows("lo\", \"u"));
}

#[test]
fn a_schema_without_known_keywords_takes_any_json_value() {
    let m = value(json!({"description": "anything"}));
    for good in ["1", "-0.5E-2", "\"s\"", "null", "[1, {\"a\": [true, false]}, \"x\"]", "{\"k\": {}}"] {
        assert!(whole(&m, good), "{good}");
    }
    for bad in ["nul", "[1,]", "{\"k\"}", "tru e", "01", "\"open"] {
        assert!(!whole(&m, bad), "{bad}");
    }
    let choice = value(json!({"anyOf": [{"type": "integer"}, {"type": "string"}]}));
    assert!(whole(&choice, "12") && whole(&choice, "\"a\"") && !whole(&choice, "1.5"));
    let m = value(json!({"type": "number"}));
    assert!(!m.clone().feed("12345678901234567"), "more digits than MAX_DIGITS");
    assert!(Node::of(&json!({"$ref": "#/x"})).is_err());
    assert!(Node::of(&json!({"type": "object", "properties": {}, "required": ["a"]})).is_err());
}

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": weather()}}),
        json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}),
    ]
}

#[test]
fn required_takes_calls_to_the_tools_in_each_syntax() {
    let call = r#"{"name": "get_time", "arguments": {}}"#;
    let weather_call = r#"{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}"#;
    let cases = [
        (CallSyntax::Hermes, format!("<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{weather_call}\n</tool_call>")),
        (CallSyntax::Mistral, format!("[TOOL_CALLS][{call}, {weather_call}]")),
        (CallSyntax::Json { arguments: "arguments" }, format!("{call}; {weather_call}")),
        (
            CallSyntax::MistralArgs,
            "[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"x\", \"unit\": \"celsius\"}".into(),
        ),
    ];
    for (syntax, text) in cases {
        let grammar = tool_call_grammar(&tools(), &ToolChoice::Required { parallel: true }, syntax).unwrap();
        let mut m = grammar.matcher();
        assert!(!m.can_end(), "no call yet");
        assert!(m.feed(&text) && m.can_end(), "{syntax:?}: {text}");
        let names: Vec<String> = parse_tool_calls(&text).into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["get_time", "get_weather"], "{syntax:?}");
        // one call only without parallel calls: complete, and nothing may follow
        let one = tool_call_grammar(&tools(), &ToolChoice::Required { parallel: false }, syntax).unwrap();
        let mut m = one.matcher();
        assert!(!m.feed(&text), "{syntax:?}: two calls");
        let first = parse_tool_calls(&text).remove(0);
        assert_eq!(first.name, "get_time");
        assert!(!grammar.matcher().feed("<tool_call>\n{\"name\": \"other\""), "{syntax:?}: not a tool");
    }
    let mut m = tool_call_grammar(&tools(), &ToolChoice::Required { parallel: false }, CallSyntax::Hermes)
        .unwrap()
        .matcher();
    assert!(m.feed(&format!("<tool_call>\n{call}\n</tool_call")) && !m.can_end());
    assert!(m.feed(">") && m.can_end() && m.must_end());
    let mut m = tool_call_grammar(&tools(), &ToolChoice::Required { parallel: true }, CallSyntax::Hermes)
        .unwrap()
        .matcher();
    assert!(
        m.feed(&format!("<tool_call>\n{call}\n</tool_call>")) && m.can_end() && !m.must_end(),
        "another may follow"
    );
}

#[test]
fn a_named_function_is_the_only_call() {
    let named = ToolChoice::Function("get_weather".into());
    let grammar = tool_call_grammar(&tools(), &named, CallSyntax::Json { arguments: "parameters" }).unwrap();
    assert!(!grammar.matcher().feed("{\"name\": \"get_t"));
    let mut m = grammar.matcher();
    assert!(m.feed("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a\", \"unit\": \"celsius\"}}"));
    assert!(m.must_end());
    let unknown =
        tool_call_grammar(&tools(), &ToolChoice::Function("nope".into()), CallSyntax::Hermes).unwrap_err();
    assert_eq!(unknown.param, "tool_choice");
    assert!(unknown.message.contains("\"nope\""), "{}", unknown.message);
    let none =
        tool_call_grammar(&[], &ToolChoice::Required { parallel: true }, CallSyntax::Hermes).unwrap_err();
    assert_eq!(none.param, "tools");
    let bad = [json!({"type": "function", "function": {"name": "f", "parameters": {"type": "tuple"}}})];
    assert_eq!(tool_call_grammar(&bad, &named, CallSyntax::Hermes).unwrap_err().param, "tools");
}

#[test]
fn the_syntax_is_the_templates() {
    assert_eq!(CallSyntax::of_template("{{ '<tool_call>\\n' }}"), CallSyntax::Hermes);
    assert_eq!(CallSyntax::of_template("[TOOL_CALLS][{{ calls }}]"), CallSyntax::Mistral);
    assert_eq!(CallSyntax::of_template("[TOOL_CALLS]{{ name }}[ARGS]"), CallSyntax::MistralArgs);
    assert_eq!(
        CallSyntax::of_template("<|python_tag|>{\"parameters\": x}"),
        CallSyntax::Json { arguments: "parameters" }
    );
    assert_eq!(CallSyntax::of_template("plain"), CallSyntax::Json { arguments: "arguments" });
}
