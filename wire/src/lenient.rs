//! [`Lenient`]: a spelled value (an outcome, a completion) as a reader that may face a newer
//! gateway decodes it. A known spelling becomes the value; any other string is kept as it was
//! sent, so a decode never fails on a word added after the reader was built. Only readers use
//! it: the gateway writes the exhaustive enums themselves.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A known value, or the string a newer (or foreign) sender used instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lenient<T> {
    Known(T),
    Unknown(String),
}

impl<T> Lenient<T> {
    /// The value, when the reader knows its spelling.
    pub fn known(&self) -> Option<&T> {
        match self {
            Self::Known(t) => Some(t),
            Self::Unknown(_) => None,
        }
    }
}

impl<T: PartialEq> Lenient<T> {
    /// Whether this is `value` (never true of an unknown spelling).
    pub fn is(&self, value: &T) -> bool {
        self.known() == Some(value)
    }
}

impl<T> From<T> for Lenient<T> {
    fn from(t: T) -> Self {
        Self::Known(t)
    }
}

impl<T: FromStr> FromStr for Lenient<T> {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(s.parse()
            .map_or_else(|_| Self::Unknown(s.to_owned()), Self::Known))
    }
}

impl<T: fmt::Display> fmt::Display for Lenient<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Known(t) => t.fmt(f),
            Self::Unknown(s) => f.write_str(s),
        }
    }
}

/// Compares the spelling, so `record.cache == "hit"` reads as it did when outcomes were strings.
impl<T: fmt::Display> PartialEq<str> for Lenient<T> {
    fn eq(&self, other: &str) -> bool {
        match self {
            Self::Known(t) => t.to_string() == other,
            Self::Unknown(s) => s == other,
        }
    }
}

impl<T: fmt::Display> PartialEq<&str> for Lenient<T> {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

/// Written back as the spelling it was read from.
impl<T: Serialize> Serialize for Lenient<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Known(t) => t.serialize(serializer),
            Self::Unknown(s) => serializer.serialize_str(s),
        }
    }
}

/// A `null`, or a field left out of a struct (serde reads a missing field through
/// `deserialize_option`), is an unknown value with an empty spelling.
impl<'de, T: FromStr> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spelled = Option::<String>::deserialize(deserializer)?.unwrap_or_default();
        Ok(match spelled.parse() {
            Ok(t) => Self::Known(t),
            Err(_) => Self::Unknown(spelled),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CacheOutcome;

    #[test]
    fn unknown_spellings_are_kept() {
        let known: Lenient<CacheOutcome> = serde_json::from_str("\"semantic-hit\"").expect("json");
        assert_eq!(known, Lenient::Known(CacheOutcome::SemanticHit));
        assert!(known.is(&CacheOutcome::SemanticHit));
        let newer: Lenient<CacheOutcome> = serde_json::from_str("\"prefetched\"").expect("json");
        assert_eq!(newer, Lenient::Unknown("prefetched".to_owned()));
        assert_eq!(newer.to_string(), "prefetched");
        assert_eq!(newer.known(), None);
        assert!(newer == "prefetched" && known == "semantic-hit" && known != "hit");
        assert_eq!(
            serde_json::to_string(&newer).expect("json"),
            "\"prefetched\""
        );
        assert_eq!(
            serde_json::to_string(&known).expect("json"),
            "\"semantic-hit\""
        );
    }
}
