#!/usr/bin/env python3
"""Turns WordNet 3.0 (Debian's wordnet-base) into the antonym table the `antonym` guard reads.

Writes, sorted, one line per entry:
  `= a b`     a and b are antonyms: a WordNet antonym pointer (`!`) between the one-word lemmas of two
              senses, an adjective satellite and its head's antonym (WordNet's indirect antonyms), or a
              negative prefix (un-, in-/im-/il-/ir-, dis-, non-) on an adjective or adverb lemma whose
              stem is itself a lemma of the same part of speech ("safe"/"unsafe"), or un-/dis- on a verb
              ("install"/"uninstall", "connect"/"disconnect"), which reverses the action;
  `~ form lemma`  an irregular inflection from WordNet's exception lists, kept only for lemmas in a pair
              ("worse" -> "bad"); regular ones are undone by the guard's suffix rules.
Usage: wordnet-antonyms.py [WORDNET_DIR] > server/assets/wordnet-antonyms.txt
"""
import re
import sys

DIR = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/wordnet"
FILES = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
WORD = re.compile(r"^[a-z]+(-[a-z]+)?$")


def lemma(raw):
    # Adjective markers such as "(a)" and "(p)" follow the word in data.adj.
    return raw.split("(")[0].lower()


def read(name):
    """Synsets of one data file: offset -> words, the antonym pointers found there, and each adjective
    satellite's head (its `&` similar-to pointer)."""
    words, pointers, similar, hyponyms = {}, [], {}, {}
    with open(f"{DIR}/data.{name}", encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue  # the license header
            fields = line.split(" | ")[0].split()
            offset, count = fields[0], int(fields[3], 16)
            words[offset] = [lemma(fields[4 + 2 * i]) for i in range(count)]
            i = 4 + 2 * count
            for _ in range(int(fields[i])):
                symbol, target, pos, source_target = fields[i + 1 : i + 5]
                i += 4
                if symbol == "!":
                    pointers.append((offset, int(source_target[:2], 16), FILES[pos], target, int(source_target[2:], 16)))
                elif symbol == "&" and fields[2] == "s":
                    similar.setdefault(target, []).append(offset)
                elif symbol == "~" and FILES[pos] == name:
                    hyponyms.setdefault(offset, []).append(target)
    return words, pointers, similar, hyponyms


synsets, pointers, satellites, kinds = {}, [], {}, {}
for name in ("noun", "verb", "adj", "adv"):
    words, found, similar, hyponyms = read(name)
    synsets[name] = words
    kinds[name] = hyponyms
    pointers += [(name, *p) for p in found]
    if name == "adj":
        satellites = similar


def add(pairs, left, right):
    for a in left:
        for b in right:
            if WORD.match(a) and WORD.match(b) and a != b:
                pairs.add(tuple(sorted((a, b))))


# A pointer joins two words, in two senses; the opposition holds for every word of those senses
# ("refuse" -> "accept" also makes "decline" and "reject" opposites of "accept"). For adjectives,
# WordNet's indirect antonyms: a satellite of a head ("compulsory" of "obligatory") opposes the
# head's antonym ("optional").
pairs = set()
for name, offset, source, target_file, target, target_word in pointers:
    left, right = synsets[name][offset], synsets[target_file][target]
    add(pairs, left, right)
    # A kind of one sense opposes the other sense too: "ban" is a way to "forbid", so it opposes
    # "allow" (verb troponyms and noun hyponyms, one level down).
    if name == target_file and name in ("verb", "noun"):
        for kind in kinds[name].get(offset, []):
            add(pairs, synsets[name][kind], right)
        for kind in kinds[name].get(target, []):
            add(pairs, left, synsets[name][kind])
    if name == "adj" and target_file == "adj":
        for satellite in satellites.get(offset, []):
            add(pairs, synsets["adj"][satellite], right)
        for satellite in satellites.get(target, []):
            add(pairs, left, synsets["adj"][satellite])

lemmas = {name: {w for ws in synsets[name].values() for w in ws if WORD.match(w)} for name in synsets}
PREFIXES = {"adj": ("un", "in", "im", "il", "ir", "dis", "non", "non-"), "adv": ("un", "in", "im", "il", "ir", "dis", "non", "non-"), "verb": ("un", "dis")}
for name, prefixes in PREFIXES.items():
    for word in lemmas[name]:
        for prefix in prefixes:
            stem = word[len(prefix):]
            # Short stems ("in" + "n") are not words a reader would split off.
            if word.startswith(prefix) and len(stem) >= 4 and stem in lemmas[name]:
                pairs.add(tuple(sorted((stem, word))))

# Two words that share a sense somewhere are synonyms there ("fast": quick, and fixed firmly), and a
# reader may mean that sense: such a pair is no evidence of opposition.
together = set()
for name in synsets:
    for members in synsets[name].values():
        one_word = sorted(w for w in set(members) if WORD.match(w))
        together.update((a, b) for i, a in enumerate(one_word) for b in one_word[i + 1 :])
pairs -= together

vocabulary = {w for pair in pairs for w in pair}
inflections = set()
for name in ("noun", "verb", "adj", "adv"):
    with open(f"{DIR}/{name}.exc", encoding="latin-1") as f:
        for line in f:
            form, *bases = line.split()
            for base in bases:
                if base in vocabulary and WORD.match(form) and form != base:
                    inflections.add((form, base))

print("# Antonyms from WordNet 3.0 (Princeton University; license in README), made by scripts/wordnet-antonyms.py.")
for a, b in sorted(pairs):
    print(f"= {a} {b}")
for form, base in sorted(inflections):
    print(f"~ {form} {base}")
