//! The `entity` guard's reading: the names a prompt is about. A question about PayPal is not one about
//! Klarna, nor is `config.toml` `Cargo.toml`, however alike the sentences around them are; a sentence
//! embedding, which averages words, moves little when one name is swapped for another.
//!
//! Names are read from how English and code write them, not from a list: a capitalized word that
//! does not start a sentence ("Bristol", "Wuthering Heights", "NASA"), a quoted string, and a code
//! identifier, path or URL (`snake_case`, `camelCase`, `os.path`, `/etc/hosts`, `https://…`).

use std::collections::BTreeSet;

/// The longest quoted string read as one name; a longer quote is a passage, not a name.
const MAX_QUOTED_CHARS: usize = 64;

/// Names in `text`, lowercased (a name typed in lower case by a hurried user is still the name),
/// possessives removed ("Mary's" is Mary).
pub(super) fn names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    quoted(text, &mut names);
    for line in text.lines() {
        // Each line starts like a sentence: a list item or a title is capitalized by rule.
        let mut sentence_start = true;
        for raw in line.split_whitespace() {
            let token = raw.trim_matches(|c: char| {
                !(c.is_alphanumeric() || matches!(c, '_' | '/' | '.' | ':' | '-' | '\'' | '~'))
            });
            let token = token.trim_end_matches(['.', ':', '\'']);
            if !token.chars().any(char::is_alphanumeric) {
                continue; // a list marker or a dash: the next word still starts the sentence
            }
            if is_code(token) {
                names.insert(token.to_lowercase());
            } else if !sentence_start && is_capitalized(token) {
                let word = token
                    .strip_suffix("'s")
                    .or_else(|| token.strip_suffix("\u{2019}s"))
                    .unwrap_or(token)
                    .to_lowercase();
                // Weekdays and months are capitalized too, and are the numbers guard's business.
                if super::date_word(&word).is_none() {
                    names.insert(word);
                }
            }
            // A sentence ends at its final punctuation; the next word is capitalized by rule.
            sentence_start = raw
                .trim_end_matches(['"', '\'', ')'])
                .ends_with(['.', '?', '!', ':', ';']);
        }
    }
    names
}

/// A word written with a capital that is not grammar: not "I" and its contractions, and with at
/// least one letter (a capital in "A4" or "3D" is part of a number, the numbers guard's business).
fn is_capitalized(word: &str) -> bool {
    let mut chars = word.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    if !first.is_uppercase() || word.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let bare = word.split('\'').next().unwrap_or(word);
    bare != "I" && bare.chars().all(|c| c.is_alphabetic() || c == '-')
}

/// An identifier, path or URL: joined by `_`, `::`, `/` or an inner `.`, or camelCase.
fn is_code(token: &str) -> bool {
    if token.len() < 3 || !token.chars().any(char::is_alphabetic) {
        return false;
    }
    let inner_dot = token
        .char_indices()
        .any(|(i, c)| c == '.' && i > 0 && i + 1 < token.len());
    let camel = token
        .chars()
        .zip(token.chars().skip(1))
        .any(|(a, b)| a.is_lowercase() && b.is_uppercase());
    token.contains('_')
        || token.contains("::")
        || token.contains("://")
        || token
            .split('/')
            .filter(|p| p.chars().any(char::is_alphabetic))
            .count()
            >= 2
        || (inner_dot && !token.chars().all(|c| c.is_ascii_digit() || c == '.'))
        || camel
}

/// Strings between matching quotes or backticks, at most [`MAX_QUOTED_CHARS`] long.
fn quoted(text: &str, names: &mut BTreeSet<String>) {
    for (open, close) in [('"', '"'), ('`', '`'), ('\u{201C}', '\u{201D}')] {
        let mut rest = text;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len_utf8()..];
            let Some(end) = after.find(close) else {
                break;
            };
            let inner = after[..end].trim();
            if !inner.is_empty() && inner.chars().count() <= MAX_QUOTED_CHARS {
                names.insert(
                    inner
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                        .to_lowercase(),
                );
            }
            rest = &after[end + close.len_utf8()..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_are_capitalized_words_quotes_and_code() {
        assert_eq!(names("Can I pay with PayPal?"), set(&["paypal"]));
        assert_eq!(
            names("Who wrote Wuthering Heights?"),
            set(&["wuthering", "heights"])
        );
        assert_eq!(names("What's Mary's phone number?"), set(&["mary"]));
        assert_eq!(
            names("Is NASA funded by Congress?"),
            set(&["nasa", "congress"])
        );
        assert_eq!(
            names("What does \"serendipity\" mean?"),
            set(&["serendipity"])
        );
        assert_eq!(
            names("Why does os.path.join fail on /etc/hosts?"),
            set(&["os.path.join", "/etc/hosts"])
        );
        assert_eq!(
            names("Rename user_id to userId"),
            set(&["user_id", "userid"])
        );
        assert_eq!(
            names("Fetch https://example.org/a.json please"),
            set(&["https://example.org/a.json"])
        );
    }

    #[test]
    fn grammar_capitals_and_numbers_are_not_names() {
        assert!(names("How do I reset my password?").is_empty());
        assert!(names("I think I'm lost. Where is the exit? Help!").is_empty());
        assert!(names("Is 3.5 bigger than 3.11?").is_empty());
        assert!(names("Print it on A4 paper").is_empty());
        assert!(names("Hello.\nCan you help?").is_empty());
        assert!(names("- Milk\n- Eggs").is_empty());
    }
}
