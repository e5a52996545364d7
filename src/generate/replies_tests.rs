//! Replies generated with the tiny chat model: together equal to alone, their log-probs and
//! finish reasons, stop strings.

use super::stop::FinishReason;
use super::*;
use crate::quant::Quantization;
use candle_core::{DType, Device};

/// The tiny chat model with its adapter, on the CPU.
fn tiny_model() -> CausalLm {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-chat");
    let (config, weights) = crate::hub::local_weights(&dir).unwrap();
    let mut model = CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap();
    crate::peft_adapter::load_adapter(&mut model, &dir.join("adapter")).unwrap();
    model
}

/// Each token's log-probs: at temperature 1 untruncated the sampling log-prob is the raw one,
/// greedy's is 0 and its token the most likely; a reply ends with `length` or at a stop id
/// with `stop`, alone or together with others.
#[test]
fn detailed_replies_carry_log_probs_and_finish_reasons() {
    let model = tiny_model();
    let prompts: Vec<Vec<u32>> = (0..3).map(|p| (3..20 + 5 * p).collect()).collect();
    let sampled = GenerationSettings {
        max_new_tokens: 6,
        temperature: 1.0,
        seed: 3,
        logprobs: Some(3),
        ..Default::default()
    };
    let g = generate_detailed(&model, &prompts[0], &[], &sampled).unwrap();
    assert_eq!((g.tokens.len(), g.sampled.len(), g.finish), (6, 6, FinishReason::Length));
    for (s, &t) in g.sampled.iter().zip(&g.tokens) {
        assert_eq!(s.token, t);
        assert!(s.raw_logprob < 0.0 && (s.raw_logprob - s.sampling_logprob).abs() < 1e-9, "{s:?}");
        assert_eq!(s.top_logprobs.len(), 3);
        assert!(s.top_logprobs[0].1 >= s.raw_logprob);
    }
    let greedy = GenerationSettings { max_new_tokens: 6, logprobs: Some(1), ..Default::default() };
    let g = generate_detailed(&model, &prompts[1], &[], &greedy).unwrap();
    for s in &g.sampled {
        assert_eq!((s.sampling_logprob, s.top_logprobs[0]), (0.0, (s.token, s.raw_logprob)));
    }
    let stop = [g.tokens[2]];
    let first = g.tokens.iter().position(|t| *t == stop[0]).unwrap();
    let stopped = generate_detailed(&model, &prompts[1], &stop, &greedy).unwrap();
    assert_eq!((stopped.tokens.as_slice(), stopped.finish), (&g.tokens[..first], FinishReason::Stop));
    let together = generate_many_detailed(&model, &prompts, &stop, &greedy).unwrap();
    for (p, reply) in prompts.iter().zip(&together) {
        let alone = generate_detailed(&model, p, &stop, &greedy).unwrap();
        assert_eq!((&reply.tokens, reply.finish), (&alone.tokens, alone.finish));
    }
    let bad = GenerationSettings { top_p: Some(0.0), ..Default::default() };
    let err = generate(&model, &prompts[0], &[], &bad).unwrap_err().to_string();
    assert!(err.contains("top_p"), "{err}");
}

/// Prompts of different lengths answered together give each the reply it gets alone: greedy
/// and sampled, with the tiny chat model's adapter on (its LoRA group in every projection),
/// replies stopped by a stop id at different steps, and more rows than the products'
/// dot-product path takes.
#[test]
fn replies_generated_together_equal_each_generated_alone() {
    let model = tiny_model();
    let prompts: Vec<Vec<u32>> =
        (0..19).map(|p| (0..3 + 7 * p).map(|i| ((i * 37 + p * 11) % 1000) as u32 + 3).collect()).collect();
    for temperature in [0.0, 0.8] {
        let settings = GenerationSettings { max_new_tokens: 9, temperature, seed: 5, ..Default::default() };
        let alone: Vec<Vec<u32>> =
            prompts.iter().map(|p| generate(&model, p, &[], &settings).unwrap()).collect();
        // stop at the token some replies reach at different steps
        let stop = [alone[0][4], alone[3][1]];
        let stopped: Vec<Vec<u32>> =
            prompts.iter().map(|p| generate(&model, p, &stop, &settings).unwrap()).collect();
        assert_eq!(generate_many(&model, &prompts, &[], &settings).unwrap(), alone, "T = {temperature}");
        assert_eq!(generate_many(&model, &prompts, &stop, &settings).unwrap(), stopped, "T = {temperature}");
        assert!(stopped.iter().any(|r| r.len() < 9) && stopped.iter().any(|r| r.len() == 9));
    }
}

/// A stop string ends a reply's text just before it, alone and together with other replies;
/// an empty one is an error.
#[test]
fn stop_strings_cut_replies_before_them() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-chat");
    let model = tiny_model();
    let tokenizer = ChatTokenizer::load(&dir, None).unwrap();
    let conversations: Vec<Vec<Message>> = ["hello", "what is two and two", "tell me a story"]
        .iter()
        .map(|t| vec![Message::new("user", t)])
        .collect();
    let plain = GenerationSettings { max_new_tokens: 12, ..Default::default() };
    let free = reply(&model, &tokenizer, &conversations[0], &[], &plain).unwrap();
    // two characters from the middle of the free reply, cut at their first occurrence
    let chars: Vec<char> = free.chars().collect();
    assert!(chars.len() >= 6, "{free:?}");
    let stop: String = chars[3..5].iter().collect();
    let at = free.find(&stop).unwrap();
    let settings = GenerationSettings { stop_strings: vec![stop.clone()], ..plain.clone() };
    assert_eq!(reply(&model, &tokenizer, &conversations[0], &[], &settings).unwrap(), free[..at]);
    let batch: Vec<(&[Message], Option<&[Value]>)> =
        conversations.iter().map(|m| (m.as_slice(), None)).collect();
    let together = replies_with_tools(&model, &tokenizer, &batch, &[], &settings).unwrap();
    for (text, messages) in together.iter().zip(&conversations) {
        assert_eq!(text, &reply(&model, &tokenizer, messages, &[], &settings).unwrap());
        assert!(!text.contains(&stop), "{text:?}");
    }
    let empty = GenerationSettings { stop_strings: vec![String::new()], ..plain };
    let err = reply(&model, &tokenizer, &conversations[0], &[], &empty).unwrap_err().to_string();
    assert!(err.contains("stop strings"), "{err}");
}
