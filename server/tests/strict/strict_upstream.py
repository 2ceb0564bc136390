"""A strict third-party OpenAI-style upstream on aiohttp, for putting the gateway in front of a real,
RFC 9110-minded HTTP implementation rather than only reprise-sim.

aiohttp's own parser rejects malformed requests (a duplicate `Content-Type` is a 400 "Duplicate
'Content-Type' header found"); on top of that every request is checked for what a proxy must never
forward: hop-by-hop headers, headers named in `Connection`, the gateway's `x-reprise-*` controls,
and any credential but the upstream key. A request that breaks a rule gets a 400 naming it and is
logged in `GET /_strict/violations`, so a test can fail on it. It is not a model.

Run: python strict_upstream.py --port PORT --api-key KEY [--client-secret TEXT ...]
"""

import argparse
import asyncio
import hashlib
import json
import time

from aiohttp import web

HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "upgrade",
}
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango").split()


def words_for(prompt: str, n: int = 8) -> list[str]:
    digest = hashlib.blake2b(prompt.encode(), digest_size=32).digest()
    return [(" " if i else "") + WORDS[b % len(WORDS)] for i, b in enumerate(digest[:n])]


def violations_of(request: web.Request, api_key: str, client_secrets: list[str]) -> list[str]:
    found = []
    names = [name.lower() for name in request.headers.keys()]
    for name in names:
        if name in HOP_BY_HOP:
            found.append(f"hop-by-hop header `{name}` was forwarded")
        if name.startswith("x-reprise-"):
            found.append(f"gateway control header `{name}` was forwarded")
        if name.startswith("x-hop-"):
            # The tests name every `x-hop-*` header in the client's `Connection`.
            found.append(f"header `{name}` named in the client's Connection was forwarded")
    if names.count("authorization") != 1 or request.headers.get("authorization") != f"Bearer {api_key}":
        found.append("Authorization is not exactly the upstream key")
    for name in ("api-key", "x-api-key"):
        for value in request.headers.getall(name, []):
            if value != api_key:
                found.append(f"`{name}` is not the upstream key")
    for name, value in request.headers.items():
        for secret in client_secrets:
            if secret in value:
                found.append(f"a client credential arrived in `{name}`")
    if request.method == "POST":
        if names.count("content-type") != 1 or request.headers.get("content-type") != "application/json":
            found.append("Content-Type is not exactly one `application/json`")
    return found


def make_app(api_key: str, client_secrets: list[str]) -> web.Application:
    counts: dict[str, int] = {}
    violations: list[dict] = []

    @web.middleware
    async def strict(request: web.Request, handler):
        if request.path.startswith("/_strict/"):
            return await handler(request)
        problems = violations_of(request, api_key, client_secrets)
        if problems:
            violations.append({"path": request.path, "problems": problems})
            return error(400, "; ".join(problems))
        counts[request.path] = counts.get(request.path, 0) + 1
        return await handler(request)

    async def body_of(request: web.Request) -> dict:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            raise web.HTTPBadRequest(text=json.dumps({"error": {"message": f"bad JSON: {exc}"}}),
                                     content_type="application/json")
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text='{"error":{"message":"not an object"}}',
                                     content_type="application/json")
        return body

    async def generate(request: web.Request, chat: bool):
        body = await body_of(request)
        if chat:
            prompt = json.dumps(body.get("messages"), sort_keys=True)
        else:
            prompt = json.dumps(body.get("prompt"))
        words = words_for(prompt)
        ident = {"id": ("chatcmpl-strict" if chat else "cmpl-strict") + hashlib.md5(prompt.encode()).hexdigest()[:12],
                 "created": int(time.time()), "model": body.get("model"),
                 "object": "chat.completion.chunk" if chat else "text_completion"}
        usage = {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(words),
                 "total_tokens": len(prompt) // 4 + len(words)}
        if not body.get("stream"):
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": "".join(words)},
                          "logprobs": None, "finish_reason": "stop"}
            else:
                choice = {"index": 0, "text": "".join(words), "logprobs": None, "finish_reason": "stop"}
            return web.json_response({**ident, "object": "chat.completion" if chat else "text_completion",
                                      "choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(value) -> None:
            await response.write(f"data: {json.dumps(value)}\n\n".encode())

        if chat:
            await send({**ident, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                              "finish_reason": None}]})
        for word in words:
            await asyncio.sleep(0.002)
            delta = {"index": 0, "delta": {"content": word}, "finish_reason": None} if chat \
                else {"index": 0, "text": word, "finish_reason": None}
            await send({**ident, "choices": [delta]})
        last = {"index": 0, "delta": {}, "finish_reason": "stop"} if chat \
            else {"index": 0, "text": "", "finish_reason": "stop"}
        await send({**ident, "choices": [last]})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def chat(request):
        return await generate(request, chat=True)

    async def completions(request):
        return await generate(request, chat=False)

    async def embeddings(request):
        body = await body_of(request)
        inputs = body.get("input")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        data = []
        for index, text in enumerate(inputs):
            digest = hashlib.sha256(json.dumps(text).encode()).digest()
            data.append({"object": "embedding", "index": index,
                         "embedding": [(b - 128) / 128 for b in digest[:16]]})
        return web.json_response({"object": "list", "data": data, "model": body.get("model"),
                                  "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    async def models(_request):
        return web.json_response({"object": "list", "data": [
            {"id": "strict-model", "object": "model", "created": 1_700_000_000, "owned_by": "strict"}]})

    async def stats(_request):
        return web.json_response({"counts": counts, "violations": violations})

    def error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "invalid_request_error",
                                             "param": None, "code": "strict_upstream"}}, status=status)

    app = web.Application(middlewares=[strict])
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/_strict/stats", stats)
    app.router.add_get("/_strict/healthz", lambda _r: web.Response(text="ok"))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--client-secret", action="append", default=[])
    args = parser.parse_args()
    web.run_app(make_app(args.api_key, args.client_secret), host="127.0.0.1", port=args.port,
                print=None, access_log=None)


if __name__ == "__main__":
    main()
