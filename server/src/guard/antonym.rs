//! The `antonym` guard's knowledge: WordNet 3.0's antonym pairs and the irregular forms of their
//! words, compiled into the binary from `server/assets/wordnet-antonyms.txt`.
//!
//! The table is made by `scripts/wordnet-antonyms.py` from Debian's `wordnet-base` (a lexical database
//! written by lexicographers, not a list typed to match examples): every antonym pointer between two
//! one-word lemmas ("open"/"closed", "include"/"exclude", "allow"/"deny"), spread to the other words
//! of the two senses it joins ("decline" and "reject" of "refuse") and to adjective satellites
//! (WordNet's indirect antonyms: "compulsory" of "obligatory" against "optional"), less any pair that
//! shares a sense somewhere (synonyms there); plus the negative prefixes
//! English uses productively on adjectives and adverbs ("safe"/"unsafe", "legal"/"illegal") and the
//! reversing un-/dis- of verbs ("connect"/"disconnect"). CI regenerates it and fails on any difference.
//! This module only answers "are these two words opposites?"; where they must stand is the guard's rule.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

const TABLE: &str = include_str!("../../assets/wordnet-antonyms.txt");

/// Light verbs, quantifiers and answer words that WordNet pairs but whose opposition carries little
/// of a question's meaning: "take a look" and "have a look" ask the same, "some" and "all" tips are
/// the same request, and "yes"/"no" are the negation guard's business. Their pairs are left out.
const LIGHT: &[&str] = &[
    "have", "do", "make", "get", "give", "take", "come", "go", "all", "some", "no", "yes", "any",
    "none",
];

struct Table {
    opposites: HashMap<&'static str, Vec<&'static str>>,
    /// Irregular forms of the table's words: "worse" → "bad", "began" → "begin".
    lemmas: HashMap<&'static str, &'static str>,
    words: HashSet<&'static str>,
}

static ANTONYMS: LazyLock<Table> = LazyLock::new(|| {
    let mut table = Table {
        opposites: HashMap::new(),
        lemmas: HashMap::new(),
        words: HashSet::new(),
    };
    for line in TABLE.lines() {
        let mut fields = line.split(' ');
        match (fields.next(), fields.next(), fields.next()) {
            (Some("="), Some(a), Some(b)) if !LIGHT.contains(&a) && !LIGHT.contains(&b) => {
                table.opposites.entry(a).or_default().push(b);
                table.opposites.entry(b).or_default().push(a);
                table.words.extend([a, b]);
            }
            (Some("~"), Some(form), Some(lemma)) => {
                table.lemmas.insert(form, lemma);
            }
            _ => {}
        }
    }
    table
});

/// Builds the table now rather than on first use.
pub(super) fn load() {
    LazyLock::force(&ANTONYMS);
}

/// Regular inflections, undone the way WordNet's own `morphy` does: a suffix replaced by an ending,
/// each tried in turn; only candidates that are words of the table are kept.
const SUFFIXES: &[(&str, &str)] = &[
    ("s", ""),
    ("ies", "y"),
    ("es", "e"),
    ("es", ""),
    ("ed", "e"),
    ("ed", ""),
    ("ing", "e"),
    ("ing", ""),
    ("er", ""),
    ("er", "e"),
    ("est", ""),
    ("est", "e"),
    ("ier", "y"),
    ("iest", "y"),
    ("ied", "y"),
    ("ly", ""),
    // morphy's irregular plural that no exception list holds: "women" → "woman".
    ("men", "man"),
];

/// The table's words that `word` can be a form of: itself, its irregular lemma, its regular stems
/// (with a doubled final consonant undone: "stopped" → "stop").
fn lemmas(word: &str) -> Vec<&'static str> {
    let table = &*ANTONYMS;
    let mut found = Vec::new();
    let mut keep = |candidate: &str| {
        if let Some(w) = table.words.get(candidate) {
            if !found.contains(w) {
                found.push(*w);
            }
        }
    };
    keep(word);
    if let Some(lemma) = table.lemmas.get(word) {
        keep(lemma);
    }
    for &(suffix, ending) in SUFFIXES {
        let Some(stem) = word.strip_suffix(suffix) else {
            continue;
        };
        if stem.len() < 2 {
            continue;
        }
        keep(&format!("{stem}{ending}"));
        let bytes = stem.as_bytes();
        if ending.is_empty() && bytes.len() >= 3 && bytes[bytes.len() - 1] == bytes[bytes.len() - 2]
        {
            keep(&stem[..stem.len() - 1]);
        }
    }
    found
}

/// Negative prefixes that English still forms new words with ("unmute", "non-refundable"), so
/// their words are missing from a 2006 dictionary; the older in-/dis- forms are in the table.
const LIVE_PREFIXES: &[&str] = &["un", "non-", "non"];

/// A stem this short is no word of its own: "unit" is not "un" + "it".
const MIN_STEM: usize = 4;

/// `word` is `stem` with a live negative prefix.
fn negated_form(word: &str, stem: &str) -> bool {
    stem.len() >= MIN_STEM
        && LIVE_PREFIXES
            .iter()
            .any(|p| word.strip_prefix(p) == Some(stem))
}

/// Whether some reading of `a` is an antonym of some reading of `b` ("opened" / "shut"), or one is
/// the other with a live negative prefix ("archive" / "unarchive").
pub(super) fn opposite(a: &str, b: &str) -> bool {
    // A possessive is the word's own form: "men's" against "women's" is "men" against "women".
    let (a, b) = (
        a.strip_suffix("'s").unwrap_or(a),
        b.strip_suffix("'s").unwrap_or(b),
    );
    if a == b {
        return false;
    }
    if negated_form(a, b) || negated_form(b, a) {
        return true;
    }
    let (left, right) = (lemmas(a), lemmas(b));
    left.iter().any(|l| {
        ANTONYMS
            .opposites
            .get(l)
            .is_some_and(|opposites| right.iter().any(|r| opposites.contains(r)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wordnet_pairs_and_their_forms_are_opposites() {
        for (a, b) in [
            ("open", "closed"),
            ("include", "exclude"),
            ("includes", "excludes"),
            ("allowed", "disallowed"),
            ("safe", "unsafe"),
            ("legal", "illegal"),
            ("connect", "disconnect"),
            ("plugged", "unplugged"),
            ("cheapest", "expensive"),
            ("increase", "decreasing"),
            ("better", "worse"),
            ("buy", "sell"),
            ("bought", "sold"),
            ("import", "export"),
            ("enable", "disable"),
            ("upload", "download"),
            ("hot", "cold"),
            ("mute", "unmute"),
            ("refundable", "non-refundable"),
            ("accept", "decline"),
            ("allowed", "forbidden"),
            ("compulsory", "optional"),
        ] {
            assert!(opposite(a, b), "{a} / {b}");
            assert!(opposite(b, a), "{b} / {a}");
        }
    }

    #[test]
    fn synonyms_light_verbs_and_unrelated_words_are_not() {
        for (a, b) in [
            ("open", "open"),
            ("closed", "shut"),
            ("cheap", "inexpensive"),
            ("take", "give"),
            ("have", "lack"),
            ("all", "some"),
            ("order", "ship"),
            ("python", "java"),
            ("uncle", "cle"),
            ("it", "unit"),
            ("fast", "quick"),
        ] {
            assert!(!opposite(a, b), "{a} / {b}");
        }
    }

    #[test]
    fn the_table_is_loaded_and_large() {
        assert!(ANTONYMS.words.len() > 5000, "{}", ANTONYMS.words.len());
        assert!(ANTONYMS.lemmas.contains_key("worse"));
    }
}
