//! Token log-probs as OpenAI returns them: chat's `logprobs.content` (one entry a token, each
//! with its `top_logprobs`) and the legacy completions' `tokens` / `token_logprobs` /
//! `top_logprobs` / `text_offset` lists. The log-probs are the model's raw ones.

use serde_json::{json, Map, Value};
use tokenizers::Tokenizer;

use crate::generate::sampling::Sampled;

/// A token's text as the client sees it (special tokens included).
fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// One entry of chat's `logprobs.content`.
pub fn chat_entry(tokenizer: &Tokenizer, sampled: &Sampled) -> Value {
    let entry = |id: u32, logprob: f64| {
        let token = token_text(tokenizer, id);
        json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
    };
    let mut out = entry(sampled.token, sampled.raw_logprob);
    let top: Vec<Value> = sampled.top_logprobs.iter().map(|&(id, lp)| entry(id, lp)).collect();
    out["top_logprobs"] = top.into();
    out
}

/// Chat's `logprobs` of a choice's tokens.
pub fn chat(tokenizer: &Tokenizer, tokens: &[Sampled]) -> Value {
    json!({"content": tokens.iter().map(|s| chat_entry(tokenizer, s)).collect::<Vec<_>>()})
}

/// The legacy completions' `logprobs` of tokens whose text starts `offset` bytes into the
/// choice's text.
pub fn completion(tokenizer: &Tokenizer, tokens: &[Sampled], mut offset: usize) -> Value {
    let (mut texts, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for s in tokens {
        let text = token_text(tokenizer, s.token);
        offsets.push(offset);
        offset += text.len();
        let top: Map<String, Value> =
            s.top_logprobs.iter().map(|&(id, lp)| (token_text(tokenizer, id), json!(lp))).collect();
        texts.push(text);
        lps.push(s.raw_logprob);
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}
