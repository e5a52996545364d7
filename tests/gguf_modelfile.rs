//! The Ollama Modelfile's chat-template recognition on real models' templates
//! (tests/fixtures/tokenizers: Llama 3.2/3.3, Qwen2.5, Qwen3, Gemma 3, Mistral v0.3 / Nemo; the
//! SmolLM2 demo folder) and the default system prompts read from them.

use flate2::read::GzDecoder;
use lora_ft::gguf::export::modelfile::{default_system, Family};
use serde_json::Value as Json;
use std::io::Read;
use std::path::Path;

/// The fixture's template: its chat_template.jinja, else tokenizer_config.json(.gz)'s.
fn template(dir: &Path) -> Option<String> {
    if let Ok(text) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(text);
    }
    let plain = dir.join("tokenizer_config.json");
    let text = match std::fs::read_to_string(&plain) {
        Ok(text) => text,
        Err(_) => {
            let file = std::fs::File::open(dir.join("tokenizer_config.json.gz")).unwrap();
            let mut text = String::new();
            GzDecoder::new(file).read_to_string(&mut text).unwrap();
            text
        }
    };
    let config: Json = serde_json::from_str(&text).unwrap();
    config["chat_template"].as_str().map(String::from)
}

#[test]
fn real_templates_are_recognised_with_their_default_system_prompts() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers");
    let qwen = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    let cases = [
        ("llama-3.2", Family::Llama3, None),
        ("llama-3.3", Family::Llama3, None),
        ("qwen2.5", Family::ChatMl, Some(qwen)),
        ("qwen3", Family::ChatMl, None),
        ("gemma-2", Family::Gemma, None),
        ("gemma-3", Family::Gemma, None),
        ("mistral-v0.3", Family::Mistral, None),
        ("mistral-nemo", Family::Mistral, None),
    ];
    for (name, family, system) in cases {
        let text = template(&fixtures.join(name)).unwrap_or_else(|| panic!("{name}: no template"));
        assert_eq!(Family::recognise(&text), Some(family), "{name}");
        assert_eq!(default_system(&text).as_deref(), system, "{name}");
    }
    let smollm2 = template(&lora_ft::fixtures::smollm2_dir()).unwrap();
    assert_eq!(Family::recognise(&smollm2), Some(Family::ChatMl));
    assert_eq!(
        default_system(&smollm2).as_deref(),
        Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    );
    // Alpaca-style: none of the families
    assert_eq!(Family::recognise("### Instruction:\n{{ messages[0]['content'] }}\n### Response:"), None);
}
