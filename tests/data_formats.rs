//! The dataset formats (`data.format`) in JSON Lines and Parquet: each fixture of
//! tests/fixtures/formats/ (written by scripts/golden/data_formats.py) reads as exactly the
//! conversations of its hand-written `messages` twin, tokenizes and masks to the same ids and
//! labels through tests/fixtures/tiny-chat's ChatML tokenizer, and every malformed row is an error
//! naming `file:line` (Parquet: `file:row_group:row`) and the field.

use std::path::{Path, PathBuf};

use lora_ft::config::{Config, DataFormat, TruncationSide};
use lora_ft::data::{data_check, read_conversations, read_messages_jsonl, ChatTokenizer, TokenizedDataset};
use lora_ft::eval::{tokenize_file, EvalSettings};

const FORMATS: [(&str, DataFormat); 5] = [
    ("messages", DataFormat::Messages),
    ("sharegpt", DataFormat::ShareGpt),
    ("alpaca", DataFormat::Alpaca),
    ("prompt_completion", DataFormat::PromptCompletion),
    ("prompt_completion_chat", DataFormat::PromptCompletion),
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats").join(name)
}

fn tiny_chat() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-chat")
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("lora-ft-formats-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn jsonl_and_parquet_rows_read_as_their_messages_twin() {
    for (name, format) in FORMATS {
        let expected = read_messages_jsonl(&fixture(&format!("{name}.expected.jsonl"))).unwrap();
        assert_eq!(expected.iter().map(|c| c.line).collect::<Vec<_>>(), [1, 2, 3], "{name}");
        for ext in ["jsonl", "parquet"] {
            let file = fixture(&format!("{name}.{ext}"));
            assert_eq!(read_conversations(&file, format).unwrap(), expected, "{name}.{ext}");
            assert_eq!(read_conversations(&file, DataFormat::Auto).unwrap(), expected, "{name}.{ext} (auto)");
        }
    }
    // The conventions, spelled out (the twins above are written by hand, not derived).
    let alpaca = read_conversations(&fixture("alpaca.parquet"), DataFormat::Alpaca).unwrap();
    let text = |c: &lora_ft::data::Conversation| -> Vec<(String, String)> {
        c.messages.iter().map(|m| (m.role.clone(), m.content.clone())).collect()
    };
    let pair = |r: &str, c: &str| (r.to_string(), c.to_string());
    assert_eq!(
        text(&alpaca[1]),
        [
            pair("user", "Translate to German.\n\nWhere is my parcel?"),
            pair("assistant", "Wo ist mein Paket?")
        ]
    );
    // The third row sits in the second row group, with a null "input" and a "system".
    assert_eq!(
        text(&alpaca[2]),
        [
            pair("system", "You are polite."),
            pair("user", "Greet the customer."),
            pair("assistant", "Hello! How can I help?")
        ]
    );
    let sharegpt = read_conversations(&fixture("sharegpt.parquet"), DataFormat::ShareGpt).unwrap();
    assert_eq!(
        text(&sharegpt[2]),
        [pair("system", "Answer in French."), pair("user", "Hello"), pair("assistant", "Bonjour !")]
    );
}

#[test]
fn chat_masked_tokens_of_every_format_equal_the_messages_form() {
    let tok = ChatTokenizer::from_dir(&tiny_chat()).unwrap();
    let side = TruncationSide::Right;
    for (name, format) in FORMATS {
        let expected =
            TokenizedDataset::from_jsonl(&fixture(&format!("{name}.expected.jsonl")), &tok, 1024, side)
                .unwrap();
        for ext in ["jsonl", "parquet"] {
            let set =
                TokenizedDataset::from_file(&fixture(&format!("{name}.{ext}")), format, &tok, 1024, side)
                    .unwrap();
            assert_eq!(set.examples, expected.examples, "{name}.{ext}");
            assert_eq!(set.lines, [1, 2, 3], "{name}.{ext}");
        }
    }
    // What is trained: the assistant replies and their end-of-turn token, nothing else.
    let set =
        TokenizedDataset::from_file(&fixture("sharegpt.parquet"), DataFormat::ShareGpt, &tok, 1024, side)
            .unwrap();
    let example = &set.examples[1];
    let trained: Vec<u32> = example
        .input_ids
        .iter()
        .zip(&example.labels)
        .filter(|(_, &l)| l != lora_ft::data::IGNORE_INDEX)
        .map(|(&id, _)| id)
        .collect();
    assert_eq!(
        tok.tokenizer().decode(&trained, false).unwrap(),
        "Yes: within 30 days.<|im_end|>Those too — café vouchers excepted. 🎉<|im_end|>"
    );
}

#[test]
fn malformed_parquet_rows_name_file_row_group_row_and_field() {
    let cases = [
        ("sharegpt_unknown_from", DataFormat::ShareGpt, "1:0", r#"conversations[1]: unknown "from" "bot""#),
        ("sharegpt_empty", DataFormat::ShareGpt, "0:1", r#""conversations" is empty"#),
        ("sharegpt_weight", DataFormat::ShareGpt, "0:1", r#"conversations[0]: unsupported key "weight""#),
        ("alpaca_missing_output", DataFormat::Alpaca, "0:1", r#"missing "output""#),
        ("messages_unknown_role", DataFormat::Messages, "0:0", r#"messages[1]: unknown role "bot""#),
        ("messages_content_type", DataFormat::Messages, "0:0", r#"messages[0]: "content" must be a string"#),
        (
            "prompt_completion_mixed",
            DataFormat::PromptCompletion,
            "0:0",
            r#""prompt" is a string and "completion" an array: both must be strings"#,
        ),
    ];
    for (name, format, at, message) in cases {
        let file = fixture(&format!("bad/{name}.parquet"));
        let err = format!("{:#}", read_conversations(&file, format).unwrap_err());
        let expected = format!("{}:{at}: {message}", file.display());
        assert!(err.starts_with(&expected), "{name}: {err:?} does not start with {expected:?}");
    }
    let garbage = temp_file("garbage.parquet", "not parquet at all");
    let err = format!("{:#}", read_conversations(&garbage, DataFormat::Messages).unwrap_err());
    assert!(err.starts_with(&format!("{}: cannot read as Parquet: ", garbage.display())), "{err}");
    let missing = Path::new("datasets/no-such.parquet");
    let err = format!("{:#}", read_conversations(missing, DataFormat::Messages).unwrap_err());
    assert!(err.starts_with("datasets/no-such.parquet: cannot open: No such file"), "{err}");
}

#[test]
fn malformed_jsonl_rows_name_file_line_and_field() {
    let sharegpt = r#"{"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]}"#;
    let alpaca = r#"{"instruction": "I", "output": "O"}"#;
    let cases = [
        (
            DataFormat::ShareGpt,
            format!("{sharegpt}\n\n{}", r#"{"conversations": [{"from": "human", "value": "Q"}, {"from": "bot", "value": "A"}]}"#),
            3,
            r#"conversations[1]: unknown "from" "bot" (expected system, human, user, gpt or assistant)"#,
        ),
        (
            DataFormat::ShareGpt,
            format!("{sharegpt}\n{}", r#"{"conversations": {"from": "human"}}"#),
            2,
            r#""conversations" must be an array, not an object"#,
        ),
        (DataFormat::Alpaca, format!("{alpaca}\n{alpaca}\n{}", r#"{"input": "x", "output": "O"}"#), 3, r#"missing "instruction""#),
        (
            DataFormat::PromptCompletion,
            r#"{"prompt": "Q", "completion": 5}"#.to_string(),
            1,
            r#""prompt" is a string and "completion" a number"#,
        ),
        (
            DataFormat::PromptCompletion,
            r#"{"prompt": [{"role": "user", "content": "Q"}], "completion": [{"role": "system", "content": "A"}]}"#
                .to_string(),
            1,
            r#"completion[0]: a "system" turn in the completion"#,
        ),
        (DataFormat::Messages, r#"{"messages": [{"role": "bot", "content": "x"}]}"#.to_string(), 1, r#"messages[0]: unknown role "bot""#),
        (DataFormat::Auto, r#"{"text": "x"}"#.to_string(), 1, r#"format = "auto" found none of"#),
        (DataFormat::Auto, format!("{alpaca}\n{sharegpt}"), 2, r#"missing "instruction""#),
        (DataFormat::Alpaca, "[\n{\"instruction\": \"I\"}\n]".to_string(), 1, "invalid JSON: "),
        (DataFormat::Alpaca, format!("[{alpaca}]"), 1, "a JSON array, not an object (lora-ft reads JSON Lines"),
    ];
    for (i, (format, text, line, message)) in cases.iter().enumerate() {
        let path = temp_file(&format!("bad{i}.jsonl"), text);
        let err = format!("{:#}", read_conversations(&path, *format).unwrap_err());
        let expected = format!("{}:{line}: {message}", path.display());
        assert!(err.starts_with(&expected), "case {i}: {err:?} does not start with {expected:?}");
    }
    let array = temp_file("array.json", "[\n{\"instruction\": \"I\"}\n]");
    let err = read_conversations(&array, DataFormat::Alpaca).unwrap_err().to_string();
    assert!(err.ends_with("`jq -c '.[]' FILE` turns a JSON array into them)"), "{err}");
    let empty = temp_file("empty.jsonl", "\n\n");
    let err = read_conversations(&empty, DataFormat::ShareGpt).unwrap_err().to_string();
    assert_eq!(err, format!("{}: no conversations", empty.display()));
}

/// `lora-ft data check` and `lora-ft eval` read the config's format (eval: `--format`).
#[test]
fn data_check_and_eval_read_the_configured_format() {
    let file = fixture("sharegpt.parquet");
    let toml = format!(
        "[model]\nsource = \"m\"\n[data]\ntrain = {:?}\nformat = \"sharegpt\"\n",
        file.display().to_string()
    );
    let cfg = Config::from_toml(&toml, Path::new("run.toml")).unwrap();
    let report = data_check(&file, &cfg, &tiny_chat()).unwrap();
    assert!(report.contains("conversations: 3\nmessages: system 2, user 4, assistant 4\n"), "{report}");
    assert!(report.contains(&format!("example ({}:row 0)", file.display())), "{report}");

    let tok = ChatTokenizer::from_dir(&tiny_chat()).unwrap();
    let settings = |format| EvalSettings {
        format,
        max_seq_len: 1024,
        truncation_side: TruncationSide::Right,
        system_message: lora_ft::config::SystemMessage::Keep,
        tool_call_tokens: None,
    };
    let rows = tokenize_file(&fixture("alpaca.parquet"), &tok, &settings(DataFormat::Alpaca), 1024).unwrap();
    let expected =
        tokenize_file(&fixture("alpaca.expected.jsonl"), &tok, &settings(DataFormat::Messages), 1024)
            .unwrap();
    assert_eq!(rows, expected);
    assert_eq!(rows.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 2, 3]);
}
