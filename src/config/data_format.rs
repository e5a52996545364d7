//! `data.format`, the dataset format of the data files.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `data.format`: how a row reads as a conversation (`src/data/formats/` has the conventions).
/// A `.parquet` file is Parquet (the keys as columns, message lists as lists of structs), any
/// other JSON Lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    /// `{"messages": [{"role", "content"}, ...]}` (OpenAI / HF chat format), the default.
    Messages,
    /// `{"conversations": [{"from", "value"}, ...], "system"?}`: human → user, gpt → assistant.
    #[serde(rename = "sharegpt")]
    ShareGpt,
    /// `{"instruction", "input"?, "output", "system"?}`: user "{instruction}\n\n{input}".
    Alpaca,
    /// `{"prompt", "completion"}`: strings (user, assistant) or TRL's two message lists.
    PromptCompletion,
    /// The format whose keys the first row has.
    Auto,
}

/// The config's spelling (`"sharegpt"`), for command-line flags.
impl std::str::FromStr for DataFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        use serde::de::IntoDeserializer;
        let de: serde::de::value::StrDeserializer<serde::de::value::Error> = s.into_deserializer();
        Self::deserialize(de).map_err(|e| e.to_string())
    }
}
