use serde_json::json;

use super::row::detect;
use super::*;
use crate::data::Message;
use serde_json::Value;

fn parse(format: DataFormat, row: Value) -> Result<Vec<Message>, String> {
    RowParser { format }.parse(&row, &row.to_string(), 1).map(|c| c.messages)
}

fn m(role: &str, content: &str) -> Message {
    Message::new(role, content)
}

#[test]
fn sharegpt_maps_from_to_roles() {
    let row = json!({"id": "x", "conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello"}, {"from": "user", "value": "Bye"},
        {"from": "assistant", "value": "Bye!"}]});
    let expected = [
        m("system", "Be brief."),
        m("user", "Hi"),
        m("assistant", "Hello"),
        m("user", "Bye"),
        m("assistant", "Bye!"),
    ];
    assert_eq!(parse(DataFormat::ShareGpt, row).unwrap(), expected);
    let with_system_key = json!({"system": "S", "conversations": [
        {"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]});
    assert_eq!(
        parse(DataFormat::ShareGpt, with_system_key).unwrap(),
        [m("system", "S"), m("user", "Q"), m("assistant", "A")]
    );
}

#[test]
fn sharegpt_errors_name_the_turn_and_field() {
    let err = |row: Value| parse(DataFormat::ShareGpt, row).unwrap_err();
    assert_eq!(err(json!({"messages": []})), r#"expected a "conversations" array"#);
    assert_eq!(err(json!({"conversations": "hi"})), r#""conversations" must be an array, not a string"#);
    assert_eq!(err(json!({"conversations": []})), r#""conversations" is empty"#);
    assert_eq!(
        err(json!({"conversations": [{"from": "human", "value": "a"}, {"from": "bot", "value": "b"}]})),
        r#"conversations[1]: unknown "from" "bot" (expected system, human, user, gpt or assistant)"#
    );
    assert_eq!(
        err(json!({"conversations": [{"from": "observation", "value": "{}"}]})),
        r#"conversations[0]: "from" "observation" is a tool turn, which lora-ft does not read from ShareGPT rows (write tool-calling rows as messages, with tool_calls and tool turns)"#
    );
    assert_eq!(err(json!({"conversations": [{"value": "a"}]})), r#"conversations[0]: missing "from""#);
    assert_eq!(
        err(json!({"conversations": [{"from": "gpt", "value": 3}]})),
        r#"conversations[0]: "value" must be a string, not a number"#
    );
    assert_eq!(
        err(json!({"conversations": [{"from": "gpt", "value": "a", "weight": 0}]})),
        r#"conversations[0]: unsupported key "weight" (a ShareGPT turn has only "from" and "value")"#
    );
    assert_eq!(
        err(json!({"conversations": [{"from": "human", "value": "a"}]})),
        "conversation has no assistant turn to train on"
    );
    assert_eq!(
        err(json!({"system": "S", "conversations": [{"from": "system", "value": "T"}]})),
        r#"conversations[0]: a system turn, and also a "system" key: give one of them"#
    );
    assert_eq!(err(json!([1])), "expected a ShareGPT row: a JSON object");
}

#[test]
fn alpaca_joins_instruction_and_input_with_a_blank_line() {
    let row = json!({"instruction": "Translate.", "input": "chat", "output": "cat", "system": "S"});
    assert_eq!(
        parse(DataFormat::Alpaca, row).unwrap(),
        [m("system", "S"), m("user", "Translate.\n\nchat"), m("assistant", "cat")]
    );
    for input in [json!(""), Value::Null] {
        let row = json!({"instruction": "Say hi.", "input": input, "output": "hi", "system": ""});
        assert_eq!(parse(DataFormat::Alpaca, row).unwrap(), [m("user", "Say hi."), m("assistant", "hi")]);
    }
    let no_input = json!({"instruction": "Say hi.", "output": "hi", "history": []});
    assert_eq!(parse(DataFormat::Alpaca, no_input).unwrap(), [m("user", "Say hi."), m("assistant", "hi")]);
    let only_input = json!({"instruction": "", "input": "2+2?", "output": "4"});
    assert_eq!(parse(DataFormat::Alpaca, only_input).unwrap(), [m("user", "2+2?"), m("assistant", "4")]);
}

#[test]
fn alpaca_errors_name_the_field() {
    let err = |row: Value| parse(DataFormat::Alpaca, row).unwrap_err();
    assert_eq!(err(json!({"input": "x", "output": "y"})), r#"missing "instruction""#);
    assert_eq!(err(json!({"instruction": "x"})), r#"missing "output""#);
    assert_eq!(
        err(json!({"instruction": "x", "output": ["y"]})),
        r#""output" must be a string, not an array"#
    );
    assert_eq!(
        err(json!({"instruction": "x", "input": 1, "output": "y"})),
        r#""input" must be a string, not a number"#
    );
    assert_eq!(
        err(json!({"instruction": "", "output": "y"})),
        r#""instruction" is empty and there is no "input": the user turn would be empty"#
    );
    assert!(
        err(json!({"instruction": "x", "output": "y", "history": [["a", "b"]]})).starts_with(r#""history""#)
    );
}

#[test]
fn prompt_completion_strings_and_message_lists() {
    let row = json!({"prompt": "The sky is", "completion": " blue."});
    assert_eq!(
        parse(DataFormat::PromptCompletion, row).unwrap(),
        [m("user", "The sky is"), m("assistant", " blue.")]
    );
    let row = json!({
        "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
        "completion": [{"role": "assistant", "content": "A"}]});
    assert_eq!(
        parse(DataFormat::PromptCompletion, row).unwrap(),
        [m("system", "S"), m("user", "Q"), m("assistant", "A")]
    );
}

#[test]
fn prompt_completion_lists_carry_tools_and_tool_calls() {
    let call = json!({"type": "function", "function": {"name": "track", "arguments": {"order": "1234"}}});
    let row = json!({
        "prompt": [{"role": "user", "content": "Where is order 1234?"}],
        "completion": [{"role": "assistant", "content": "", "tool_calls": [call]},
                       {"role": "tool", "content": "in transit", "name": "track"},
                       {"role": "assistant", "content": "It is in transit."}],
        "tools": [{"type": "function", "function": {"name": "track", "parameters": {"type": "object"}}}]});
    let conv = RowParser { format: DataFormat::PromptCompletion }.parse(&row, &row.to_string(), 4).unwrap();
    assert_eq!(conv.line, 4);
    assert_eq!(conv.tools.as_ref().map(Vec::len), Some(1));
    let roles: Vec<&str> = conv.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(conv.messages[1].tool_calls.as_ref().map(Vec::len), Some(1));
    assert_eq!(conv.messages[2].name.as_deref(), Some("track"));
}

#[test]
fn prompt_completion_errors_name_the_field() {
    let err = |row: Value| parse(DataFormat::PromptCompletion, row).unwrap_err();
    assert_eq!(err(json!({"completion": "x"})), r#"missing "prompt""#);
    assert_eq!(err(json!({"prompt": "x", "completion": null})), r#"missing "completion""#);
    assert_eq!(
        err(json!({"prompt": "x", "completion": [{"role": "assistant", "content": "y"}]})),
        r#""prompt" is a string and "completion" an array: both must be strings, or both lists of messages"#
    );
    assert_eq!(
        err(json!({"prompt": [{"role": "user", "content": "x"}], "completion": []})),
        r#""completion" is empty"#
    );
    assert_eq!(
        err(
            json!({"prompt": [{"role": "user", "content": "x"}], "completion": [{"role": "user", "content": "y"}]})
        ),
        r#"completion[0]: a "user" turn in the completion (the completion is what the model says)"#
    );
    assert!(err(json!({
        "prompt": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
        "completion": [{"role": "assistant", "content": "z"}]}))
    .starts_with(r#"prompt[1]: a "assistant" turn in the prompt (lora-ft trains every assistant turn"#));
    assert_eq!(
        err(
            json!({"prompt": [{"role": "bot", "content": "x"}], "completion": [{"role": "assistant", "content": "y"}]})
        ),
        r#"prompt[0]: unknown role "bot" (expected system, user, assistant or tool)"#
    );
}

#[test]
fn auto_settles_on_the_first_rows_format() {
    let mut rows = RowParser { format: DataFormat::Auto };
    let alpaca = json!({"instruction": "I", "output": "O"});
    assert_eq!(
        rows.parse(&alpaca, &alpaca.to_string(), 1).unwrap().messages,
        [m("user", "I"), m("assistant", "O")]
    );
    assert_eq!(rows.format, DataFormat::Alpaca);
    // Later rows are read as the first one: a messages row is now a malformed alpaca row.
    let messages = json!({"messages": [{"role": "assistant", "content": "x"}]});
    assert_eq!(rows.parse(&messages, &messages.to_string(), 2).unwrap_err(), r#"missing "instruction""#);
    for (row, format) in [
        (json!({"messages": [], "prompt": null}), DataFormat::Messages),
        (json!({"conversations": []}), DataFormat::ShareGpt),
        (json!({"prompt": "p", "completion": "c", "instruction": "i"}), DataFormat::PromptCompletion),
    ] {
        assert_eq!(detect(&row), Ok(format), "{row}");
    }
    assert_eq!(
        detect(&json!({"messages": [], "conversations": []})).unwrap_err(),
        r#"format = "auto" cannot tell the format: the first row has "messages" and also "conversations"; set data.format"#
    );
    assert!(detect(&json!({"text": "x"})).unwrap_err().starts_with(r#"format = "auto" found none of"#));
}

#[test]
fn parquet_is_chosen_by_extension() {
    assert!(is_parquet(Path::new("d/train.parquet")));
    assert!(is_parquet(Path::new("TRAIN.PARQUET")));
    assert!(!is_parquet(Path::new("train.jsonl")));
    assert!(!is_parquet(Path::new("train.parquet.jsonl")));
    assert_eq!(row_name(Path::new("a.parquet"), 3), "a.parquet:row 2");
    assert_eq!(row_name(Path::new("a.jsonl"), 3), "a.jsonl:3");
}
