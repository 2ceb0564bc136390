//! The `direction` guard's rules: the same things in reversed roles ("USD to EUR" / "EUR to USD",
//! "merge main into dev" / "merge dev into main", "Is Rust faster than Go" / "… Go faster than Rust")
//! and a relation turned into its converse ("cancel before it ships" / "… after it ships").
//!
//! Sentence embeddings average words, so a swap of two words moves a vector hardly at all (cosine
//! 0.95–0.999 on all-MiniLM-L6-v2). English marks who does what to whom by word order around a small,
//! closed class of relational words (prepositions of path and order, comparison's "than"); a content
//! word that moves from one side of such a word to the other has changed its role. Only that is
//! refused: content words that move without crossing one, as a fronted phrase does ("In Python, how
//! do I…"), keep their roles.

use std::collections::HashMap;

/// Asymmetric relational words: the thing before plays another role than the thing after. Plain
/// coordination ("and", "or", "between") is symmetric and left out; "vs" is kept, since "A vs B"
/// asks about A measured against B.
const MARKERS: &[&str] = &[
    "to", "from", "into", "onto", "than", "before", "after", "over", "under", "above", "below",
    "toward", "towards", "by", "per", "vs", "versus",
];

/// Relations and their converses, a closed class of prepositions and adverbs of order, place and
/// path (the open-class opposites such as "buy"/"sell" come from WordNet in the antonym guard).
const CONVERSES: &[(&str, &str)] = &[
    ("before", "after"),
    ("earlier", "later"),
    ("above", "below"),
    ("over", "under"),
    ("from", "to"),
    ("from", "into"),
    ("into", "out"),
    ("in", "out"),
    ("inside", "outside"),
    ("up", "down"),
    ("since", "until"),
    ("forward", "backward"),
    ("forwards", "backwards"),
    ("ascending", "descending"),
    ("inbound", "outbound"),
    ("incoming", "outgoing"),
];

/// Closed-class words (determiners, pronouns, auxiliaries, prepositions, conjunctions, question
/// words): they carry grammar, not the things a question is about, so their moves mean nothing here.
const FUNCTION_WORDS: &[&str] = &[
    "a", "an", "the", "this", "that", "these", "those", "my", "your", "his", "her", "its", "our",
    "their", "i", "me", "you", "he", "she", "it", "we", "they", "them", "us", "him", "is", "are",
    "was", "were", "be", "been", "being", "am", "do", "does", "did", "have", "has", "had", "can",
    "could", "will", "would", "shall", "should", "may", "might", "must", "of", "in", "on", "at",
    "for", "with", "about", "as", "and", "or", "but", "if", "so", "then", "what", "which", "who",
    "whom", "whose", "when", "where", "why", "how", "there", "here", "some", "any", "all", "each",
    "every", "please", "just", "also", "very", "really", "i'm", "it's", "what's", "how's",
    "there's", "can't", "don't", "i'd", "you're", "let's", "way",
];

fn is_content(word: &str) -> bool {
    !FUNCTION_WORDS.contains(&word)
        && !MARKERS.contains(&word)
        && word.chars().any(char::is_alphanumeric)
}

/// Whether `a` and `b` are a relation and its converse.
pub(super) fn converse(a: &str, b: &str) -> bool {
    CONVERSES
        .iter()
        .any(|&(x, y)| (a == x && b == y) || (a == y && b == x))
}

/// Whether two content words trade sides of the same relational word: one moves from before it to
/// after it, another from after it to before it. Markers are matched by their occurrence (the
/// second "to" in one text against the second "to" in the other); words that occur more than once
/// on a side have no single role and are not compared.
pub(super) fn roles_swapped(query: &[String], candidate: &[String]) -> bool {
    let (q_count, c_count) = (content_counts(query), content_counts(candidate));
    // Content words that stand once in each text: their positions are comparable.
    let position = |tokens: &[String], word: &str| tokens.iter().position(|t| t == word);
    let shared: Vec<&str> = q_count
        .iter()
        .filter(|(w, n)| **n == 1 && c_count.get(**w) == Some(&1))
        .map(|(w, _)| *w)
        .collect();
    if shared.len() < 2 {
        return false;
    }
    for &marker in MARKERS {
        let q_at: Vec<usize> = occurrences(query, marker);
        let c_at: Vec<usize> = occurrences(candidate, marker);
        if q_at.is_empty() || q_at.len() != c_at.len() {
            continue;
        }
        for (&qm, &cm) in q_at.iter().zip(&c_at) {
            let (mut forward, mut backward) = (false, false);
            for word in &shared {
                let (Some(qp), Some(cp)) = (position(query, word), position(candidate, word))
                else {
                    continue;
                };
                match (qp < qm, cp < cm) {
                    (true, false) => forward = true,
                    (false, true) => backward = true,
                    _ => {}
                }
            }
            if forward && backward {
                return true;
            }
        }
    }
    false
}

fn content_counts(tokens: &[String]) -> HashMap<&str, usize> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for t in tokens.iter().filter(|t| is_content(t)) {
        *count.entry(t.as_str()).or_default() += 1;
    }
    count
}

fn occurrences(tokens: &[String], word: &str) -> Vec<usize> {
    tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| *t == word)
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Vec<String> {
        super::super::words(text)
    }

    #[test]
    fn reversed_roles_around_a_relational_word_are_swaps() {
        for (a, b) in [
            ("Convert 100 USD to EUR", "Convert 100 EUR to USD"),
            (
                "How do I merge main into dev?",
                "How do I merge dev into main?",
            ),
            ("Is Rust faster than Go?", "Is Go faster than Rust?"),
            (
                "Flights from Paris to London",
                "Flights from London to Paris",
            ),
            (
                "Divide the budget by the headcount",
                "Divide the headcount by the budget",
            ),
            ("Does Alice report to Bob?", "Does Bob report to Alice?"),
        ] {
            assert!(roles_swapped(&tokens(a), &tokens(b)), "{a} / {b}");
        }
    }

    #[test]
    fn moved_phrases_and_rewordings_keep_their_roles() {
        for (a, b) in [
            (
                "How do I convert a string to an int in Python?",
                "In Python, how do I convert a string to an int?",
            ),
            (
                "How far is it from Paris to London?",
                "How far is it to London from Paris?",
            ),
            ("Convert USD to EUR", "Convert USD to EUR please"),
            ("What is the capital of France?", "France's capital city?"),
            ("Send the file to Bob", "Send Bob the file"),
        ] {
            assert!(!roles_swapped(&tokens(a), &tokens(b)), "{a} / {b}");
        }
    }

    #[test]
    fn converses_are_closed_class_pairs() {
        assert!(converse("before", "after"));
        assert!(converse("after", "before"));
        assert!(converse("in", "out"));
        assert!(!converse("before", "prior"));
        assert!(!converse("to", "to"));
    }
}
