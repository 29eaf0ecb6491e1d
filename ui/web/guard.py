"""What a request meets before Gradio's own routes: a check of the site that sent it, of who may upload, and of its size.

Gradio's session cookie is SameSite=None, and its CORS layer hands any other site the right to
read replies with the cookie whenever the app is not served on localhost. So without these, a
page on any site that a signed-in operator opens could add an account, or export the votes and
read them back.
"""

import asyncio
import json
import sys
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.owner.server import Refused, Server

READ_ONLY_METHODS = {"GET", "HEAD", "OPTIONS"}
UPLOAD_PATH = "/gradio_api/upload"
SESSION_COOKIE = "access-token"  # the start of the names of Gradio's session cookies


class SameOrigin:
    """Refuse any change sent from a page on another site, and let no other site read a reply.

    A browser names the page's site in `Origin` on every cross-site POST (and in `Sec-Fetch-Site`);
    a change is accepted when that is the site the app is served at (the Host the browser asked
    for, whatever the scheme) or one of [server] trusted_origins. Requests with neither header come
    from programs, not from a page (gradio_client, httpx, curl), and pass. The CORS headers that
    Gradio adds are taken off replies to every other site, so a browser hides those replies from it.

    It must wrap Gradio's CORS layer, which launch() installs outermost; `launch` puts it around the app.
    """

    def __init__(self, app: ASGIApp, trusted_origins: Iterable[str]):
        self.app = app
        self.trusted = {origin.lower() for origin in trusted_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self._same_site(headers):
            await self.app(scope, receive, send)
            return
        origin = headers.get("origin") or f"a page on another site (Sec-Fetch-Site: {headers.get('sec-fetch-site')})"
        if scope["method"] not in READ_ONLY_METHODS:
            client = scope["client"][0] if scope.get("client") else "unknown"
            print(f"refused {scope['method']} {scope['path']} from {client}: sent by {origin}, not by the app's own page "
                  f"at {headers.get('host')}", file=sys.stderr, flush=True)
            refusal = PlainTextResponse(f"Refused: this request was sent by {origin}, not by Tether's own page. If that "
                                        "is your own address for Tether, add it to [server] trusted_origins.", status_code=403)
            await refusal(scope, receive, send)
            return

        async def without_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name in [n for n in headers.keys() if n.startswith("access-control-")]:
                    del headers[name]
            await send(message)

        await self.app(scope, receive, without_cors)

    def _same_site(self, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is not None and origin.lower() in self.trusted:
            return True
        if headers.get("sec-fetch-site") == "cross-site":
            return False
        return origin is None or urlsplit(origin).netloc.lower() == headers.get("host", "").lower()


class OperatorUploads:
    """Only operators may upload files (prompt and preference imports are theirs): an annotator's upload is refused.

    Gradio accepts an upload from any signed-in session before any of Tether's handlers runs, so
    the check is here, on the session's account.
    """

    def __init__(self, app: ASGIApp, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") == UPLOAD_PATH:
            try:
                await asyncio.to_thread(self.server.operator, self._account(Request(scope)))
            except Refused as e:
                await PlainTextResponse(str(e), status_code=403)(scope, receive, send)
                return
            started = False

            async def sending(message: Message) -> None:
                nonlocal started
                started = True
                await send(message)

            try:
                await self.app(scope, receive, sending)
            except (TypeError, ValueError):  # Gradio's upload route fails on a form part with no file name
                if started:
                    raise
                await PlainTextResponse("The upload is not a file: each part needs a file name.", status_code=400)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _account(self, request: Request) -> str | None:
        sessions = (self.server.sessions.get(token) for name, token in request.cookies.items() if name.startswith(SESSION_COOKIE))
        return next((account for account in sessions if account is not None), None)


class BodyLimit:
    """ASGI middleware that refuses a request whose body is over `limit` bytes (413), but for Gradio's
    upload route, which has its own limit (max_file_size). The body is read before the app sees it,
    which costs nothing at this size, so a body sent in chunks with no Content-Length is held to it too.
    A JSON body must be JSON (RFC 8259) too (400): Python reads NaN and Infinity, which Gradio's answer
    to a body it refuses cannot write back, and fails with a traceback."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].rstrip("/") == UPLOAD_PATH:
            return await self.app(scope, receive, send)
        declared = int(dict(scope["headers"]).get(b"content-length", 0))  # uvicorn has checked it is a number
        body, more = b"", declared <= self.limit
        while more and len(body) <= self.limit:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if max(declared, len(body)) > self.limit:
            await PlainTextResponse(f"The request is over [server] max_request_kb ({self.limit // 1024} KiB).", status_code=413)(
                scope, receive, send)
            return
        if body and Headers(scope=scope).get("content-type", "").startswith("application/json") and (problem := _not_json(body)):
            await PlainTextResponse(f"The request's body is not JSON: {problem}.", status_code=400)(scope, receive, send)
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: what comes next, a disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _not_json(body: bytes) -> str | None:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is no JSON number")

    try:
        json.loads(body, parse_constant=refuse)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return " ".join(str(e).split())[:200]
    return None
