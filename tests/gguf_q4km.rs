//! `export-gguf --type q4_k_m` on the SmolLM2 demo model against llama.cpp's own `Q4_K_M` of the
//! same weights (tests/golden/gguf_q4km_smollm2.json, scripts/gguf_q4km_check.py: llama.cpp's
//! `llama_model_quantize` of our f32 export): every tensor's type as llama.cpp chose it (Q4_K,
//! Q6_K, and the Q5_0/Q8_0 fallbacks of SmolLM2's rows of 576) and its bytes (CRC-32 of each);
//! the same for a synthetic 80-layer Llama (tests/golden/gguf_q4km_llama80.json): untied output,
//! llama.cpp's 70B rule for attn_v (Q5_K).

mod common;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use common::Scratch;
use lora_ft::gguf::export::FileType;
use serde_json::Value as Json;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

fn ggml_name(dtype: GgmlDType) -> &'static str {
    match dtype {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q8_0 => "Q8_0",
        other => panic!("unexpected type {other:?} in a Q4_K_M file"),
    }
}

/// Every tensor of the GGUF file `out` against the golden's type and CRC-32 of llama.cpp's bytes;
/// returns how many tensors of each type.
fn check_against_golden(out: &Path, golden: &str) -> Vec<(&'static str, i32)> {
    let golden: Json = serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let golden = golden["tensors"].as_object().unwrap();
    let mut file = std::fs::File::open(out).unwrap();
    let content = Content::read(&mut file).unwrap();
    assert!(matches!(content.metadata["general.file_type"], Value::U32(15)));
    assert_eq!(content.tensor_infos.len(), golden.len());
    let mut differing = Vec::new();
    let mut counts = std::collections::BTreeMap::new();
    for (name, info) in &content.tensor_infos {
        let want = &golden[name];
        let dtype = ggml_name(info.ggml_dtype);
        *counts.entry(dtype).or_insert(0) += 1;
        let bytes = info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
        let mut data = vec![0u8; bytes];
        file.seek(SeekFrom::Start(content.tensor_data_offset + info.offset)).unwrap();
        file.read_exact(&mut data).unwrap();
        if dtype != want["type"] || u64::from(crc32fast::hash(&data)) != want["crc32"].as_u64().unwrap() {
            differing.push(format!("{name}: ours {dtype}, llama.cpp {}", want["type"]));
        }
    }
    assert!(differing.is_empty(), "tensors not as llama.cpp's Q4_K_M: {differing:?}");
    counts.into_iter().collect()
}

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("gguf-q4km-{name}"))
}

/// SmolLM2: tied embeddings, rows of 576 (most weights fall back to Q5_0 and Q8_0), 30 layers.
#[test]
fn smollm2_q4_k_m_is_llama_cpps_q4_k_m_byte_for_byte() {
    let model = lora_ft::fixtures::smollm2_dir();
    let dir = scratch("smollm2");
    let out = dir.0.join("smollm2-q4_k_m.gguf");
    let summary =
        lora_ft::merge::export_gguf(model.to_str().unwrap(), "main", None, &out, FileType::Q4KM).unwrap();
    assert_eq!(summary.tensors, 272);
    let counts = check_against_golden(&out, "tests/golden/gguf_q4km_smollm2.json");
    assert_eq!(counts, [("F32", 61), ("Q4_K", 16), ("Q5_0", 166), ("Q6_K", 14), ("Q8_0", 15)]);
}

/// scripts/golden/gguf_q4km_llama80.py's weight formula, in f64 rounded to f32.
fn synthetic(t: u64, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let u = (i.wrapping_mul(2654435761).wrapping_add(t * 40503) % (1 << 32)) as f64 / 4294967296.0;
            ((u - 0.5) * (0.02 * (1 + t % 5) as f64)) as f32
        })
        .collect()
}

/// The synthetic 80-layer Llama of scripts/golden/gguf_q4km_llama80.py: grouped KV heads (llama.cpp's
/// "70B": attn_v Q5_K where not Q6_K), an untied lm_head (output Q6_K, token_embd Q4_K), rows of
/// 256 (no fallbacks).
#[test]
fn an_80_layer_gqa_llama_q4_k_m_is_llama_cpps_byte_for_byte() {
    let dir = scratch("llama80");
    let model = dir.0.join("model");
    std::fs::create_dir_all(&model).unwrap();
    let config = serde_json::json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 80, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 49152, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2});
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let smollm2 = lora_ft::fixtures::smollm2_dir();
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(smollm2.join(name), model.join(name)).unwrap();
    }
    let (h, kv, v) = (256, 128, 49152);
    let mut shapes = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h]),
        ("lm_head.weight".to_string(), vec![v, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    for l in 0..80 {
        for (part, shape) in [
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("mlp.gate_proj.weight", vec![h, h]),
            ("mlp.up_proj.weight", vec![h, h]),
            ("mlp.down_proj.weight", vec![h, h]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            shapes.push((format!("model.layers.{l}.{part}"), shape));
        }
    }
    shapes.sort();
    let tensors: Vec<(String, Tensor)> = shapes
        .iter()
        .enumerate()
        .map(|(t, (name, shape))| {
            let n = shape.iter().product();
            let values = if shape.len() == 1 { vec![1f32; n] } else { synthetic(t as u64, n) };
            (name.clone(), Tensor::from_vec(values, shape.as_slice(), &Device::Cpu).unwrap())
        })
        .collect();
    candle_core::safetensors::save(
        &tensors.into_iter().collect::<std::collections::HashMap<_, _>>(),
        model.join("model.safetensors"),
    )
    .unwrap();
    let out = dir.0.join("llama80-q4_k_m.gguf");
    lora_ft::merge::export_gguf(model.to_str().unwrap(), "main", None, &out, FileType::Q4KM).unwrap();
    let counts = check_against_golden(&out, "tests/golden/gguf_q4km_llama80.json");
    assert_eq!(counts, [("F32", 161), ("Q4_K", 441), ("Q5_K", 40), ("Q6_K", 81)]);
}
