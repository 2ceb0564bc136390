//! Literal guards, the check after the vector search: a semantic candidate is refused when its prompt
//! and the request's disagree on a number, a date or a negation.
//!
//! Sentence embeddings place "Who won the World Cup in 2014?" and "… in 2018?" (or "Cancel my
//! subscription" and "Don't cancel my subscription") almost on top of each other: on the public
//! fow-cache dev set, half of such traps score above 0.90. Those are the wrong answers a cache must not
//! give, and they are cheap to see in the text itself. A refused candidate costs a miss, never a wrong
//! answer, so the guards lean strict: any difference in the literals refuses.

use std::collections::BTreeSet;

/// One literal check, as named in configuration (`semantic_guards`) and in `x-reprise-guard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Guard {
    /// Numbers (digits and number words), weekdays, months and relative days must match as sets.
    Numbers,
    /// Both prompts must hold the same number of negations (not, no, never, n't, without, …).
    Negation,
}

impl Guard {
    pub const ALL: [Guard; 2] = [Guard::Numbers, Guard::Negation];

    pub fn name(self) -> &'static str {
        match self {
            Guard::Numbers => "numbers",
            Guard::Negation => "negation",
        }
    }
}

/// The guards a gateway runs: parsed from `numbers,negation`, `numbers`, `negation` or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Guards {
    numbers: bool,
    negation: bool,
}

impl Guards {
    pub const ALL: Guards = Guards {
        numbers: true,
        negation: true,
    };

    pub fn parse(s: &str) -> Option<Self> {
        let mut guards = Guards::default();
        let s = s.trim();
        if s.eq_ignore_ascii_case("none") {
            return Some(guards);
        }
        for name in s.split(',').map(str::trim) {
            match name.to_ascii_lowercase().as_str() {
                "numbers" => guards.numbers = true,
                "negation" => guards.negation = true,
                _ => return None,
            }
        }
        Some(guards)
    }

    pub fn is_empty(&self) -> bool {
        !self.numbers && !self.negation
    }

    fn runs(&self, guard: Guard) -> bool {
        match guard {
            Guard::Numbers => self.numbers,
            Guard::Negation => self.negation,
        }
    }

    /// The first guard that refuses serving `candidate`'s answer to `query`, if any.
    pub fn refuses(&self, query: &Literals, candidate: &Literals) -> Option<Guard> {
        Guard::ALL.into_iter().find(|g| {
            self.runs(*g)
                && match g {
                    Guard::Numbers => query.numbers != candidate.numbers,
                    Guard::Negation => query.negations != candidate.negations,
                }
        })
    }
}

impl std::fmt::Display for Guards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = Guard::ALL
            .into_iter()
            .filter(|g| self.runs(*g))
            .map(Guard::name)
            .collect();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

/// What the guards compare, read once per prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Literals {
    /// Normalized numbers and dates: `2014`, `1.5`, `3` (from "3pm" or "three"), `sunday`, `march`.
    numbers: BTreeSet<String>,
    negations: usize,
}

impl Literals {
    pub fn of(text: &str) -> Self {
        let mut literals = Literals::default();
        for word in words(text) {
            if word.bytes().any(|b| b.is_ascii_digit()) {
                // "3pm", "£50", "2-bedroom", "1st": the digits are the literal, the rest is its unit.
                literals.numbers.extend(digit_runs(&word));
            } else if let Some(n) = number_word(&word) {
                literals.numbers.insert(n.to_owned());
            } else if let Some(day) = date_word(&word) {
                literals.numbers.insert(day.to_owned());
            } else if is_negation(&word) {
                literals.negations += 1;
            }
        }
        literals
    }
}

/// Lowercase words: letters, digits, apostrophes, and `.`/`,` inside numbers ("1,000", "2.5").
fn words(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut words = Vec::new();
    let mut word = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let between_digits = |c: char| {
            (c == '.' || c == ',')
                && i > 0
                && chars[i - 1].is_ascii_digit()
                && chars.get(i + 1).is_some_and(|n| n.is_ascii_digit())
        };
        if c.is_alphanumeric() || c == '\'' || c == '’' || between_digits(c) {
            // Typographic apostrophes are folded, so "don’t" and "don't" are one word.
            word.extend(if c == '’' { '\'' } else { c }.to_lowercase());
        } else if !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// The numbers inside a word, thousands separators dropped: "1,000" → 1000, "3pm" → 3, "1.5" → 1.5.
fn digit_runs(word: &str) -> Vec<String> {
    let mut runs = Vec::new();
    let mut run = String::new();
    for c in word.chars() {
        match c {
            '0'..='9' => run.push(c),
            '.' if !run.is_empty() => run.push(c),
            ',' if !run.is_empty() => {}
            _ if !run.is_empty() => runs.push(std::mem::take(&mut run)),
            _ => {}
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs.into_iter()
        .map(|r| r.trim_end_matches('.').to_owned())
        .collect()
}

/// Number words as digits, so "two" and "2" agree. "one" is left out: it is mostly a pronoun
/// ("which one"), and refusing on it would turn many paraphrases into misses.
fn number_word(word: &str) -> Option<&'static str> {
    Some(match word {
        "zero" => "0",
        "two" => "2",
        "three" => "3",
        "four" => "4",
        "five" => "5",
        "six" => "6",
        "seven" => "7",
        "eight" => "8",
        "nine" => "9",
        "ten" => "10",
        "eleven" => "11",
        "twelve" => "12",
        "twenty" => "20",
        "thirty" => "30",
        "forty" => "40",
        "fifty" => "50",
        "hundred" => "100",
        "thousand" => "1000",
        "million" => "1000000",
        "billion" => "1000000000",
        _ => return None,
    })
}

const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];
/// "may" is left out: it is mostly a verb. "march" stays: as a verb it is rare in questions.
const MONTHS: [&str; 11] = [
    "january",
    "february",
    "march",
    "april",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];
const RELATIVE_DAYS: [&str; 4] = ["today", "tomorrow", "yesterday", "tonight"];

/// A weekday, month or relative day, plurals folded ("sundays" → sunday). Weekdays and long month
/// names also match with one typo ("mondys"), since users type fast; short month names would collide
/// with ordinary words ("match").
fn date_word(word: &str) -> Option<&'static str> {
    let singular = word.strip_suffix('s').unwrap_or(word);
    let exact = WEEKDAYS
        .iter()
        .chain(&MONTHS)
        .chain(&RELATIVE_DAYS)
        .find(|d| **d == word || **d == singular);
    if let Some(d) = exact {
        return Some(d);
    }
    if word.chars().count() < 5 {
        return None;
    }
    WEEKDAYS
        .iter()
        .chain(MONTHS.iter().filter(|m| m.len() >= 6))
        .find(|d| {
            strsim::damerau_levenshtein(d, word) <= 1
                || strsim::damerau_levenshtein(d, singular) <= 1
        })
        .copied()
}

fn is_negation(word: &str) -> bool {
    matches!(
        word,
        "not"
            | "no"
            | "never"
            | "none"
            | "nothing"
            | "nobody"
            | "nowhere"
            | "neither"
            | "nor"
            | "without"
            | "cannot"
            | "unable"
            // Contractions typed without the apostrophe.
            | "dont"
            | "doesnt"
            | "didnt"
            | "isnt"
            | "arent"
            | "wasnt"
            | "werent"
            | "cant"
            | "couldnt"
            | "wont"
            | "wouldnt"
            | "shouldnt"
            | "havent"
            | "hasnt"
            | "hadnt"
            | "mustnt"
    ) || word.ends_with("n't")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(a: &str, b: &str) -> Option<&'static str> {
        Guards::ALL
            .refuses(&Literals::of(a), &Literals::of(b))
            .map(Guard::name)
    }

    #[test]
    fn different_numbers_and_dates_are_refused() {
        for (a, b) in [
            (
                "Who won the World Cup in 2014?",
                "Who won the World Cup in 2018?",
            ),
            ("What's 15% of 200?", "What's 50% of 200?"),
            ("Are you open on Saturday?", "Are you open on Sunday?"),
            (
                "Is a 2-bedroom flat available?",
                "Is a 3-bedroom flat available?",
            ),
            ("Book me for 3pm tomorrow", "Book me for 3pm on Friday"),
            ("Is it 1.5 litres?", "Is it 15 litres?"),
            ("What happens in March?", "What happens in April?"),
            ("Deliver two boxes", "Deliver 3 boxes"),
            ("How old is the company?", "How old is the company in 2024?"),
        ] {
            assert_eq!(refused(a, b), Some("numbers"), "{a} / {b}");
        }
    }

    #[test]
    fn the_same_literals_in_other_words_pass() {
        for (a, b) in [
            (
                "Is the clinic open on Sundays?",
                "Can I come to the clinic on a Sunday?",
            ),
            (
                "What time do you open on Mondays?",
                "What time do you open on Mondys?",
            ),
            ("Send 2 boxes", "Please send two boxes"),
            ("Does it cost £1,000?", "Is the price 1000 pounds?"),
            ("Book for 3pm", "Book for 3 pm"),
            ("Which one should I pick?", "What should I choose?"),
            (
                "How do I reset my password?",
                "I forgot my password, what do I do?",
            ),
            ("May I pay by card?", "Can I pay by card?"),
            ("Is there a match today?", "Any match on today?"),
        ] {
            assert_eq!(refused(a, b), None, "{a} / {b}");
        }
    }

    #[test]
    fn a_negation_on_one_side_only_is_refused() {
        for (a, b) in [
            ("Cancel my subscription", "Don't cancel my subscription"),
            ("Cancel my subscription", "Don’t cancel my subscription"),
            (
                "Which plans include calls?",
                "Which plans dont include calls?",
            ),
            (
                "Can I travel with a passport?",
                "Can I travel without a passport?",
            ),
            ("What if I pay on time?", "What if I never pay on time?"),
        ] {
            assert_eq!(refused(a, b), Some("negation"), "{a} / {b}");
        }
        assert_eq!(refused("I can't log in", "I cannot log in"), None);
        assert_eq!(refused("I can't log in", "Unable to log in"), None);
    }

    #[test]
    fn guards_parse_and_display_and_can_be_turned_off() {
        assert_eq!(Guards::parse("numbers,negation"), Some(Guards::ALL));
        assert_eq!(Guards::parse(" Negation , numbers "), Some(Guards::ALL));
        assert_eq!(Guards::parse("none").map(|g| g.is_empty()), Some(true));
        assert_eq!(Guards::parse("numbers, sarcasm"), None);
        assert_eq!(Guards::parse(""), None);
        assert_eq!(Guards::ALL.to_string(), "numbers,negation");
        let numbers = Guards::parse("numbers").expect("valid");
        assert_eq!(numbers.to_string(), "numbers");
        assert_eq!(
            numbers.refuses(&Literals::of("Cancel it"), &Literals::of("Don't cancel it")),
            None
        );
        let none = Guards::default();
        assert_eq!(none.to_string(), "none");
        assert_eq!(
            none.refuses(&Literals::of("in 2014"), &Literals::of("in 2018")),
            None
        );
    }
}
