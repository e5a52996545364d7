//! `lora-ft chat`'s sampling and stopping flags (docs/src/guides/generation.md describes them)
//! and the generation settings they make.

use clap::Args;
use lora_ft::generate::GenerationSettings;

#[derive(Args)]
pub struct SamplingArgs {
    /// 0 decodes greedily.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Nucleus sampling: draw from the smallest set of tokens whose probability reaches this.
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Seeds the sampling.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Draw from the k most likely tokens only.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Drop tokens less likely than this fraction of the most likely one.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f64,
    /// Divide positive / multiply negative logits of tokens already in the conversation (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f64,
    /// Subtract this from the logit of every token the reply already holds.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f64,
    /// Subtract this times its count in the reply from a token's logit.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f64,
    /// End the reply before this text (repeatable); the reply is printed without it.
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    /// The settings of replies of at most `max_new_tokens`; an out-of-range flag is an error
    /// naming it.
    pub fn settings(&self, max_new_tokens: usize) -> anyhow::Result<GenerationSettings> {
        let settings = GenerationSettings {
            max_new_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logprobs: None,
            stop_strings: self.stop.clone(),
        };
        settings.sampling_params().validate()?;
        Ok(settings)
    }
}
