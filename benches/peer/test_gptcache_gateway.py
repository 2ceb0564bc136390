"""Checks of the GPTCache peer gateway that run-gptcache.sh runs before measuring: the threshold mapping, outcome labels, stream assembly.

Run with the peer venv: `target/peer-venv/bin/python -m unittest discover -s benches/peer -p 'test_*.py'`.
The model-backed test is skipped when the model is not provisioned.
"""

from __future__ import annotations

import atexit
import math
import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
from gptcache_gateway import (
    Gateway,
    Hit,
    MiniLmEmbedding,
    Miss,
    StreamAssembler,
    build_cache,
    default_models_dir,
    gptcache_threshold,
    non_stream_answer,
)


class Planted:
    """An embedding that maps each known text to a chosen unit vector, to put exact cosines in front of GPTCache."""

    dimension = 8

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.vectors = vectors

    def to_embeddings(self, data: str, **_: object) -> np.ndarray:
        return self.vectors[data]


def at_cosine(cos: float) -> np.ndarray:
    """A unit vector whose cosine with e0 is `cos`."""
    v = np.zeros(Planted.dimension, dtype=np.float32)
    v[0], v[1] = cos, math.sqrt(1.0 - cos * cos)
    return v


def body(text: str) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


class ThresholdTest(unittest.TestCase):
    def test_mapping_formula(self) -> None:
        self.assertAlmostEqual(gptcache_threshold(0.90), 0.95)
        self.assertAlmostEqual(gptcache_threshold(1.0), 1.0)
        with self.assertRaises(ValueError):
            gptcache_threshold(0.0)

    def test_gptcache_accepts_exactly_the_neighbours_at_or_above_the_cosine(self) -> None:
        vectors = {"stored": at_cosine(1.0), "near": at_cosine(0.905), "far": at_cosine(0.895)}
        tmp = tempfile.mkdtemp(prefix="gptcache-test.")
        # Removed at exit, after GPTCache's own exit handler (registered later, run earlier) closes its files.
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        gateway = Gateway(build_cache(Planted(vectors), Path(tmp), 0.90), "http://unused/v1", None)  # type: ignore[arg-type]
        first, label = gateway.lookup(body("stored"))
        self.assertIsInstance(first, Miss)
        self.assertEqual(label, "miss")
        assert isinstance(first, Miss) and first.save is not None
        first.save("the answer")

        again, label = gateway.lookup(body("stored"))
        self.assertIsInstance(again, Hit)
        self.assertEqual(label, "hit")
        near, label = gateway.lookup(body("near"))
        self.assertIsInstance(near, Hit)
        self.assertEqual(label, "semantic-hit")
        assert isinstance(near, Hit)
        self.assertEqual(near.answer, "the answer")
        far, label = gateway.lookup(body("far"))
        self.assertIsInstance(far, Miss)
        self.assertEqual(label, "miss")


class AnswerTest(unittest.TestCase):
    def test_stream_is_stored_only_after_a_clean_end(self) -> None:
        events = (
            b'data: {"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"delta":{"content":"lo"},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
        )
        whole = StreamAssembler()
        # Fed in awkward pieces: lines split across network reads must still be whole when parsed.
        for i in range(0, len(events), 7):
            whole.feed(events[i : i + 7])
        self.assertIsNone(whole.answer(), "no [DONE] yet")
        whole.feed(b"data: [DONE]\n\n")
        self.assertEqual(whole.answer(), "Hello")

        cut = StreamAssembler()
        cut.feed(events.replace(b'"stop"', b'"length"') + b"data: [DONE]\n\n")
        self.assertIsNone(cut.answer())
        failed = StreamAssembler()
        failed.feed(events + b'data: {"error":{"message":"boom"}}\n\ndata: [DONE]\n\n')
        self.assertIsNone(failed.answer())

    def test_non_stream_answer(self) -> None:
        ok = b'{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'
        self.assertEqual(non_stream_answer(ok), "hi")
        self.assertIsNone(non_stream_answer(ok.replace(b'"stop"', b'"length"')))
        self.assertIsNone(non_stream_answer(b"not json"))


class ModelTest(unittest.TestCase):
    def test_minilm_vectors_are_unit_length_and_rank_paraphrases_close(self) -> None:
        model_dir = default_models_dir() / "all-MiniLM-L6-v2"
        if not (model_dir / "model.onnx").is_file():
            self.skipTest(f"no model at {model_dir}")
        model = MiniLmEmbedding(model_dir, intra_threads=1)
        a = model.to_embeddings("How do I reset my password?")
        b = model.to_embeddings("How can I reset my password?")
        c = model.to_embeddings("What is the tallest mountain in the world?")
        self.assertEqual(a.shape, (384,))
        self.assertAlmostEqual(float(np.linalg.norm(a)), 1.0, places=5)
        self.assertGreater(float(a @ b), 0.9)
        self.assertLess(float(a @ c), 0.5)


if __name__ == "__main__":
    unittest.main()
