//! `export-gguf --type q4_k_m` on the SmolLM2 demo model against llama.cpp's own `Q4_K_M` of the
//! same weights (tests/golden/gguf_q4km_smollm2.json, scripts/gguf_q4km_check.py: llama.cpp's
//! `llama_model_quantize` of our f32 export): every tensor's type as llama.cpp chose it (Q4_K,
//! Q6_K, and the Q5_0/Q8_0 fallbacks of SmolLM2's rows of 576) and its bytes (CRC-32 of each).

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use lora_ft::gguf::export::FileType;
use serde_json::Value as Json;
use std::io::{Read, Seek, SeekFrom};

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

#[test]
fn smollm2_q4_k_m_is_llama_cpps_q4_k_m_byte_for_byte() {
    let golden: Json =
        serde_json::from_str(&std::fs::read_to_string("tests/golden/gguf_q4km_smollm2.json").unwrap())
            .unwrap();
    let golden = golden["tensors"].as_object().unwrap();
    let model = lora_ft::fixtures::smollm2_dir();
    let dir = std::env::temp_dir().join(format!("lora-ft-gguf-q4km-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("smollm2-q4_k_m.gguf");
    let summary =
        lora_ft::merge::export_gguf(model.to_str().unwrap(), "main", None, &out, FileType::Q4KM).unwrap();
    assert_eq!(summary.tensors, 272);

    let mut file = std::fs::File::open(&out).unwrap();
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
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(differing.is_empty(), "tensors not as llama.cpp's Q4_K_M: {differing:?}");
    let counts: Vec<(&str, i32)> = counts.into_iter().collect();
    assert_eq!(counts, [("F32", 61), ("Q4_K", 16), ("Q5_0", 166), ("Q6_K", 14), ("Q8_0", 15)]);
}
