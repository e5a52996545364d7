//! Every family lora-ft reads, one declaration a file, and finding one by what names it: its
//! Hugging Face class, its `model_type`, its GGUF `general.architecture`. Adding a family: its
//! file here, its line in `FAMILIES`.

mod gemma2;
mod gemma3;
mod llama;
mod mistral;
mod qwen2;
mod qwen3;

use super::family::Family;

/// Every family, in the order they are listed in refusals.
pub const FAMILIES: &[Family] =
    &[llama::LLAMA, mistral::MISTRAL, qwen2::QWEN2, qwen3::QWEN3, gemma2::GEMMA2, gemma3::GEMMA3];

/// The family of config.json's `architectures[0]`.
pub fn by_class(class: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.class == class)
}

/// The family of config.json's `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.model_types.contains(&model_type))
}

/// The family of a GGUF file's `general.architecture` and `general.name` (lower-cased): one that
/// claims files of another name first (Mistral's "llama" files), else the one of that name.
pub fn by_gguf_name(architecture: &str, general_name: &str) -> Option<&'static Family> {
    let claims = |f: &&Family| {
        f.gguf.also_read_from.is_some_and(|(arch, name)| arch == architecture && general_name.contains(name))
    };
    FAMILIES.iter().find(claims).or_else(|| FAMILIES.iter().find(|f| f.gguf.name == architecture))
}

/// `items` as a sentence lists them: "a, b and c".
pub fn listed(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
#[path = "families_tests.rs"]
mod tests;
