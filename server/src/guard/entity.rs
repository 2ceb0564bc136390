//! The `entity` guard's reading: the names a prompt is about. A question about PayPal is not one about
//! Klarna, nor is `config.toml` `Cargo.toml`, however alike the sentences around them are; a sentence
//! embedding, which averages words, moves little when one name is swapped for another.
//!
//! Names are read from how English and code write them, not from a list: a capitalized word that
//! does not start a sentence ("Bristol", "Wuthering Heights", "NASA"), a quoted string, and a code
//! identifier, path or URL (`snake_case`, `camelCase`, `os.path`, `/etc/hosts`, `https://…`). A
//! word typed in lower case is a name too when WordNet knows it only as a proper noun ("paris",
//! "nebraska"). One thing under two names is one entity: names of one WordNet synset ("US" and
//! "America", "Prague" and "Praha") are read as the same, and so is a name typed with a slip of the
//! fingers ("Wimbeldon"), which a reader would not take for another place.
//!
//! The names come from `server/assets/wordnet-names.txt`, made by `scripts/wordnet-names.py` from
//! Debian's `wordnet-base` and checked by CI like the antonym table.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::LazyLock;

const TABLE: &str = include_str!("../../assets/wordnet-names.txt");

struct Names {
    /// A name → the longest name of its (first) synset, so that synonyms read as one.
    canonical: HashMap<&'static str, &'static str>,
    /// Words WordNet knows only as proper nouns.
    proper: HashSet<&'static str>,
}

static NAMES: LazyLock<Names> = LazyLock::new(|| {
    let mut names = Names {
        canonical: HashMap::new(),
        proper: HashSet::new(),
    };
    for line in TABLE.lines() {
        if let Some(synset) = line.strip_prefix("= ") {
            // The longest name stands for the synset: "nebraska" rather than "ne".
            let Some(full) = synset.split(' ').max_by_key(|w| w.len()) else {
                continue;
            };
            for word in synset.split(' ') {
                names.canonical.entry(word).or_insert(full);
            }
        } else if let Some(word) = line.strip_prefix("p ") {
            names.proper.insert(word);
        }
    }
    names
});

/// Builds the table now rather than on first use.
pub(super) fn load() {
    LazyLock::force(&NAMES);
}

/// Whether WordNet knows `word` (lowercase) only as a proper noun.
pub(super) fn is_proper(word: &str) -> bool {
    NAMES.proper.contains(word)
}

/// A name as compared: dots left out ("U.S." is "us") and read through its synset.
fn canonical(name: &str) -> String {
    let bare: String = name.chars().filter(|c| *c != '.').collect();
    match NAMES.canonical.get(bare.as_str()) {
        Some(first) => (*first).to_owned(),
        None => name.to_owned(),
    }
}

/// The entity guard's rule: each side names something the other does not, beyond a slip of the
/// fingers (one letter left out or added, or two swapped, in a name of five letters or more:
/// "Mary" against "Mark" is another person, "Wimbeldon" is Wimbledon).
pub(super) fn other_names(query: &BTreeSet<String>, candidate: &BTreeSet<String>) -> bool {
    let only = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
        a.difference(b).cloned().collect()
    };
    let (q_only, c_only) = (only(query, candidate), only(candidate, query));
    if q_only.is_empty() || c_only.is_empty() {
        return false;
    }
    let slip = |a: &str, b: &str| {
        a.len().min(b.len()) >= 5
            && (super::text::is_slip_of(a, b) || super::text::is_slip_of(b, a))
    };
    let unmatched = |mine: &[String], theirs: &[String]| {
        mine.iter().any(|m| !theirs.iter().any(|t| slip(m, t)))
    };
    unmatched(&q_only, &c_only) && unmatched(&c_only, &q_only)
}

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
            // Only a word of letters can be a proper noun of the table (four letters or more).
            let proper = token.len() >= 4
                && token.chars().all(|c| c.is_alphabetic() || c == '-')
                && is_proper(&token.to_lowercase());
            if is_code(token) || proper {
                names.insert(canonical(&token.to_lowercase()));
            } else if !sentence_start && is_capitalized(token) {
                let word = token
                    .strip_suffix("'s")
                    .or_else(|| token.strip_suffix("\u{2019}s"))
                    .unwrap_or(token)
                    .to_lowercase();
                // Weekdays and months are capitalized too, and are the numbers guard's business.
                if super::text::date_word(&word).is_none() {
                    names.insert(canonical(&word));
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
        assert_eq!(names("What's Priya's phone number?"), set(&["priya"]));
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
        // WHO is a proper noun to WordNet, but "who" typed in lower case is a question word.
        assert!(names("who is on call tonight?").is_empty());
    }

    #[test]
    fn lower_case_proper_nouns_are_names() {
        assert_eq!(names("best time to visit nebraska"), set(&["nebraska"]));
        assert_eq!(names("Paris in spring?"), set(&["paris"]));
        // Common words, even when some sense of them is a name ("turkey", "china").
        assert!(names("how long do I roast a turkey on china plates").is_empty());
    }

    #[test]
    fn one_thing_under_two_names_is_one_entity() {
        // One WordNet synset: the same country.
        assert_eq!(
            names("Is tipping expected in the US?"),
            names("Is tipping expected in America?")
        );
        assert_eq!(names("Flights to Praha"), names("Flights to Prague"));
        assert!(!other_names(
            &names("Is tipping expected in the USA?"),
            &names("Is tipping expected in America?")
        ));
        // A slip of the fingers in a long name, not in a short one.
        assert!(!other_names(
            &names("Trains to Edinburgh from here"),
            &names("Trains to Edinbrugh from here")
        ));
        assert!(other_names(
            &names("Call Mary now"),
            &names("Call Mark now")
        ));
        assert!(other_names(
            &names("Tickets for the Louvre"),
            &names("Tickets for the Prado")
        ));
    }
}
