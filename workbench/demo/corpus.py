"""The demo model's corpus: generated, seeded, and checkable.

Two task families, each line a prompt followed by the answer the model must produce:

* ``copy``   -- a random sequence of distinct words, a bar, the same words again::

      lamp river coin tree | lamp river coin tree .

  Half the copy prompts end at the bar; the other half give a cue, a word of the
  sequence after the bar, and the answer continues from it
  (``lamp river coin tree | river`` -> `` coin tree .``), so the task can only be solved
  by matching content -- attend to where the current word occurred before and copy the
  word after it -- not by counting positions.

  Solved by an induction circuit (a previous-token head, then an induction head that
  attends to the token *after* the earlier occurrence of the current token).

* ``recall`` -- a list of who has what, then one name asked again::

      mia red kite . tom blue cup . anna green hat . tom blue cup .

  The prompt ends at the name (``... . tom``); the answer is `` blue cup .``.  Names,
  colours and objects are each distinct within a list, so the answer is fixed by the
  list and only by it: an in-context key-value lookup, solved by the same induction
  circuit as the copy task, over a longer distance (beyond the 16-token sliding window,
  so only the full-attention layer can reach it).  (An earlier, more grammatical version,
  ``tom has a blue cup . ... tom has a`` -> `` blue cup``, needs a three-token match; a
  model this size trained for minutes stayed at chance on it.)

Held-out sets come from a different seed than the training set, and every held-out
example is a sequence of words the model has (with overwhelming probability) never seen,
so exact-match accuracy measures the algorithm, not memorisation.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

COLORS = ("red", "blue", "green", "yellow", "black", "white", "pink", "brown", "gray", "orange", "purple", "gold")
OBJECTS = ("ball", "cup", "hat", "box", "book", "key", "lamp", "coin", "shoe", "kite", "bell", "drum",
           "fish", "boat", "cake", "sock")
NAMES = ("anna", "tom", "ben", "mia", "lily", "sam", "max", "zoe", "leo", "ivy", "ella", "noah", "ruby", "jack",
         "emma", "finn")
#: the pool the copy task draws from (distinct from the story words on purpose: the copy
#: task then cannot be solved by story statistics)
WORDS = ("apple", "river", "stone", "cloud", "tree", "bird", "moon", "sun", "star", "rain", "snow", "wind",
         "fire", "sand", "leaf", "rock", "milk", "bread", "door", "road", "hill", "lake", "sea", "farm",
         "town", "king", "queen", "horse", "mouse", "frog", "bear", "wolf", "duck", "goat", "sheep", "cow",
         "pig", "dog", "cat", "fox", "owl", "bee", "ant", "egg", "corn", "rice", "salt", "tea",
         "ship", "car", "bus", "train", "bike", "chair", "table", "bed", "clock", "pen", "paper", "glass",
         "ring", "coat", "shirt", "bag")

TASKS = ("copy", "recall")
COPY_MIN, COPY_MAX = 3, 10
RECALL_MIN, RECALL_MAX = 2, 5


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str  # what the model is given (no BOS; the tokenizer adds it)
    answer: str  # the exact continuation expected, starting with a space, ending in " ."

    @property
    def text(self) -> str:
        return self.prompt + self.answer


def copy_example(rng: random.Random, n: int | None = None) -> Example:
    n = n or rng.randint(COPY_MIN, COPY_MAX)
    words = rng.sample(WORDS, n)
    seq = " ".join(words)
    k = rng.randrange(n - 1) if rng.random() < 0.5 else None  # cue: continue after words[k]
    if k is None:
        return Example("copy", f"{seq} |", f" {seq} .")
    return Example("copy", f"{seq} | {words[k]}", " " + " ".join(words[k + 1:]) + " .")


def recall_example(rng: random.Random, n: int | None = None) -> Example:
    n = n or rng.randint(RECALL_MIN, RECALL_MAX)
    facts = list(zip(rng.sample(NAMES, n), rng.sample(COLORS, n), rng.sample(OBJECTS, n)))
    story = " ".join(f"{a} {c} {o} ." for a, c, o in facts)
    a, c, o = rng.choice(facts)
    return Example("recall", f"{story} {a}", f" {c} {o} .")


GENERATORS = {"copy": copy_example, "recall": recall_example}


def examples(n: int, seed: int, tasks: tuple[str, ...] = TASKS) -> list[Example]:
    """``n`` examples, tasks interleaved round-robin, fully determined by ``seed``."""
    rng = random.Random(seed)
    return [GENERATORS[tasks[i % len(tasks)]](rng) for i in range(n)]


#: seeds: training text, tokenizer text, held-out eval (never overlap)
TRAIN_SEED = 1234
HELDOUT_SEED = 98765


def heldout(n_per_task: int = 100, seed: int = HELDOUT_SEED) -> list[Example]:
    """The held-out eval set: ``n_per_task`` fresh examples of each task."""
    rng = random.Random(seed)
    out = []
    for task in TASKS:
        out += [GENERATORS[task](rng) for _ in range(n_per_task)]
    return out


def tokenizer_text() -> list[str]:
    """Text the BPE tokenizer is trained on: every word in every context it appears in."""
    lines = [e.text for e in examples(4000, seed=7)]
    # make sure every word of every pool is seen often enough to become one token
    lines += [" ".join(pool) for pool in (COLORS, OBJECTS, NAMES, WORDS)] * 50
    return lines
