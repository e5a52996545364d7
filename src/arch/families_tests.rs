//! The family declarations (arch/families/) read from config.json.

use super::{by_class, by_gguf_name, by_model_type, FAMILIES};
use crate::arch::config::ModelConfig;
use crate::arch::description::{Activation, Architecture, RopeScaling, RopeSpec};

fn config(json: serde_json::Value) -> ModelConfig {
    serde_json::from_value(json).unwrap()
}

fn base() -> serde_json::Value {
    serde_json::json!({"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8})
}

/// The family decides the window, not the sizes: the same config as Llama has none, as
/// Mistral the window on every layer.
#[test]
fn mistral_is_llama_with_a_window_on_every_layer() {
    let mut json = base();
    json["sliding_window"] = 4096.into();
    let llama = Architecture::from_config(&config(json.clone())).unwrap();
    assert_eq!(llama.windows, vec![None; 4]);
    json["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    let mistral = Architecture::from_config(&config(json)).unwrap();
    assert_eq!(mistral.windows, vec![Some(4096); 4]);
    assert_eq!((mistral.head_dim, mistral.num_kv_heads), (128, 8));
    assert_eq!(mistral.query_scale, 1.0 / 128f64.sqrt());
    assert_eq!((llama.family, mistral.family), ("LlamaForCausalLM", "MistralForCausalLM"));
    assert_eq!(Architecture { windows: llama.windows.clone(), family: llama.family, ..mistral }, llama);
}

/// An explicit head_dim (Mistral Nemo: 5120 hidden, 32 heads of 128) is read, not derived.
#[test]
fn an_explicit_head_dim_is_kept() {
    let mut json = base();
    json["hidden_size"] = 5120.into();
    json["head_dim"] = 128.into();
    json["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    let a = Architecture::from_config(&config(json)).unwrap();
    assert_eq!(a.head_dim, 128);
    assert_ne!(a.head_dim * a.num_heads, a.hidden_size);
}

/// Llama 3.1's rope_scaling is read into its typed form, in both spellings transformers
/// writes; a feature the layers do not compute yet is refused in `check_supported`, by name.
#[test]
fn rope_scaling_is_typed_and_unsupported_features_are_refused_in_one_place() {
    let mut json = base();
    json["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let c = config(json.clone());
    let want = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 8192,
    };
    assert_eq!(Architecture::from_config(&c).unwrap().rope.scaling, want);
    json.as_object_mut().unwrap().remove("rope_scaling");
    json["rope_parameters"] = serde_json::json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5});
    let a = Architecture::llama(&config(json.clone())).unwrap();
    assert_eq!(
        a.rope,
        RopeSpec { theta: 5e5, scaling: RopeScaling::Linear { factor: 2.0 }, max_positions: 4096 }
    );
    json["hidden_act"] = "gelu_new".into();
    let err = format!("{:#}", Architecture::from_config(&config(json)).unwrap_err());
    assert!(err.contains("hidden_act") && err.contains("gelu_new"), "{err}");
}

/// YaRN's attention factor: given, DeepSeek's mscale ratio, or left to the default.
#[test]
fn yarn_reads_its_attention_factor() {
    let yarn = |extra: serde_json::Value| {
        let mut json = base();
        let mut p = serde_json::json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        p.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        json["rope_scaling"] = p;
        match Architecture::from_config(&config(json)).unwrap().rope.scaling {
            RopeScaling::Yarn { attention_factor, original_max_position, .. } => {
                assert_eq!(original_max_position, 32768);
                attention_factor
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(yarn(serde_json::json!({})), None);
    assert_eq!(yarn(serde_json::json!({"attention_factor": 1.5})), Some(1.5));
    let ratio = yarn(serde_json::json!({"mscale": 1.0, "mscale_all_dim": 0.5})).unwrap();
    assert!((ratio - (0.1 * 4f64.ln() + 1.0) / (0.05 * 4f64.ln() + 1.0)).abs() < 1e-15);
}

/// Qwen2's window: off unless `use_sliding_window`, then on the layers from
/// `max_window_layers` on; its q/k/v always biased.
#[test]
fn qwen2_has_biases_and_its_own_window_rule() {
    let mut json = base();
    json["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    json["sliding_window"] = 32768.into();
    json["max_window_layers"] = 2.into();
    let a = Architecture::from_config(&config(json.clone())).unwrap();
    assert!(a.qkv_bias);
    assert_eq!(a.windows, vec![None; 4]);
    json["use_sliding_window"] = true.into();
    let a = Architecture::from_config(&config(json)).unwrap();
    assert_eq!(a.windows, vec![None, None, Some(32768), Some(32768)]);
}

/// Gemma 2 as transformers writes it (and as the Hub's config.json leaves the tie out):
/// every Gemma difference on, windows on the even layers.
#[test]
fn gemma2_reads_every_difference() {
    let mut json = base();
    json["architectures"] = serde_json::json!(["Gemma2ForCausalLM"]);
    json["hidden_size"] = 3584.into();
    json["head_dim"] = 256.into();
    json["hidden_act"] = "gelu_pytorch_tanh".into();
    json["hidden_activation"] = "gelu_pytorch_tanh".into();
    json["query_pre_attn_scalar"] = 256.into();
    json["attn_logit_softcapping"] = 50.0.into();
    json["final_logit_softcapping"] = 30.0.into();
    json["sliding_window"] = 4096.into();
    let a = Architecture::from_config(&config(json)).unwrap();
    assert_eq!(a.activation, Activation::GeluTanh);
    assert_eq!((a.norm_weight_offset, a.post_sublayer_norms, a.qk_norm), (1.0, true, false));
    assert_eq!(a.embedding_scale, Some(3584f64.sqrt()));
    assert_eq!((a.attention_softcap, a.final_logit_softcap), (Some(50.0), Some(30.0)));
    assert_eq!(a.query_scale, 1.0 / 16.0);
    assert!(a.tied_embeddings, "Gemma ties when the key is absent");
    assert_eq!(a.windows, vec![Some(4096), None, Some(4096), None]);
    assert_eq!(a.local_rope, None);
}

/// Gemma 3 in both spellings: transformers ≥ 5's `rope_parameters` per layer kind, and the
/// Hub's `rope_local_base_freq` + `rope_scaling` (applied to the global layers only) with
/// `sliding_window_pattern`; each layer gets its RoPE by its kind.
#[test]
fn gemma3_gives_local_and_global_layers_their_own_rope() {
    let mut json = base();
    json["num_hidden_layers"] = 7.into();
    json["architectures"] = serde_json::json!(["Gemma3ForCausalLM"]);
    json["head_dim"] = 256.into();
    json["hidden_activation"] = "gelu_pytorch_tanh".into();
    json["sliding_window"] = 512.into();
    json["query_pre_attn_scalar"] = 256.into();
    let mut v5 = json.clone();
    v5["rope_parameters"] = serde_json::json!({
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}});
    json["rope_theta"] = 1e6.into();
    json["rope_local_base_freq"] = 1e4.into();
    json["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 8.0});
    json["sliding_window_pattern"] = 6.into();
    for json in [json, v5] {
        let a = Architecture::from_config(&config(json)).unwrap();
        assert!(a.qk_norm && a.post_sublayer_norms);
        assert_eq!((a.attention_softcap, a.final_logit_softcap), (None, None));
        let local = [0, 1, 2, 3, 4, 6];
        assert_eq!(a.windows, (0..7).map(|l| local.contains(&l).then_some(512)).collect::<Vec<_>>());
        assert_eq!((a.rope_of(5).theta, &a.rope_of(5).scaling), (1e6, &RopeScaling::Linear { factor: 8.0 }));
        assert_eq!((a.rope_of(0).theta, &a.rope_of(0).scaling), (1e4, &RopeScaling::None));
    }
}

#[test]
fn unknown_families_and_missing_keys_are_named() {
    let mut json = base();
    json["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
    let err = format!("{:#}", Architecture::from_config(&config(json)).unwrap_err());
    assert!(err.contains("GPT2LMHeadModel") && err.contains("MistralForCausalLM"), "{err}");
    let mut json = base();
    json["rope_scaling"] = serde_json::json!({"type": "yarn"});
    let err = format!("{:#}", Architecture::from_config(&config(json)).unwrap_err());
    assert!(err.contains("rope_scaling.factor"), "{err}");
    let mut json = base();
    json["hidden_act"] = "relu".into();
    let err = format!("{:#}", Architecture::from_config(&config(json)).unwrap_err());
    assert!(err.contains("hidden_act") && err.contains("relu"), "{err}");
}

/// Refusals name what was refused and what is read instead: an architecture with every supported
/// one, a RoPE type with its key (either spelling) and the types read, an activation with its key.
#[test]
fn refusals_name_the_key_the_value_and_what_is_supported() {
    let mut json = base();
    json["architectures"] = serde_json::json!(["Phi3ForCausalLM"]);
    let err = format!("{:#}", Architecture::from_config(&config(json)).unwrap_err());
    assert!(err.contains("Phi3ForCausalLM"), "{err}");
    for f in FAMILIES {
        assert!(err.contains(f.class), "{err} lists {}", f.class);
    }
    for key in ["rope_scaling", "rope_parameters"] {
        let mut json = base();
        json[key] = serde_json::json!({"rope_type": "longrope", "factor": 2.0});
        let err = format!("{:#}", Architecture::from_config(&config(json)).unwrap_err());
        assert!(err.contains(&format!("{key}.rope_type")) && err.contains("longrope"), "{err}");
        assert!(err.contains("llama3") && err.contains("yarn"), "{err}");
    }
    let mut json = base();
    json["architectures"] = serde_json::json!(["Gemma2ForCausalLM"]);
    json["hidden_activation"] = "relu".into();
    let err = format!("{:#}", Architecture::from_config(&config(json)).unwrap_err());
    assert!(err.contains("hidden_activation") && err.contains("relu"), "{err}");
}

/// Each declaration is found by each of its names, and no two declarations share one; Mistral's
/// files written as "llama" are Mistral's by their `general.name`.
#[test]
fn each_family_is_found_by_its_names() {
    for f in FAMILIES {
        assert_eq!(by_class(f.class).unwrap().class, f.class);
        for t in f.model_types {
            assert_eq!(by_model_type(t).unwrap().class, f.class, "{t}");
        }
        assert_eq!(by_gguf_name(f.gguf.name, "").unwrap().class, f.class, "{}", f.gguf.name);
    }
    let mistral = by_gguf_name("llama", "mistral 7b instruct v0.3").unwrap();
    assert_eq!(mistral.class, "MistralForCausalLM");
    assert_eq!(by_gguf_name("llama", "llama 3.2 1b").unwrap().class, "LlamaForCausalLM");
    assert!(by_gguf_name("phi3", "").is_none() && by_model_type("gemma").is_none());
}
