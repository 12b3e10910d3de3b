"""A tiny real HTTP server standing in for `llmserve serve` in gateway unit tests (OpenAI-ish + /v2 + SSE)."""

import asyncio
import json
import sys

from aiohttp import web

VERSION = sys.argv[2] if len(sys.argv) > 2 else "1"


async def health(request):
    return web.json_response({"status": "ok"})


async def chat(request):
    body = await request.json()
    delay = float(request.headers.get("x-delay", "0"))
    if delay:
        await asyncio.sleep(delay)
    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(int(request.headers.get("x-events", "5"))):
            await resp.write(f"data: {json.dumps({'i': i, 'v': VERSION})}\n\n".encode())
            await asyncio.sleep(0.05)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    return web.json_response({"version": VERSION, "model": body.get("model")})


async def models(request):
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


async def v2(request):
    return web.json_response(
        {
            "version": VERSION,
            "path": request.path,
            "raw": request.raw_path,
            "auth": request.headers.get("Authorization"),
        }
    )


app = web.Application()
app.router.add_get("/health", health)
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/v1/models", models)
app.router.add_route("*", "/v2/{tail:.*}", v2)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
