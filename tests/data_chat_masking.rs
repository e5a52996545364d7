//! The SmolLM2 chat template rendered, tokenized and masked exactly as transformers does it
//! (tests/golden/chat_masking.json from scripts/golden/chat_masking.py, which finds the assistant
//! spans by ChatML string search — independently of lora-ft's prefix rendering).

use lora_ft::data::{ChatTokenizer, Message};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    messages: Vec<Message>,
    text: String,
    prompt_text: String,
    input_ids: Vec<u32>,
    labels: Vec<i64>,
}

fn golden() -> Golden {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/chat_masking.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn renders_tokenizes_and_masks_like_transformers() {
    let tok = ChatTokenizer::from_dir(&lora_ft::fixtures::smollm2_dir()).unwrap();
    let golden = golden();
    assert_eq!(golden.cases.len(), 6);
    for (i, case) in golden.cases.iter().enumerate() {
        assert_eq!(tok.template().render(&case.messages, false).unwrap(), case.text, "case {i}: text");
        assert_eq!(
            tok.template().render(&case.messages, true).unwrap(),
            case.prompt_text,
            "case {i}: prompt"
        );
        let example = tok.encode(&case.messages).unwrap();
        assert_eq!(example.input_ids, case.input_ids, "case {i}: input_ids");
        assert_eq!(example.labels, case.labels, "case {i}: labels");
    }
}

#[test]
fn pads_with_the_configured_pad_token() {
    // SmolLM2's tokenizer_config.json: pad_token = "<|im_end|>", id 2.
    let tok = ChatTokenizer::from_dir(&lora_ft::fixtures::smollm2_dir()).unwrap();
    assert_eq!(tok.pad_id(), 2);
}
