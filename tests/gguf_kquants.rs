//! `export-gguf --type q4_k_m`'s quantizers against llama.cpp's own: every block of the golden
//! rows (tests/golden/gguf_kquants.json, from ggml's `ggml_quantize_chunk` through
//! scripts/golden/gguf_kquants.py) byte for byte, in each type a Q4_K_M file holds.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use lora_ft::gguf::format::kquants;
use lora_ft::gguf::format::quants::quantize;
use serde_json::Value as Json;

type Quantizer = fn(&[f32]) -> Vec<u8>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn golden() -> Vec<Json> {
    let text = std::fs::read_to_string("tests/golden/gguf_kquants.json")
        .expect("tests/golden/gguf_kquants.json: run scripts/golden/gguf_kquants.py");
    let golden: Json = serde_json::from_str(&text).unwrap();
    golden["cases"].as_array().unwrap().clone()
}

fn values(case: &Json) -> Vec<f32> {
    case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

#[test]
fn k_quant_and_q5_0_blocks_equal_llama_cpps_byte_for_byte() {
    let cases = golden();
    assert_eq!(cases.len(), 14);
    let ours: [(&str, Quantizer); 4] = [
        ("q4_k", kquants::quantize_q4_k),
        ("q5_k", kquants::quantize_q5_k),
        ("q6_k", kquants::quantize_q6_k),
        ("q5_0", kquants::quantize_q5_0),
    ];
    let mut failures = Vec::new();
    for case in &cases {
        let x = values(case);
        for (key, quantize) in ours {
            if hex(&quantize(&x)) != case[key].as_str().unwrap() {
                failures.push(format!("{} {key}", case["name"]));
            }
        }
        // the fallback of Q6_K on rows that do not split into 256: candle's q8_0
        let q8 = quantize(&x, GgmlDType::Q8_0).unwrap();
        if hex(&q8) != case["q8_0"].as_str().unwrap() {
            failures.push(format!("{} q8_0", case["name"]));
        }
    }
    assert!(failures.is_empty(), "blocks differing from llama.cpp's: {failures:?}");
}

/// Why the port: candle's own Q4_K quantizer (an older llama.cpp search, other rounding) gives
/// other blocks than today's llama.cpp on most golden rows.
#[test]
fn candle_q4k_is_not_llama_cpps() {
    let cases = golden();
    let differing = cases
        .iter()
        .filter(|case| {
            let x = values(case);
            let tensor = Tensor::from_slice(&x, x.len(), &Device::Cpu).unwrap();
            let candle = QTensor::quantize(&tensor, GgmlDType::Q4K).unwrap().data().unwrap().into_owned();
            hex(&candle) != case["q4_k"].as_str().unwrap()
        })
        .count();
    // 12 of the 14 with candle-core 0.11.1: all but the zero and the constant rows
    assert!(differing > cases.len() / 2, "candle's Q4_K differs on only {differing} of {} rows", cases.len());
}
