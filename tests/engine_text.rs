//! The engine's streamed text with real tokenizers: each token's piece, decoded as it comes,
//! adds up to the whole reply's text (the special tokens left out, the tool-call markers kept),
//! for byte-level BPE (Llama 3, Qwen) and SentencePiece with byte fallback (Mistral, Gemma),
//! through multi-byte characters split over several tokens.

mod common;

use lora_ft::generate::decode_reply;
use lora_ft::generate::engine::text::{Detokenizer, ReplyText};
use tokenizers::Tokenizer;

const TEXTS: &[&str] = &[
    "Hello, wörld! Ünïcödé — naïve café, 你好世界, こんにちは, 🙂🚀👍🏽 and a tab\tplus  two spaces.",
    " leading space, then\nnew lines\n\n  indented code: fn main() { println!(\"{}\", 1 + 2); }",
    "[TOOL_CALLS][{\"name\": \"lookup_order\", \"arguments\": {\"order_id\": \"A-17\"}}]",
    "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\"}}<|eot_id|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|im_end|>",
];

#[test]
fn streamed_pieces_add_up_to_the_decoded_reply() {
    let cases = [
        ("mistral-v0.3", "mistral-v0.3"),
        ("llama-3.2", "llama3"),
        ("qwen3", "qwen3"),
        ("gemma-3", "gemma3"),
        ("mistral-nemo", "tekken"),
    ];
    for (family, vocab) in cases {
        let folder = common::tokenizer_folder(family, vocab);
        let tokenizer = Tokenizer::from_file(folder.0.join("tokenizer.json")).unwrap();
        let text = ReplyText::new(&tokenizer);
        for sample in TEXTS {
            let ids = tokenizer.encode(*sample, false).unwrap().get_ids().to_vec();
            let mut detokenizer = Detokenizer::default();
            let mut streamed = String::new();
            let mut held = 0;
            for &id in &ids {
                let piece = detokenizer.push(&text, id).unwrap();
                held += usize::from(piece.is_empty());
                assert!(!piece.contains('\u{FFFD}'), "{family}: a piece ends mid-character: {piece:?}");
                streamed.push_str(&piece);
            }
            streamed.push_str(&detokenizer.finish(&text).unwrap());
            let whole = decode_reply(&tokenizer, &ids).unwrap();
            assert_eq!(streamed, whole, "{family}: {sample:?}");
            assert!(held < ids.len(), "{family}: every piece held back");
        }
    }
}
