"""An OpenAI-compatible gateway with GPTCache as its cache, the peer Reprise is benchmarked against; not for production use.

It speaks `POST /v1/chat/completions` (streaming SSE and plain JSON) like Reprise does, so one
driver (`reprise-client bench`) measures both the same way, and it labels every answer with the
`x-reprise-cache: hit | semantic-hit | miss` header the driver counts outcomes by.

GPTCache is used as a library, configured the way its documentation shows (`Cache.init` with a
data manager from `manager_factory("sqlite,faiss")` and `SearchDistanceEvaluation`), and every
lookup goes through its generic `adapt()` entry point. Two things are ours:

- the embedding function handed to `Cache.init` (GPTCache's custom-embedding hook): the same
  int8 all-MiniLM-L6-v2 ONNX model and tokenizer files Reprise loads, run with onnxruntime with
  the settings Reprise uses (mean pooling over the attention mask, L2 norm, 256 tokens, one
  intra-op thread, no spinning), so both caches see the same vectors;
- the HTTP side (aiohttp), because GPTCache's own server and OpenAI adapter are written against
  the pre-1.0 `openai` package and call it synchronously inside async handlers.

Must not: copy GPTCache code, change what GPTCache decides (hit or miss is always `adapt()`'s
answer), or touch the network beyond the `--upstream` base URL.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import tomllib
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnxruntime as ort
from aiohttp import web
from gptcache import Cache, Config
from gptcache.adapter.adapter import adapt
from gptcache.manager import manager_factory
from gptcache.processor.pre import last_content
from gptcache.similarity_evaluation import SearchDistanceEvaluation
from tokenizers import Tokenizer

log = logging.getLogger("gptcache-gateway")

CACHE_HEADER = "x-reprise-cache"
MODEL_NAME = "all-MiniLM-L6-v2"

# GPTCache pops these from the keyword arguments of `adapt()` as its own controls; a client body
# must not be able to set them, so they are dropped from the request before it is passed in.
GPTCACHE_CONTROL_KEYS = (
    "cache_obj",
    "cache_context",
    "cache_skip",
    "cache_factor",
    "session",
    "search_only",
    "hit_callback",
    "require_object_store",
    "top_k",
)


def gptcache_threshold(cosine: float, max_distance: float = 4.0) -> float:
    """GPTCache's `similarity_threshold` that accepts exactly the neighbours at or above `cosine`.

    The faiss store GPTCache builds is `IDMap,Flat` with METRIC_L2, which reports the *squared*
    L2 distance d2, and GPTCache's data manager L2-normalizes every vector before storing or
    searching. For unit vectors d2 = 2 - 2*cos, so cos >= c  <=>  d2 <= 2*(1 - c).
    `SearchDistanceEvaluation(max_distance=M)` scores a neighbour as M - d2 on the range [0, M],
    and `adapt()` accepts it when that score >= M * threshold, i.e. when d2 <= M * (1 - threshold).
    Equating the two bounds gives threshold = 1 - 2*(1 - c)/M: 0.95 for Reprise's 0.90 and M = 4.
    """
    if not 0.0 < cosine <= 1.0:
        raise ValueError(f"cosine threshold must be in (0, 1], got {cosine}")
    return 1.0 - 2.0 * (1.0 - cosine) / max_distance


class MiniLmEmbedding:
    """The custom embedding GPTCache calls (`embedding_func`): text in, a 384-float vector out."""

    def __init__(self, model_dir: Path, intra_threads: int) -> None:
        spec_path = model_dir / "reprise-model.toml"
        try:
            spec = tomllib.loads(spec_path.read_text())
            self.dimension = int(spec["dimension"])
            max_length = int(spec["max_length"])
            if spec.get("pooling") != "mean" or spec.get("normalize") is not True:
                raise ValueError('this gateway implements pooling = "mean" with normalize = true only')
        except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError) as err:
            raise SystemExit(f"cannot use {spec_path}: {err} (run scripts/provision-models.sh)") from err
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        # tokenizer.json pads every text to 128 tokens and cuts at 128; Reprise (through fastembed)
        # pads a batch to its longest text and cuts at reprise-model.toml's max_length. One text at
        # a time means no padding at all.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length)
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_threads
        # The same session settings as Reprise's embedder, so neither gets a different ORT.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        probe = self.to_embeddings("warm-up")
        if probe.shape != (self.dimension,):
            raise SystemExit(f"{spec_path} says dimension = {self.dimension}, the model gives {probe.shape}")

    def to_embeddings(self, data: Any, **_: Any) -> np.ndarray:
        """GPTCache's embedding-function signature: `(data, **kwargs) -> np.ndarray`."""
        encoding = self.tokenizer.encode(str(data))
        ids = np.asarray([encoding.ids], dtype=np.int64)
        mask = np.asarray([encoding.attention_mask], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.asarray([encoding.type_ids], dtype=np.int64)
        (hidden,) = self.session.run(["last_hidden_state"], feeds)
        # Mean over real tokens (sentence-transformers' pooling for this model), then unit length.
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        vector = pooled[0]
        return (vector / max(float(np.linalg.norm(vector)), 1e-12)).astype(np.float32)


class LockedDataManager:
    """GPTCache's data manager behind one lock.

    GPTCache holds no locks of its own (its faiss index, in-memory LRU and SQLAlchemy session use
    are written for one caller at a time), while this server runs `adapt()` on a thread pool so
    that embedding, the expensive step, runs in parallel and off the event loop. Only the data
    manager's calls are serialized; everything else is delegated untouched.
    """

    LOCKED = ("search", "get_scalar_data", "hit_cache_callback", "save", "import_data", "flush", "report_cache")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self.LOCKED or not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return locked


class Miss:
    """What the `llm_handler` given to `adapt()` returns: the upstream call is made afterwards,
    asynchronously, and `save` (GPTCache's `update_cache_func`, bound to this request's question
    and embedding) stores the answer once it is complete."""

    def __init__(self) -> None:
        self.save: Callable[[str], None] | None = None


class Hit:
    """What `cache_data_convert` returns on a hit: the cached answer text."""

    def __init__(self, answer: str) -> None:
        self.answer = answer


def openai_error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.json_response(body, status=status)


class Gateway:
    def __init__(self, cache: Cache, upstream: str, executor: ThreadPoolExecutor) -> None:
        self.cache = cache
        self.upstream = upstream.rstrip("/")
        self.executor = executor
        self.client: aiohttp.ClientSession | None = None
        # Answers are stored after the client has its last byte, like Reprise's writer thread;
        # the tasks are kept so shutdown can wait for them.
        self.background: set[asyncio.Task[None]] = set()

    def lookup(self, body: dict[str, Any]) -> tuple[Hit | Miss, str]:
        """Runs GPTCache's `adapt()` (on a worker thread) and says which kind of answer it gave."""
        matched: list[Any] = []
        kwargs = {k: v for k, v in body.items() if k not in GPTCACHE_CONTROL_KEYS}

        def on_hit(candidates: list[tuple[Any, float]]) -> None:
            # Accepted neighbours with their scores, best first; `adapt()` answers with the first.
            matched.extend(candidates)

        def keep_save(llm_data: Miss, update_cache_func: Callable[[str], None], *_: Any, **__: Any) -> Miss:
            llm_data.save = update_cache_func
            return llm_data

        result = adapt(
            lambda *_, **__: Miss(),
            Hit,
            keep_save,
            cache_obj=self.cache,
            hit_callback=on_hit,
            **kwargs,
        )
        if isinstance(result, Hit):
            question = last_content(body)
            exact = bool(matched) and matched[0][0] == question
            return result, "hit" if exact else "semantic-hit"
        if not isinstance(result, Miss):
            raise TypeError(f"adapt() returned {type(result).__name__}, expected a hit or a miss")
        return result, "miss"

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return openai_error(400, f"request body is not JSON: {err}", "invalid_request_error")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
            return openai_error(400, "`messages` must be a non-empty list of objects", "invalid_request_error")
        loop = asyncio.get_running_loop()
        outcome, label = await loop.run_in_executor(self.executor, self.lookup, body)
        stream = bool(body.get("stream", False))
        model = str(body.get("model", ""))
        if isinstance(outcome, Hit):
            if stream:
                return await self.replay_stream(request, outcome.answer, model, label)
            return web.json_response(completion_body(outcome.answer, model), headers={CACHE_HEADER: label})
        return await self.forward(request, body, outcome, stream)

    async def replay_stream(self, request: web.Request, answer: str, model: str, label: str) -> web.StreamResponse:
        # GPTCache stores the assembled text, not the upstream's chunks; its own OpenAI adapter
        # replays a stream as a role chunk, one content chunk and a finish chunk. So does this, in
        # one write: the bytes on the wire are the same, with one trip through the event loop.
        chunk_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        events = []
        for delta, finish in (({"role": "assistant"}, None), ({"content": answer}, None), ({}, "stop")):
            event = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            events.append(f"data: {json.dumps(event)}\n\n")
        events.append("data: [DONE]\n\n")
        response = web.StreamResponse(headers={"content-type": "text/event-stream", CACHE_HEADER: label})
        await response.prepare(request)
        await response.write("".join(events).encode())
        await response.write_eof()
        return response

    async def forward(self, request: web.Request, body: dict[str, Any], miss: Miss, stream: bool) -> web.StreamResponse:
        assert self.client is not None
        headers = {"content-type": "application/json"}
        if auth := request.headers.get("authorization"):
            headers["authorization"] = auth
        try:
            upstream = await self.client.post(f"{self.upstream}/chat/completions", json=body, headers=headers)
        except aiohttp.ClientError as err:
            log.warning("upstream unreachable: %s", err)
            return openai_error(502, "the upstream could not be reached", "upstream_error")
        async with upstream:
            if upstream.status != 200 or not stream:
                payload = await upstream.read()
                if upstream.status == 200:
                    answer = non_stream_answer(payload)
                    if answer is not None:
                        self.store(miss, answer)
                return web.Response(
                    body=payload,
                    status=upstream.status,
                    headers={
                        "content-type": upstream.headers.get("content-type", "application/json"),
                        CACHE_HEADER: "miss",
                    },
                )
            response = web.StreamResponse(headers={"content-type": "text/event-stream", CACHE_HEADER: "miss"})
            await response.prepare(request)
            assembler = StreamAssembler()
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                    assembler.feed(chunk)
            except (aiohttp.ClientError, ConnectionResetError) as err:
                # The client or the upstream went away mid-stream: nothing complete to store.
                log.info("stream ended early: %s", err)
                return response
            await response.write_eof()
        if (answer := assembler.answer()) is not None:
            self.store(miss, answer)
        return response

    def store(self, miss: Miss, answer: str) -> None:
        if miss.save is None:
            return
        save = miss.save
        task = asyncio.get_running_loop().create_task(self._store(save, answer))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _store(self, save: Callable[[str], None], answer: str) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, save, answer)
        except Exception:  # a failed store must not take the server down; it is logged once, here
            log.exception("storing an answer in GPTCache failed")

    async def on_startup(self, _: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=256)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
        self.client = aiohttp.ClientSession(connector=connector, timeout=timeout)

    async def on_cleanup(self, _: web.Application) -> None:
        if self.background:
            await asyncio.gather(*self.background, return_exceptions=True)
        if self.client is not None:
            await self.client.close()


def completion_body(answer: str, model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def non_stream_answer(payload: bytes) -> str | None:
    """The answer to store from a chat.completion body; None unless it finished with `stop`
    (Reprise, by default, does not store answers cut at max_tokens either)."""
    try:
        choice = json.loads(payload)["choices"][0]
        content = choice["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) and choice.get("finish_reason") == "stop" else None


class StreamAssembler:
    """Collects the content deltas of an SSE stream into the answer GPTCache stores."""

    def __init__(self) -> None:
        self.buffer = b""
        self.parts: list[str] = []
        self.finish: str | None = None
        self.done = False
        self.broken = False

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                event = json.loads(data)
            except ValueError:
                self.broken = True
                continue
            if "error" in event:
                self.broken = True
            for choice in event.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if isinstance(content, str):
                    self.parts.append(content)
                if choice.get("finish_reason"):
                    self.finish = choice["finish_reason"]

    def answer(self) -> str | None:
        """The whole answer after a clean end (`stop`, then [DONE]); None otherwise."""
        if self.done and not self.broken and self.finish == "stop":
            return "".join(self.parts)
        return None


def build_cache(embedding: Any, data_dir: Path, cosine: float) -> Cache:
    """GPTCache configured as its documentation shows, with `embedding` (anything with
    `dimension` and `to_embeddings`) as the custom embedding."""
    data_manager = manager_factory(
        "sqlite,faiss",
        data_dir=str(data_dir),
        # top_k 1: the nearest neighbour decides, as in Reprise.
        vector_params={"dimension": embedding.dimension, "top_k": 1},
        # GPTCache's in-memory LRU defaults to 1,000 entries; Reprise keeps 100,000.
        eviction_params={"max_size": 100_000},
    )
    cache = Cache()
    cache.init(
        pre_embedding_func=last_content,
        embedding_func=embedding.to_embeddings,
        data_manager=LockedDataManager(data_manager),
        similarity_evaluation=SearchDistanceEvaluation(max_distance=4.0),
        # disable_report: GPTCache otherwise writes a row to a sqlite report table on every hit;
        # Reprise keeps its hit statistics in memory, so leaving it on would only slow the peer.
        config=Config(similarity_threshold=gptcache_threshold(cosine, 4.0), disable_report=True),
    )
    return cache


def default_models_dir() -> Path:
    if env := os.environ.get("REPRISE_MODELS_DIR"):
        return Path(env)
    return Path(__file__).resolve().parents[2] / "models"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:8090", help="host:port to listen on")
    parser.add_argument(
        "--upstream", required=True, help="upstream base URL including /v1, e.g. http://127.0.0.1:9090/v1"
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=default_models_dir(),
        help="folder holding all-MiniLM-L6-v2/ (default: $REPRISE_MODELS_DIR, else the repository's models/)",
    )
    parser.add_argument(
        "--data-dir", type=Path, help="GPTCache's sqlite + faiss folder (default: a temp dir removed on exit)"
    )
    parser.add_argument(
        "--similarity-threshold",
        type=float,
        default=0.90,
        help="lowest cosine similarity of a semantic hit (Reprise's default: 0.90)",
    )
    parser.add_argument("--workers", type=int, default=8, help="threads running GPTCache's lookups and stores")
    parser.add_argument(
        "--intra-threads",
        type=int,
        default=1,
        help="ONNX Runtime intra-op threads per embedding (Reprise's default for this model: 1)",
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    # force: importing GPTCache already configured the root logger (WARNING, its own format).
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )

    host, _, port = args.listen.rpartition(":")
    model_dir = args.models_dir / MODEL_NAME
    if not (model_dir / "model.onnx").is_file():
        raise SystemExit(f"no model at {model_dir} (run scripts/provision-models.sh)")
    if args.data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="gptcache-gateway."))
        # Registered before Cache.init registers its own close-at-exit: exit handlers run last
        # registered first, so GPTCache flushes and closes its files before the folder goes.
        atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
    else:
        data_dir = args.data_dir
    cache = build_cache(MiniLmEmbedding(model_dir, args.intra_threads), data_dir, args.similarity_threshold)
    executor = ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="gptcache")
    gateway = Gateway(cache, args.upstream, executor)
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", gateway.chat_completions)
    app.router.add_get("/healthz", healthz)
    app.on_startup.append(gateway.on_startup)
    app.on_cleanup.append(gateway.on_cleanup)
    log.info("listening on %s, upstream %s, data in %s", args.listen, args.upstream, data_dir)
    # run_app handles SIGINT/SIGTERM: it stops accepting, runs on_cleanup (waiting for pending
    # stores) and returns; GPTCache's own exit handler then flushes the index and closes sqlite.
    web.run_app(app, host=host or "127.0.0.1", port=int(port), print=None, access_log=None)
    executor.shutdown(wait=True)


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


if __name__ == "__main__":
    main()
