//! `lora-ft export-gguf` for Qwen 2, Qwen 3, Gemma 2, Gemma 3 and Mistral Nemo, checked without
//! llama.cpp (scripts/gguf_llamacpp_families.py runs the same files in llama.cpp): each tiny
//! fixture with a 256-symbol byte-level tokenizer, exported as f16 — its `<arch>.*` keys as
//! convert_hf_to_gguf.py's model class writes them from the config, its tensor names, shapes and
//! types, Gemma's norms stored as w + 1, and every weight read back through our own `import`
//! equal to the Hugging Face weight within f16 rounding; `--adapter-only` with llama.cpp's names
//! and no row permutation; what llama.cpp cannot run as transformers does, refused.

mod common;
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::GgmlDType;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::Device;
use common::Scratch;
use lora_ft::gguf::export::FileType;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// GPT-2's byte → symbol table (`bytes_to_unicode`).
fn byte_symbols() -> Vec<String> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            let code = if printable(b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(code).unwrap().to_string()
        })
        .collect()
}

/// A copy of fixture `name` (no adapter) with a byte-level tokenizer of its 256 ids, config.json
/// changed by `edit`.
fn folder(name: &str, edit: impl FnOnce(&mut Json)) -> Scratch {
    let scratch = Scratch::new(&format!("gguf-fam-{name}"));
    let dir = scratch.0.clone();
    let src = fixture(name);
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut config: Json =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let vocab: serde_json::Map<String, Json> =
        byte_symbols().into_iter().enumerate().map(|(id, s)| (s, json!(id))).collect();
    let tokenizer = json!({
        "normalizer": null, "added_tokens": [],
        "pre_tokenizer": { "type": "ByteLevel", "add_prefix_space": false, "use_regex": true },
        "model": { "type": "BPE", "byte_fallback": false, "vocab": vocab, "merges": ["Ġ Ġ"] },
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
    scratch
}

/// llama.cpp scales Gemma's queries by 1/√head_dim: the fixtures' scalar 24 is refused (below).
fn gemma_scalar(config: &mut Json) {
    config["query_pre_attn_scalar"] = config["head_dim"].clone();
}

fn export(dir: &Path, file_type: FileType) -> Result<(PathBuf, Content), String> {
    let out = dir.join("out.gguf");
    lora_ft::merge::export_gguf(dir.to_str().unwrap(), "main", None, &out, file_type)
        .map_err(|e| format!("{e:#}"))?;
    let content = Content::read(&mut std::fs::File::open(&out).unwrap()).unwrap();
    Ok((out, content))
}

fn u32_key(content: &Content, key: &str) -> u32 {
    content.metadata.get(key).unwrap_or_else(|| panic!("no {key}")).to_u32().unwrap()
}

fn f32_key(content: &Content, key: &str) -> f32 {
    content.metadata.get(key).unwrap_or_else(|| panic!("no {key}")).to_f32().unwrap()
}

/// The keys convert_hf_to_gguf.py writes for each fixture, from its config.json by hand:
/// (key without the `<arch>.` prefix, value), and the keys it does not write.
#[test]
fn each_family_has_the_keys_its_converter_class_writes() {
    // Qwen2Model: TextModel's keys; no head_dim in the config, so no key_length
    let dir = folder("tiny-qwen2", |_| {});
    let (_, q2) = export(&dir.0, FileType::F16).unwrap();
    assert_eq!(q2.metadata["general.architecture"].to_string().unwrap(), "qwen2");
    for (key, value) in [
        ("block_count", 2),
        ("context_length", 128),
        ("embedding_length", 64),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
    ] {
        assert_eq!(u32_key(&q2, &format!("qwen2.{key}")), value, "qwen2.{key}");
    }
    assert_eq!(f32_key(&q2, "qwen2.rope.freq_base"), 1e6);
    assert_eq!(f32_key(&q2, "qwen2.attention.layer_norm_rms_epsilon"), 1e-5);
    for absent in ["qwen2.attention.key_length", "qwen2.vocab_size", "qwen2.rope.dimension_count"] {
        assert!(!q2.metadata.contains_key(absent), "{absent}");
    }
    assert_eq!(q2.metadata["tokenizer.ggml.pre"].to_string().unwrap(), "gpt-2");

    // Qwen3: head_dim 32 ≠ 64 / 4
    let dir = folder("tiny-qwen3", |_| {});
    let (_, q3) = export(&dir.0, FileType::F16).unwrap();
    assert_eq!(u32_key(&q3, "qwen3.attention.key_length"), 32);
    assert_eq!(u32_key(&q3, "qwen3.attention.value_length"), 32);

    // Gemma2Model: its own list — softcaps, sliding window, no RoPE base
    let dir = folder("tiny-gemma2", gemma_scalar);
    let (_, g2) = export(&dir.0, FileType::F16).unwrap();
    assert_eq!(u32_key(&g2, "gemma2.attention.key_length"), 16);
    assert_eq!(u32_key(&g2, "gemma2.attention.sliding_window"), 5);
    assert_eq!(f32_key(&g2, "gemma2.attn_logit_softcapping"), 0.05);
    assert_eq!(f32_key(&g2, "gemma2.final_logit_softcapping"), 0.25);
    assert!(!g2.metadata.contains_key("gemma2.rope.freq_base"));

    // Gemma3Model: global base and linear scaling, local base, window; layer 1 is global where
    // llama.cpp's default pattern (5 local : 1 global) says local, so each layer's kind is written
    let dir = folder("tiny-gemma3", gemma_scalar);
    let (_, g3) = export(&dir.0, FileType::F16).unwrap();
    assert_eq!(f32_key(&g3, "gemma3.rope.freq_base"), 1e6);
    assert_eq!(f32_key(&g3, "gemma3.rope.freq_base_swa"), 1e4);
    assert_eq!(g3.metadata["gemma3.rope.scaling.type"].to_string().unwrap(), "linear");
    assert_eq!(f32_key(&g3, "gemma3.rope.scaling.factor"), 8.0);
    assert_eq!(u32_key(&g3, "gemma3.attention.sliding_window"), 5);
    assert_eq!(u32_key(&g3, "gemma3.attention.key_length"), 32);
    let pattern = g3.metadata["gemma3.attention.sliding_window_pattern"].to_vec().unwrap();
    let pattern: Vec<bool> = pattern.iter().map(|v| v.to_bool().unwrap()).collect();
    assert_eq!(pattern, [true, false]);
    assert!(!g3.metadata.contains_key("gemma3.final_logit_softcapping"), "null in the config");

    // Mistral Nemo: head_dim 32 ≠ 64 / 4, as key_length and the RoPE dimension count
    let dir = folder("tiny-nemo", |_| {});
    let (_, nemo) = export(&dir.0, FileType::F16).unwrap();
    assert_eq!(nemo.metadata["general.architecture"].to_string().unwrap(), "llama");
    assert_eq!(u32_key(&nemo, "llama.attention.key_length"), 32);
    assert_eq!(u32_key(&nemo, "llama.rope.dimension_count"), 32);
}

/// The f16 bound per element: half an ulp, 2^-11 relative, and half the smallest subnormal.
fn f16_bound(x: f32) -> f32 {
    x.abs() * 2f32.powi(-11) + 2f32.powi(-25)
}

/// Every tensor: llama.cpp's name, shape and type; norms stored as w + 1 for Gemma (read raw);
/// no `output.weight` where the head is tied; and the file read back through our import equal to
/// the Hugging Face weights within f16 rounding.
#[test]
fn tensors_round_trip_through_our_import_within_f16_rounding() {
    for (name, tensors, biases, qk_norms, gemma) in [
        ("tiny-qwen2", 2 + 2 * 12, true, false, false),
        ("tiny-qwen3", 3 + 2 * 11, false, true, false),
        ("tiny-gemma2", 2 + 2 * 11, false, false, true),
        ("tiny-gemma3", 2 + 2 * 13, false, true, true),
        ("tiny-nemo", 2 + 2 * 9, false, false, false),
    ] {
        let dir = folder(name, gemma_scalar_if(gemma));
        let (out, content) = export(&dir.0, FileType::F16).unwrap();
        assert_eq!(content.tensor_infos.len(), tensors, "{name}");
        let has = |t: &str| content.tensor_infos.contains_key(t);
        assert_eq!(has("output.weight"), name == "tiny-qwen3", "{name}: untied head only");
        assert_eq!(has("blk.1.attn_q.bias"), biases, "{name}");
        assert_eq!(has("blk.1.attn_k_norm.weight"), qk_norms, "{name}");
        assert_eq!(has("blk.1.post_ffw_norm.weight"), gemma, "{name}");
        for (t, info) in &content.tensor_infos {
            let want = if info.shape.rank() == 1 { GgmlDType::F32 } else { GgmlDType::F16 };
            assert_eq!(info.ggml_dtype, want, "{name} {t}");
        }
        // SAFETY: read-only maps of files this test wrote and does not change.
        let hf = unsafe { MmapedSafetensors::new(dir.0.join("model.safetensors")) }.unwrap();
        let hf_values =
            |t: &str| hf.load(t, &Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut file = std::fs::File::open(&out).unwrap();
        let raw = content.tensor(&mut file, "blk.0.attn_norm.weight", &Device::Cpu).unwrap();
        let raw = raw.dequantize(&Device::Cpu).unwrap().to_vec1::<f32>().unwrap();
        let offset = if gemma { 1.0 } else { 0.0 };
        let stored: Vec<f32> =
            hf_values("model.layers.0.input_layernorm.weight").iter().map(|w| w + offset).collect();
        assert_eq!(raw, stored, "{name}: the norm as stored (f32)");

        let imported_dir = dir.0.join("imported");
        lora_ft::gguf::import_gguf(&out, &imported_dir).unwrap();
        if gemma {
            // each layer's kind comes back (Gemma 3's through the per-layer pattern key)
            let read = |path: PathBuf| -> Json {
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
            };
            let (ours, theirs) = (read(imported_dir.join("config.json")), read(dir.0.join("config.json")));
            assert_eq!(ours["layer_types"], theirs["layer_types"], "{name}");
            assert_eq!(ours["sliding_window"], theirs["sliding_window"], "{name}");
        }
        // SAFETY: as above.
        let imported = unsafe { MmapedSafetensors::new(imported_dir.join("model.safetensors")) }.unwrap();
        let mut compared = 0;
        for (t, _) in hf.tensors() {
            let want = hf_values(&t);
            let got =
                imported.load(&t, &Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            // 1-D tensors are f32, but Gemma's norms went through w + 1 and back in f32
            let worst = (0..want.len())
                .map(|i| (got[i] - want[i]).abs() / f16_bound(want[i].abs() + offset))
                .fold(0f32, f32::max);
            assert!(worst <= 1.0, "{name} {t}: error {worst} × the f16 bound");
            compared += 1;
        }
        assert_eq!(compared, hf.tensors().len(), "{name}");
    }
}

fn gemma_scalar_if(gemma: bool) -> impl FnOnce(&mut Json) {
    move |config: &mut Json| {
        if gemma {
            gemma_scalar(config)
        }
    }
}

/// What llama.cpp would run differently from transformers is refused, naming the config key,
/// and nothing is written.
#[test]
fn what_llama_cpp_cannot_run_is_refused() {
    type Case = (&'static str, fn(&mut Json), &'static [&'static str]);
    let cases: [Case; 8] = [
        ("tiny-gemma3", |c| c["text_config"] = json!({ "hidden_size": 64 }), &["text_config", "gemma3_text"]),
        (
            "tiny-gemma3",
            |c| {
                gemma_scalar(c);
                c["rope_parameters"]["full_attention"] =
                    json!({ "rope_type": "yarn", "factor": 8.0, "rope_theta": 1e6 });
            },
            &["\"yarn\"", "linear for gemma3"],
        ),
        ("tiny-qwen3", |c| c["use_sliding_window"] = json!(true), &["use_sliding_window", "qwen3"]),
        ("tiny-gemma2", |_| {}, &["query_pre_attn_scalar", "24", "1/sqrt(16)"]),
        (
            "tiny-gemma2",
            |c| {
                gemma_scalar(c);
                c["rope_theta"] = json!(20000.0);
            },
            &["rope_theta", "10000"],
        ),
        (
            "tiny-gemma2",
            |c| {
                gemma_scalar(c);
                c["layer_types"] = json!(["full_attention", "sliding_attention"]);
            },
            &["layer_types", "[0]", "full_attention"],
        ),
        (
            "tiny-gemma3",
            |c| {
                gemma_scalar(c);
                c["attn_logit_softcapping"] = json!(50.0);
            },
            &["attn_logit_softcapping"],
        ),
        (
            "tiny-qwen2",
            |c| {
                c["rope_scaling"] = json!({ "rope_type": "yarn", "factor": 4.0 });
            },
            &["\"yarn\"", "linear"],
        ),
    ];
    for (name, edit, words) in cases {
        let dir = folder(name, edit);
        let err = export(&dir.0, FileType::F16).unwrap_err();
        assert!(words.iter().all(|w| err.contains(w)), "{name}: {err}");
        assert!(!dir.0.join("out.gguf").exists() && !dir.0.join("out.gguf.partial").exists());
    }
    // Gemma 2 computes its logits with the embedding matrix: an untied head cannot be written
    let dir = folder("tiny-gemma2", |c| {
        gemma_scalar(c);
        c["tie_word_embeddings"] = json!(false);
    });
    let weights = candle_core::safetensors::load(dir.0.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut weights: std::collections::HashMap<_, _> = weights.into_iter().collect();
    let head = weights["model.embed_tokens.weight"].affine(0.5, 0.0).unwrap();
    weights.insert("lm_head.weight".to_string(), head);
    candle_core::safetensors::save(&weights, dir.0.join("model.safetensors")).unwrap();
    let err = export(&dir.0, FileType::F16).unwrap_err();
    assert!(err.contains("tie_word_embeddings") && err.contains("output.weight"), "{err}");
    // Mistral 7B v0.1's window (here 5 < 128 positions) is dropped, as llama.cpp's converter
    // drops it, with a warning: the rows it was trained on fit the window
    let dir = folder("tiny-mistral", |_| {});
    export(&dir.0, FileType::F16).expect("exported without the window");
    assert!(dir.0.join("out.gguf").exists());
}

/// `--adapter-only` on Qwen 2: the architecture is `qwen2`, A and B under llama.cpp's names,
/// exactly the adapter's (no row permutation outside the llama graph).
#[test]
fn adapter_only_for_qwen2_keeps_hugging_faces_row_order() {
    let dir = folder("tiny-qwen2", |_| {});
    let adapter = fixture("tiny-qwen2").join("adapter");
    let out = dir.0.join("lora.gguf");
    let summary =
        lora_ft::merge::export_adapter_gguf(dir.0.to_str().unwrap(), "main", &adapter, &out, None).unwrap();
    assert_eq!(summary.tensors, 2 * 7 * 2, "{summary:?}");
    let mut file = std::fs::File::open(&out).unwrap();
    let content = Content::read(&mut file).unwrap();
    assert_eq!(content.metadata["general.architecture"].to_string().unwrap(), "qwen2");
    assert_eq!(content.metadata["adapter.lora.alpha"].to_f32().unwrap(), 8.0);
    let weights =
        candle_core::safetensors::load(adapter.join("adapter_model.safetensors"), &Device::Cpu).unwrap();
    for (module, gguf) in
        [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("mlp.up_proj", "ffn_up")]
    {
        for (half, hf_half) in [("lora_a", "lora_A"), ("lora_b", "lora_B")] {
            let want = &weights[&format!("base_model.model.model.layers.1.{module}.{hf_half}.weight")];
            let got =
                content.tensor(&mut file, &format!("blk.1.{gguf}.weight.{half}"), &Device::Cpu).unwrap();
            let got = got.dequantize(&Device::Cpu).unwrap();
            assert_eq!(got.dims(), want.dims(), "{module} {half}");
            let (got, want) = (got.flatten_all().unwrap(), want.flatten_all().unwrap());
            assert_eq!(got.to_vec1::<f32>().unwrap(), want.to_vec1::<f32>().unwrap(), "{module} {half}");
        }
    }
}
