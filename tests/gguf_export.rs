//! `lora-ft export-gguf`: q8_0, f16 and bf16 blocks byte for byte as gguf-py quantizes them
//! (tests/golden/gguf_quants.json from scripts/golden/gguf_quants.py); the SmolLM2 demo model
//! with a random adapter merged, exported and read back — its keys, tokenizer and tensor names
//! against the llama.cpp-made GGUF it came from, its weights through our own `import` against
//! the merged model within f16's and q8_0's rounding; and bad input refused with nothing left.

mod common;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use common::Scratch;
use lora_ft::gguf::export::FileType;
use lora_ft::gguf::format::quants::quantize;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn q8_0_f16_and_bf16_blocks_equal_gguf_py_byte_for_byte() {
    let text = std::fs::read_to_string("tests/golden/gguf_quants.json")
        .expect("tests/golden/gguf_quants.json: run scripts/golden/gguf_quants.py");
    let golden: Json = serde_json::from_str(&text).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 9, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let values: Vec<f32> =
            case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        for (key, dtype) in [("q8_0", GgmlDType::Q8_0), ("f16", GgmlDType::F16), ("bf16", GgmlDType::BF16)] {
            let ours = hex(&quantize(&values, dtype).unwrap());
            assert_eq!(ours, case[key].as_str().unwrap(), "{name} as {key}");
        }
    }
}

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("gguf-export-{name}"))
}

/// A PEFT adapter for SmolLM2's q, k and down projections of every layer, random A and B.
fn random_adapter(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8.0,
        "target_modules": ["q_proj", "k_proj", "down_proj"], "bias": "none",
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let mut tensors = HashMap::new();
    for layer in 0..30 {
        for (module, out, inp) in
            [("self_attn.q_proj", 576, 576), ("self_attn.k_proj", 192, 576), ("mlp.down_proj", 576, 1536)]
        {
            let key = format!("base_model.model.model.layers.{layer}.{module}");
            let a = Tensor::randn(0f32, 0.05, (4, inp), &Device::Cpu).unwrap();
            let b = Tensor::randn(0f32, 0.05, (out, 4), &Device::Cpu).unwrap();
            tensors.insert(format!("{key}.lora_A.weight"), a);
            tensors.insert(format!("{key}.lora_B.weight"), b);
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors")).unwrap();
}

fn header(path: &Path) -> Content {
    Content::read(&mut std::fs::File::open(path).unwrap()).unwrap()
}

/// The metadata keys an export writes agree with llama.cpp's own file of the same model (but
/// `tokenizer.ggml.pre`: the imported tokenizer.json has GPT-2's split, not SmolLM's digits).
fn check_header(ours: &Content, original: &Content, file_type: FileType) {
    let meta = &ours.metadata;
    assert_eq!(meta["general.architecture"].to_string().unwrap(), "llama");
    assert_eq!(meta["general.file_type"].to_u32().unwrap(), file_type.id());
    assert_eq!(meta["tokenizer.ggml.model"].to_string().unwrap(), "gpt2");
    assert_eq!(meta["tokenizer.ggml.pre"].to_string().unwrap(), "gpt-2");
    let same = |key: &str| format!("{:?}", ours.metadata[key]) == format!("{:?}", original.metadata[key]);
    for key in [
        "llama.block_count",
        "llama.context_length",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.vocab_size",
        "llama.rope.dimension_count",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.chat_template",
        "general.quantization_version",
    ] {
        assert!(
            meta.contains_key(key) && same(key),
            "{key}: ours {:?}",
            meta.get(key).map(Value::value_type)
        );
    }
    let mut names: Vec<_> = ours.tensor_infos.keys().collect();
    let mut theirs: Vec<_> = original.tensor_infos.keys().collect();
    names.sort();
    theirs.sort();
    assert_eq!(names, theirs);
    for (name, info) in &ours.tensor_infos {
        assert_eq!(info.shape, original.tensor_infos[name].shape, "{name}");
        let want = if info.shape.rank() == 1 { GgmlDType::F32 } else { file_type.weight_type() };
        assert_eq!(info.ggml_dtype, want, "{name}");
    }
}

/// The largest |imported − merged| allowed per element. f16: half an ulp, 2^-11 relative (and
/// half the smallest subnormal); bf16: 2^-8 relative. q8_0 per block of 32 along a row: x/d rounded to an integer q is
/// off by at most 0.5·d (d = absmax/127 in f32), and d stored as f16 moves each of |q| ≤ 127
/// steps by up to 2^-11·d: 0.5·d + 127·2^-11·d, with 1e-5 relative slack for f32 arithmetic.
fn bound(merged: &[f32], file_type: FileType) -> Vec<f32> {
    match file_type {
        FileType::F32 => vec![0.0; merged.len()],
        FileType::F16 => merged.iter().map(|x| x.abs() * 2f32.powi(-11) + 2f32.powi(-25)).collect(),
        FileType::BF16 => merged.iter().map(|x| x.abs() * 2f32.powi(-8)).collect(),
        FileType::Q8_0 => merged
            .chunks(32)
            .flat_map(|block| {
                let d = block.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                let bound = d * (0.5 + 127.0 * 2f32.powi(-11)) * (1.0 + 1e-5) + 2f32.powi(-25);
                std::iter::repeat_n(bound, block.len())
            })
            .collect(),
        FileType::Q4KM => unreachable!("q4_k_m is checked against llama.cpp's bytes (tests/gguf_q4km.rs)"),
    }
}

#[test]
fn smollm2_with_an_adapter_round_trips_through_gguf() {
    let model = lora_ft::fixtures::smollm2_dir();
    let original = header(&lora_ft::fixtures::smollm2_gguf());
    let root = scratch("round-trip");
    let adapter = root.0.join("adapter");
    random_adapter(&adapter);
    let merged_dir = root.0.join("merged");
    lora_ft::merge::merge(model.to_str().unwrap(), "main", &adapter, &merged_dir, DType::F32).unwrap();
    // SAFETY: read-only maps of files this test wrote and does not change.
    let merged = unsafe { MmapedSafetensors::new(merged_dir.join("model.safetensors")) }.unwrap();

    for file_type in [FileType::F16, FileType::BF16, FileType::Q8_0] {
        let out = root.0.join(format!("smollm2-{file_type:?}.gguf"));
        let summary =
            lora_ft::merge::export_gguf(model.to_str().unwrap(), "main", Some(&adapter), &out, file_type)
                .unwrap();
        assert_eq!((summary.tensors, summary.merged_projections), (272, 90), "{summary:?}");
        assert_eq!(summary.bytes, std::fs::metadata(&out).unwrap().len());
        check_header(&header(&out), &original, file_type);

        let imported_dir = root.0.join(format!("imported-{file_type:?}"));
        lora_ft::gguf::import_gguf(&out, &imported_dir).unwrap();
        // SAFETY: as above.
        let imported = unsafe { MmapedSafetensors::new(imported_dir.join("model.safetensors")) }.unwrap();
        let mut names = 0;
        for (name, _) in merged.tensors() {
            let want =
                merged.load(&name, &Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let got =
                imported.load(&name, &Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let bounds = bound(&want, file_type);
            let worst = (0..want.len()).map(|i| (got[i] - want[i]).abs() / bounds[i]).fold(0f32, f32::max);
            assert!(worst <= 1.0, "{file_type:?} {name}: error {worst} × the bound");
            names += 1;
        }
        assert_eq!(names, 272);
    }
}

/// The demo folder is llama.cpp's Q4_1 file dequantized by our import, so its base exported as
/// f16 is that file's every tensor, rows in llama.cpp's order, to f16 rounding: the names, the
/// Q/K permutation and the layout checked against a file llama.cpp's converter wrote.
#[test]
fn the_base_exported_as_f16_is_llama_cpps_own_file_to_f16_rounding() {
    let original_path = lora_ft::fixtures::smollm2_gguf();
    let root = scratch("base");
    let out = root.0.join("base.gguf");
    let model = lora_ft::fixtures::smollm2_dir();
    let summary =
        lora_ft::merge::export_gguf(model.to_str().unwrap(), "main", None, &out, FileType::F16).unwrap();
    assert_eq!(summary.merged_projections, 0);
    let read_all = |path: &Path| {
        let mut file = std::fs::File::open(path).unwrap();
        let content = Content::read(&mut file).unwrap();
        let mut tensors = HashMap::new();
        for name in content.tensor_infos.keys() {
            let q = content.tensor(&mut file, name, &Device::Cpu).unwrap();
            let values = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            tensors.insert(name.clone(), values);
        }
        tensors
    };
    let (ours, theirs) = (read_all(&out), read_all(&original_path));
    assert_eq!(ours.len(), 272);
    for (name, want) in &theirs {
        let got = &ours[name];
        let bounds = bound(want, FileType::F16);
        let worst = (0..want.len()).map(|i| (got[i] - want[i]).abs() / bounds[i]).fold(0f32, f32::max);
        assert!(worst <= 1.0, "{name}: error {worst} × the f16 bound");
    }
}

#[test]
fn bad_input_is_refused_and_leaves_no_gguf_behind() {
    let model = lora_ft::fixtures::smollm2_dir();
    let root = scratch("bad-input");
    let export = |adapter: Option<&Path>, out: &Path| {
        lora_ft::merge::export_gguf(model.to_str().unwrap(), "main", adapter, out, FileType::F16)
            .map_err(|e| format!("{e:#}"))
    };
    // an output path in a missing folder
    let missing = root.0.join("no-such-folder").join("m.gguf");
    let err = export(None, &missing).unwrap_err();
    assert!(err.contains("no-such-folder") && err.contains("does not exist"), "{err}");
    // the tiny Llama fixture's adapter (hidden size 64) on SmolLM2 (576)
    let tiny_adapter = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama/adapter");
    let out = root.0.join("m.gguf");
    let err = export(Some(&tiny_adapter), &out).unwrap_err();
    assert!(err.contains("does not fit") && err.contains("another model's adapter"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&root.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // an unknown --type, through the library and the command line
    let err = FileType::parse("q4_0").unwrap_err().to_string();
    assert!(err.contains("\"q4_0\"") && err.contains("q8_0 or q4_k_m"), "{err}");
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(["export-gguf", "--model", model.to_str().unwrap(), "--type", "q4_0"])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert!(!cli.status.success() && stderr.contains("q4_0") && stderr.contains("q4_k_m"), "{stderr}");
    assert!(!out.exists());
}

/// `--adapter-only`: a llama.cpp LoRA file of the adapter alone. Its keys are the ones
/// llama.cpp's adapter loader reads (`general.type = adapter`, `adapter.type = lora`,
/// `adapter.lora.alpha` = scale · r, as llama.cpp scales by alpha / r); every adapted weight has
/// `lora_a` = A exactly and `lora_b` = B, f32, B's rows for Q and K in llama.cpp's order — within
/// each head, row 2j + k is the checkpoint's row k·d/2 + j (convert_hf_to_gguf's `permute`),
/// written out here rather than taken from the exporter. (scripts/gguf_llamacpp_check.py
/// `--lora-gguf` runs such a file in llama.cpp over the base's GGUF: README, GGUF export.)
#[test]
fn adapter_only_holds_a_and_b_as_llama_cpp_reads_them() {
    let model = lora_ft::fixtures::smollm2_dir();
    let root = scratch("adapter-only");
    let adapter = root.0.join("adapter");
    random_adapter(&adapter);
    let out = root.0.join("lora.gguf");
    let summary =
        lora_ft::merge::export_adapter_gguf(model.to_str().unwrap(), "main", &adapter, &out, None).unwrap();
    assert_eq!(summary.tensors, 180, "{summary:?}");
    let mut file = std::fs::File::open(&out).unwrap();
    let content = Content::read(&mut file).unwrap();
    let meta = &content.metadata;
    assert_eq!(meta["general.type"].to_string().unwrap(), "adapter");
    assert_eq!(meta["adapter.type"].to_string().unwrap(), "lora");
    assert_eq!(meta["general.architecture"].to_string().unwrap(), "llama");
    assert_eq!(meta["adapter.lora.alpha"].to_f32().unwrap(), 8.0, "scale 8/4 times r 4");
    let weights =
        candle_core::safetensors::load(adapter.join("adapter_model.safetensors"), &Device::Cpu).unwrap();
    let values = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for layer in [0, 17, 29] {
        for (module, gguf, heads) in [
            ("self_attn.q_proj", "attn_q", 9),
            ("self_attn.k_proj", "attn_k", 3),
            ("mlp.down_proj", "ffn_down", 0),
        ] {
            let key = format!("base_model.model.model.layers.{layer}.{module}");
            let (a, b) = (
                values(&weights[&format!("{key}.lora_A.weight")]),
                values(&weights[&format!("{key}.lora_B.weight")]),
            );
            let mut read = |half: &str| {
                let t = content
                    .tensor(&mut file, &format!("blk.{layer}.{gguf}.weight.{half}"), &Device::Cpu)
                    .unwrap();
                assert_eq!(t.dtype(), GgmlDType::F32, "{key} {half}");
                values(&t.dequantize(&Device::Cpu).unwrap())
            };
            assert_eq!(read("lora_a"), a, "{key}: lora_a is A");
            let rank = 4;
            let rows = b.len() / rank;
            let want: Vec<f32> = match heads {
                0 => b.clone(),
                heads => {
                    let d = rows / heads;
                    (0..rows)
                        .flat_map(|row| {
                            let (h, r) = (row / d, row % d);
                            let source = h * d + (r % 2) * (d / 2) + r / 2;
                            b[source * rank..(source + 1) * rank].to_vec()
                        })
                        .collect()
                }
            };
            assert_eq!(read("lora_b"), want, "{key}: lora_b is B in llama.cpp's row order");
        }
    }
}

/// export-gguf writes OUT.Modelfile beside OUT.gguf: FROM the file, Ollama's ChatML template for
/// SmolLM2's, its default system prompt, its end-of-turn token as the stop; --adapter-only: FROM
/// the base (--base-gguf, absolute) or a placeholder with a warning, and ADAPTER the file.
#[test]
fn ollama_modelfiles_are_written_beside_the_gguf() {
    let model = lora_ft::fixtures::smollm2_dir();
    let root = scratch("modelfile");
    let out = root.0.join("smol.gguf");
    let summary =
        lora_ft::merge::export_gguf(model.to_str().unwrap(), "main", None, &out, FileType::F16).unwrap();
    assert_eq!(summary.modelfile, root.0.join("smol.Modelfile"));
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    let text = std::fs::read_to_string(&summary.modelfile).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines[0], "FROM ./smol.gguf");
    assert!(
        text.contains("TEMPLATE \"\"\"{{- if .Messages }}\n{{- if .System }}<|im_start|>system\n"),
        "{text}"
    );
    assert!(text.contains(
        "\nSYSTEM \"\"\"You are a helpful AI assistant named SmolLM, trained by Hugging Face\"\"\"\n"
    ));
    assert_eq!(text.matches("PARAMETER stop").count(), 1);
    assert!(text.ends_with("PARAMETER stop \"<|im_end|>\"\n"), "{text}");

    let adapter = root.0.join("adapter");
    random_adapter(&adapter);
    let lora = root.0.join("lora.gguf");
    let model = model.to_str().unwrap();
    let summary = lora_ft::merge::export_adapter_gguf(model, "main", &adapter, &lora, None).unwrap();
    let text = std::fs::read_to_string(&summary.modelfile).unwrap();
    assert!(text.contains("\n# FROM: replace ./BASE.gguf by the base model's GGUF"), "{text}");
    assert!(text.contains("\nFROM ./BASE.gguf\nADAPTER ./lora.gguf\n"), "{text}");
    assert!(summary.warnings[0].contains("--base-gguf"), "{:?}", summary.warnings);
    let summary = lora_ft::merge::export_adapter_gguf(model, "main", &adapter, &lora, Some(&out)).unwrap();
    let text = std::fs::read_to_string(&summary.modelfile).unwrap();
    let base = std::fs::canonicalize(&out).unwrap();
    assert!(text.contains(&format!("\nFROM {}\nADAPTER ./lora.gguf\n", base.display())), "{text}");
    assert!(summary.warnings.is_empty());
    let missing = root.0.join("missing.gguf");
    let err =
        lora_ft::merge::export_adapter_gguf(model, "main", &adapter, &lora, Some(&missing)).unwrap_err();
    assert!(format!("{err:#}").contains("no such file"), "{err:#}");
}
