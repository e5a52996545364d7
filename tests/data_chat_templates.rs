//! The real chat templates and tokenizers of Llama 3.2/3.3, Qwen2.5, Qwen3, Mistral 7B v0.3, Mistral
//! Nemo, Gemma 2 and Gemma 3 (tests/fixtures/tokenizers/, sources in its README) rendered, tokenized
//! and masked exactly as transformers does it: tests/golden/chat_templates.json from
//! scripts/golden/chat_templates.py, which finds the trained spans by string search on each
//! family's turn markers, independently of lora-ft's prefix rendering. Tool calling:
//! tests/golden/chat_tools.json from scripts/golden/chat_tools.py, the same way.

mod common;
use common::Scratch;
use std::path::{Path, PathBuf};

use lora_ft::config::{SystemMessage, TruncationSide};
use lora_ft::data::{read_messages_jsonl, ChatTokenizer, Conversation, Message, TokenizedDataset};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    families: Vec<Family>,
}

#[derive(Deserialize)]
struct Family {
    family: String,
    vocab: String,
    variables: serde_json::Map<String, serde_json::Value>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    messages: Vec<Message>,
    /// transformers' message when the template refuses the row.
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    fold_system: bool,
    #[serde(default)]
    text: String,
    #[serde(default)]
    prompt_text: String,
    #[serde(default)]
    input_ids: Vec<u32>,
    #[serde(default)]
    labels: Vec<i64>,
}

fn golden() -> Golden {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/chat_templates.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn folder(family: &str, vocab: &str) -> Scratch {
    common::tokenizer_folder(family, vocab)
}

fn tokenizer(family: &Family, dir: &Path, policy: SystemMessage) -> ChatTokenizer {
    with_variables(&family.variables, dir, policy)
}

fn with_variables(
    variables: &serde_json::Map<String, serde_json::Value>,
    dir: &Path,
    policy: SystemMessage,
) -> ChatTokenizer {
    let mut tok = ChatTokenizer::from_dir(dir).unwrap().with_system_message(policy);
    for (name, value) in variables {
        tok.template_mut().set_variable(name, minijinja::Value::from_serialize(value));
    }
    tok
}

/// The golden script's fold: "{system}\n\n{first user}".
fn folded(messages: &[Message]) -> Vec<Message> {
    let mut rest = messages[1..].to_vec();
    rest[0].content = format!("{}\n\n{}", messages[0].content, rest[0].content);
    rest
}

#[test]
fn real_templates_render_tokenize_and_mask_like_transformers() {
    let golden = golden();
    let names: Vec<&str> = golden.families.iter().map(|f| f.family.as_str()).collect();
    assert_eq!(
        names,
        ["llama-3.2", "llama-3.3", "qwen2.5", "qwen3", "mistral-v0.3", "mistral-nemo", "gemma-2", "gemma-3"]
    );
    for family in &golden.families {
        let dir = folder(&family.family, &family.vocab);
        let keep = tokenizer(family, &dir.0, SystemMessage::Keep);
        let fold = tokenizer(family, &dir.0, SystemMessage::Fold);
        let mut rendered: Vec<&[Message]> = Vec::new();
        for (i, case) in family.cases.iter().enumerate() {
            let what = format!("{} case {i}", family.family);
            if let Some(error) = &case.error {
                let got = keep.template().render(&case.messages, false).unwrap_err().to_string();
                assert_eq!(got, format!("chat template: {error}"), "{what}: refusal");
                continue;
            }
            let (tok, messages) = match case.fold_system {
                true => (&fold, folded(&case.messages)),
                false => (&keep, case.messages.clone()),
            };
            assert_eq!(tok.template().render(&messages, false).unwrap(), case.text, "{what}: text");
            assert_eq!(tok.template().render(&messages, true).unwrap(), case.prompt_text, "{what}: prompt");
            let example = tok.encode(&case.messages).unwrap();
            assert_eq!(example.input_ids, case.input_ids, "{what}: input_ids");
            assert_eq!(example.labels, case.labels, "{what}: labels");
            if !rendered.contains(&case.messages.as_slice()) {
                rendered.push(&case.messages);
            }
        }
        assert_eq!(rendered.len(), 5, "{}: every dialogue rendered", family.family);
    }
}

/// Gemma 3's template folds a system message into the first user turn itself, as
/// `data.system_message = "fold"` does: both give the same tokens and labels.
#[test]
fn folding_matches_gemma3s_own_system_handling() {
    let golden = golden();
    let family = golden.families.iter().find(|f| f.family == "gemma-3").unwrap();
    let dir = folder("gemma-3", "gemma3");
    let keep = tokenizer(family, &dir.0, SystemMessage::Keep);
    let fold = tokenizer(family, &dir.0, SystemMessage::Fold);
    let with_system: Vec<&Case> = family.cases.iter().filter(|c| c.messages[0].role == "system").collect();
    assert_eq!(with_system.len(), 3);
    for case in with_system {
        assert_eq!(fold.encode(&case.messages).unwrap(), keep.encode(&case.messages).unwrap());
    }
}

fn write_rows(name: &str, rows: &[&str]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("lora-ft-{name}-{}.jsonl", std::process::id()));
    std::fs::write(&path, rows.join("\n") + "\n").unwrap();
    path
}

const PLAIN: &str =
    r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}"#;
const SYSTEM: &str = r#"{"messages": [{"role": "system", "content": "You are a terse support agent for Acme Corp."}, {"role": "user", "content": "My order #1234 hasn't arrived."}, {"role": "assistant", "content": "Sorry! I've re-shipped order #1234; it arrives Friday."}]}"#;
const NOT_ALTERNATING: &str = r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Anyone there?"}, {"role": "assistant", "content": "Yes."}]}"#;

/// A row the template refuses is an error naming the data file, the line and the template's own
/// message; with `data.system_message = "fold"` Gemma 2 takes the row as transformers renders the
/// folded conversation.
#[test]
fn refused_rows_name_file_line_and_the_templates_message() {
    let golden = golden();
    let gemma2 = golden.families.iter().find(|f| f.family == "gemma-2").unwrap();
    let dir = folder("gemma-2", "gemma2");
    let data = write_rows("gemma2-system", &[PLAIN, "", SYSTEM]);
    let keep = tokenizer(gemma2, &dir.0, SystemMessage::Keep);
    let err = TokenizedDataset::from_jsonl(&data, &keep, 1024, TruncationSide::Right).err().unwrap();
    assert_eq!(
        format!("{err:#}"),
        format!(
            "{}:3: chat template: System role not supported \
             (data.system_message = \"fold\" would fold the system text into the first user turn)",
            data.display()
        )
    );

    let fold = tokenizer(gemma2, &dir.0, SystemMessage::Fold);
    let set = TokenizedDataset::from_jsonl(&data, &fold, 1024, TruncationSide::Right).unwrap();
    assert_eq!(set.lines, [1, 3]);
    let expected = gemma2.cases.iter().find(|c| c.fold_system && c.messages.len() == 3).unwrap();
    assert_eq!(set.examples[1].input_ids, expected.input_ids);
    assert_eq!(set.examples[1].labels, expected.labels);
    let _ = std::fs::remove_file(&data);

    let nemo = golden.families.iter().find(|f| f.family == "mistral-nemo").unwrap();
    let dir = folder("mistral-nemo", "tekken");
    let data = write_rows("nemo-alternation", &[NOT_ALTERNATING]);
    let keep = tokenizer(nemo, &dir.0, SystemMessage::Keep);
    let err = TokenizedDataset::from_jsonl(&data, &keep, 1024, TruncationSide::Right).err().unwrap();
    assert_eq!(
        format!("{err:#}"),
        format!(
            "{}:1: chat template: After the optional system message, conversation roles must \
             alternate user/assistant/user/assistant/...",
            data.display()
        )
    );
    let _ = std::fs::remove_file(&data);
}

/// Without `date_string`, Llama 3.2's template takes today's date from `strftime_now` (defined,
/// as in transformers), so the golden pins it; everything else of the render is unchanged.
#[test]
fn llama32_prints_todays_date_unless_date_string_is_given() {
    let golden = golden();
    let family = golden.families.iter().find(|f| f.family == "llama-3.2").unwrap();
    assert_eq!(family.variables["date_string"], "05 Mar 2025");
    let dir = folder("llama-3.2", "llama3");
    let unpinned = ChatTokenizer::from_dir(&dir.0).unwrap();
    let case = &family.cases[0];
    let clock =
        lora_ft::data::ChatTemplate::new(r#"{{ strftime_now("%d %b %Y") }}"#.into(), Default::default());
    let today = clock.unwrap().render(&[], false).unwrap();
    let rendered = unpinned.template().render(&case.messages, false).unwrap();
    assert_eq!(rendered, case.text.replace("Today Date: 05 Mar 2025", &format!("Today Date: {today}")));
    assert_ne!(today, "05 Mar 2025");
}

/// The text of each run of trained tokens (byte offsets into `text`).
fn trained_runs<'a>(text: &'a str, offsets: &[(usize, usize)], labels: &[i64]) -> Vec<&'a str> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut previous = false;
    for (&(a, b), &label) in offsets.iter().zip(labels) {
        let trained = label != -100;
        match runs.last_mut() {
            Some(run) if trained && previous => run.1 = b,
            _ if trained => runs.push((a, b)),
            _ => {}
        }
        previous = trained;
    }
    runs.into_iter().map(|(a, b)| &text[a..b]).collect()
}

/// Mistral 7B v0.3's template writes a system message only into the last user turn of a
/// conversation that ends with one: a row that ends with a reply loses it (as in transformers),
/// and where it sits in a trailing user turn nothing of it is trained. With `fold` it leads the
/// first user turn. Either way the trained tokens are exactly " " + each reply, trimmed, + `</s>`.
#[test]
fn mistral_v03_trains_the_replies_and_places_the_system_message_as_transformers() {
    let golden = golden();
    let family = golden.families.iter().find(|f| f.family == "mistral-v0.3").unwrap();
    let dir = folder("mistral-v0.3", "mistral-v0.3");
    let keep = tokenizer(family, &dir.0, SystemMessage::Keep);
    let fold = tokenizer(family, &dir.0, SystemMessage::Fold);
    let system = "You are a terse support agent for Acme Corp.";
    let (mut kept, mut folded_rows) = (0, 0);
    for case in family.cases.iter().filter(|c| c.error.is_none()) {
        let tok = if case.fold_system { &fold } else { &keep };
        let labels = tok.encode(&case.messages).unwrap().labels;
        let offsets: Vec<(usize, usize)> =
            tok.tokenizer().encode(case.text.as_str(), false).unwrap().get_offsets().to_vec();
        assert_eq!(offsets.len(), labels.len());
        let replies: Vec<String> = case
            .messages
            .iter()
            .filter(|m| m.role == "assistant")
            .map(|m| format!(" {}</s>", m.content.trim()))
            .collect();
        assert_eq!(trained_runs(&case.text, &offsets, &labels), replies, "{}", case.text);
        if case.messages[0].role != "system" {
            continue;
        }
        let ends_with_user = case.messages.last().unwrap().role == "user";
        if case.fold_system {
            assert!(case.text.starts_with(&format!("<s>[INST] {system}\n\n")), "{}", case.text);
            folded_rows += 1;
        } else if ends_with_user {
            assert!(case.text.ends_with(&format!("[INST] {system}\n\nThanks[/INST]")), "{}", case.text);
            kept += 1;
        } else {
            assert!(!case.text.contains(system), "{}", case.text);
            kept += 1;
        }
    }
    assert_eq!((kept, folded_rows), (3, 3));
}

/// Mistral 7B v0.3 refuses roles that do not alternate; the row's error names the data file, the
/// line and the template's own message, word for word transformers'.
#[test]
fn mistral_v03_refuses_non_alternating_rows_naming_file_and_line() {
    let golden = golden();
    let family = golden.families.iter().find(|f| f.family == "mistral-v0.3").unwrap();
    let refusal = family.cases.iter().find_map(|c| c.error.as_ref()).unwrap();
    assert_eq!(
        refusal,
        "After the optional system message, conversation roles must alternate \
         user/assistant/user/assistant/..."
    );
    let dir = folder("mistral-v0.3", "mistral-v0.3");
    let data = write_rows("mistral-v03-alternation", &[PLAIN, SYSTEM, NOT_ALTERNATING]);
    for policy in [SystemMessage::Keep, SystemMessage::Fold] {
        let tok = tokenizer(family, &dir.0, policy);
        let err = TokenizedDataset::from_jsonl(&data, &tok, 1024, TruncationSide::Right).err().unwrap();
        assert_eq!(format!("{err:#}"), format!("{}:3: chat template: {refusal}", data.display()));
    }
    let _ = std::fs::remove_file(&data);
}

#[derive(Deserialize)]
struct ToolGolden {
    families: Vec<ToolFamily>,
}

#[derive(Deserialize)]
struct ToolFamily {
    family: String,
    vocab: String,
    variables: serde_json::Map<String, serde_json::Value>,
    cases: Vec<ToolCase>,
}

#[derive(Deserialize)]
struct ToolCase {
    /// The data row, keys in file order (a minijinja value keeps them).
    row: minijinja::Value,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    ignores_tools: bool,
    #[serde(default)]
    text: String,
    #[serde(default)]
    prompt_text: String,
    #[serde(default)]
    input_ids: Vec<u32>,
    #[serde(default)]
    labels: Vec<i64>,
    /// The text of each trained span.
    #[serde(default)]
    trained: Vec<String>,
}

/// The runs of trained tokens, decoded.
fn decoded_trained_runs(tok: &ChatTokenizer, labels: &[i64]) -> Vec<String> {
    let mut runs: Vec<Vec<u32>> = Vec::new();
    for (i, &l) in labels.iter().enumerate() {
        match (l >= 0, i > 0 && labels[i - 1] >= 0) {
            (true, true) => runs.last_mut().unwrap().push(l as u32),
            (true, false) => runs.push(vec![l as u32]),
            _ => {}
        }
    }
    runs.iter().map(|r| tok.tokenizer().decode(r, false).unwrap()).collect()
}

/// Rows with `tools`, assistant `tool_calls` and `tool` results, read as a data file's line is,
/// rendered with `tools=` by each family's template, tokenized and masked as transformers (and
/// the golden script's marker search) has it: tool-call turns trained, tool results not.
#[test]
fn tool_calls_render_tokenize_and_mask_like_transformers() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/chat_tools.json");
    let golden: ToolGolden = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut outcomes = Vec::new();
    for family in &golden.families {
        let dir = folder(&family.family, &family.vocab);
        let tok = with_variables(&family.variables, &dir.0, SystemMessage::Keep);
        for (i, case) in family.cases.iter().enumerate() {
            let what = format!("{} tool case {i}", family.family);
            let conv = Conversation::parse(&serde_json::to_string(&case.row).unwrap(), 1).unwrap();
            let tools = conv.tools.as_deref();
            if case.ignores_tools {
                let err = format!("{:#}", tok.encode_with_tools(&conv.messages, tools).unwrap_err());
                assert!(err.starts_with("the chat template of "), "{what}: {err}");
                assert!(
                    err.contains(" does not take tools (rendering a tool call and its result fails: "),
                    "{what}: {err}"
                );
                outcomes.push(format!("{} refused", family.family));
                continue;
            }
            if let Some(error) = &case.error {
                let got = tok.template().render_tools(&conv.messages, tools, false).unwrap_err().to_string();
                assert_eq!(got, format!("chat template: {error}"), "{what}: refusal");
                outcomes.push(format!("{} error", family.family));
                continue;
            }
            assert_eq!(
                tok.template().render_tools(&conv.messages, tools, false).unwrap(),
                case.text,
                "{what}: text"
            );
            let prompt = tok.template().render_tools(&conv.messages, tools, true).unwrap();
            assert_eq!(prompt, case.prompt_text, "{what}: prompt");
            let example = tok.encode_with_tools(&conv.messages, tools).unwrap();
            assert_eq!(example.input_ids, case.input_ids, "{what}: input_ids");
            assert_eq!(example.labels, case.labels, "{what}: labels");
            // the labels above are the check; the decoded runs show it readably. SentencePiece
            // decodes a "▁" piece after a special token as two spaces ("[TOOL_CALLS]  [" for the
            // text's "[TOOL_CALLS] ["), so runs of spaces are compared as one.
            let squeeze = |runs: Vec<String>| -> Vec<String> {
                runs.iter()
                    .map(|r| r.split(' ').filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" "))
                    .collect()
            };
            assert_eq!(
                squeeze(decoded_trained_runs(&tok, &example.labels)),
                squeeze(case.trained.clone()),
                "{what}: trained text"
            );
            outcomes.push(format!("{} ok", family.family));
        }
    }
    let expected = [
        "llama-3.2 ok",
        "llama-3.2 ok",
        "llama-3.2 error",
        "llama-3.3 ok",
        "llama-3.3 ok",
        "llama-3.3 error",
        "qwen2.5 ok",
        "qwen2.5 ok",
        "qwen2.5 ok",
        "qwen3 ok",
        "qwen3 ok",
        "qwen3 ok",
        "mistral-v0.3 ok",
        "mistral-v0.3 ok",
        "mistral-v0.3 ok",
        "mistral-nemo ok",
        "mistral-nemo ok",
        "mistral-nemo ok",
        "gemma-2 refused",
        "gemma-2 refused",
        "gemma-2 refused",
        "gemma-3 refused",
        "gemma-3 refused",
        "gemma-3 refused",
    ];
    assert_eq!(outcomes, expected);
}

const TOOLS: &str = r#""tools": [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]"#;

/// A row like golden case 0 with `messages[1]` (the tool-call turn) and `messages[2]` (the
/// result) given.
fn tool_row(call_turn: &str, result: &str) -> String {
    format!(
        r#"{{{TOOLS}, "messages": [{{"role": "user", "content": "Status of order 1234?"}}, {call_turn}, {result}, {{"role": "assistant", "content": "It has shipped."}}]}}"#
    )
}

const CALL: &str = r#"{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "id": "a1B2c3D4e", "function": {"name": "lookup_order", "arguments": {"order_id": "1234"}}}]}"#;
const RESULT: &str =
    r#"{"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "{\"status\": \"shipped\"}"}"#;

/// Malformed tool rows are errors naming the file, the line and the field.
#[test]
fn malformed_tool_rows_name_file_line_and_field() {
    let plain_user = r#"{"role": "user", "content": "Thanks"}"#;
    let call_with = |call: &str| format!(r#"{{"role": "assistant", "content": "", "tool_calls": [{call}]}}"#);
    let cases = [
        (
            tool_row(plain_user, RESULT),
            r#"messages[2]: a "tool" message must follow an assistant message with "tool_calls" (the result answers a call)"#.to_string(),
        ),
        (
            tool_row(&CALL.replace(r#""role": "assistant""#, r#""role": "user""#), RESULT),
            r#"messages[1]: "tool_calls" on a user message (only an assistant message calls tools)"#.into(),
        ),
        (
            tool_row(&call_with(r#"{"type": "function", "function": {"arguments": {}}}"#), RESULT),
            r#"messages[1]: tool_calls[0].function: missing "name""#.into(),
        ),
        (
            tool_row(&call_with(r#"{"function": {"name": "lookup_order", "arguments": ["1234"]}}"#), RESULT),
            "messages[1]: tool_calls[0].function.arguments: must be a JSON object or a string holding one (got a list)".into(),
        ),
        (
            tool_row(&call_with(r#"{"function": {"name": "lookup_order", "arguments": "{order_id: 1234}"}}"#), RESULT),
            "messages[1]: tool_calls[0].function.arguments: must be a JSON object or a string holding one \
             (got a string that is not JSON: key must be a string at line 1 column 2)"
                .into(),
        ),
        (
            tool_row(&call_with(r#"{"function": {"name": "lookup_order", "parameters": {}}}"#), RESULT),
            r#"messages[1]: tool_calls[0].function: unsupported key "parameters" (a function call has "name" and "arguments")"#.into(),
        ),
        (
            tool_row(CALL, &RESULT.replace("a1B2c3D4e", "b1B2c3D4e")),
            r#"messages[2]: "tool_call_id" "b1B2c3D4e" is not the id of a call of messages[1] ("a1B2c3D4e")"#.into(),
        ),
        (
            tool_row(CALL, RESULT).replace(TOOLS, r#""tools": "lookup_order""#),
            r#""tools" must be a list of {"type": "function", "function": {...}} (got a string)"#.into(),
        ),
        (
            tool_row(CALL, RESULT).replace(r#""type": "function", "function": {"name": "lookup_order", "parameters""#, r#""type": "function", "function": {"parameters""#),
            r#"tools[0].function: missing "name""#.into(),
        ),
    ];
    for (i, (row, message)) in cases.iter().enumerate() {
        let data = write_rows(&format!("tool-error-{i}"), &[PLAIN, row]);
        let err = read_messages_jsonl(&data).unwrap_err();
        assert_eq!(format!("{err:#}"), format!("{}:2: {message}", data.display()), "case {i}");
        let _ = std::fs::remove_file(&data);
    }
}

/// Gemma's templates render no tools: a tool row is refused naming the file, the line and the
/// template; Mistral Nemo's template refuses call ids that are not 9 characters long.
#[test]
fn tool_rows_refused_by_the_template_name_file_and_line() {
    let data = write_rows("gemma-tools", &[PLAIN, &tool_row(CALL, RESULT)]);
    let dir = folder("gemma-2", "gemma2");
    let gemma = ChatTokenizer::from_dir(&dir.0).unwrap();
    let err = TokenizedDataset::from_jsonl(&data, &gemma, 1024, TruncationSide::Right).err().unwrap();
    let template = dir.0.join("chat_template.jinja");
    assert_eq!(
        format!("{err:#}"),
        format!(
            "{}:2: the chat template of {} does not take tools (rendering a tool call and its result fails: \
             chat template: Conversation roles must alternate user/assistant/user/assistant/...); rows with \
             \"tools\", \"tool_calls\" or \"tool\" messages need a model whose template renders them",
            data.display(),
            template.display()
        )
    );
    let _ = std::fs::remove_file(&data);

    let data = write_rows(
        "nemo-tool-id",
        &[&tool_row(&CALL.replace("a1B2c3D4e", "call_1"), &RESULT.replace("a1B2c3D4e", "call_1"))],
    );
    let dir = folder("mistral-nemo", "tekken");
    let nemo = ChatTokenizer::from_dir(&dir.0).unwrap();
    let err = TokenizedDataset::from_jsonl(&data, &nemo, 1024, TruncationSide::Right).err().unwrap();
    assert_eq!(
        format!("{err:#}"),
        format!(
            "{}:1: chat template: Tool call IDs should be alphanumeric strings with length 9!",
            data.display()
        )
    );
    let _ = std::fs::remove_file(&data);
}
