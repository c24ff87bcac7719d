"""`detvisor serve --http` with the official MCP Python SDK (tests/serve.rs):
initialize and one call with the bearer token; refusals without it and with
a foreign Origin; malformed and oversized requests answered, the server
alive after them.

argv: URL TOKEN_FILE CAMPAIGN (relative to the server's root).
"""

import asyncio
import http.client
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

url, token_file, campaign = sys.argv[1:4]
token = open(token_file).read().strip()
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}}


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def post(body, headers):
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **headers,
    })
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


async def session():
    async with streamablehttp_client(url, headers={"Authorization": f"Bearer {token}"}) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            res = await s.call_tool("findings", {"campaign": campaign})
            check(not res.isError, res)
            check(res.structuredContent["findings"], res.structuredContent)
            # The server-wide budget (--budget-virtual 1s) refuses a call
            # that would replay past it, before anything runs, naming it.
            moment = f"{campaign}/findings/0001@-1s"
            refused = await s.call_tool("rewind", {"moment": moment})
            text = " ".join(c.text for c in refused.content if hasattr(c, "text"))
            check(refused.isError and "budget server_virtual_time" in text, (refused, text))
            # So is a likelihood, whose plan (its points' branches) is
            # checked against the budgets before any branch runs.
            refused = await s.call_tool("likelihood", {"finding": f"{campaign}/findings/0001",
                                                       "points": 1, "branches": 1})
            text = " ".join(c.text for c in refused.content if hasattr(c, "text"))
            check(refused.isError and "budget server_virtual_time" in text, (refused, text))
            return len(res.structuredContent["findings"])


found = asyncio.run(session())
authorized = {"Authorization": f"Bearer {token}"}
body = json.dumps(INIT).encode()
status, text = post(body, {})
check(status == 401, (status, text))
status, text = post(body, {"Authorization": "Bearer not-the-token"})
check(status == 401, (status, text))
status, text = post(body, {**authorized, "Origin": "http://evil.example"})
check(status == 403, (status, text))
status, text = post(b"{this is not json", authorized)
check(400 <= status < 500, (status, text))
def oversized():
    """The server answers 413 as soon as it sees the length, and may close
    the connection while the body is still being sent: then the answer is
    read from what it sent before closing, or the close is the refusal."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = b"[" + b" " * (8 << 20) + b"]"
    connection.putrequest("POST", parts.path)
    for name, value in {"Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream",
                        "Content-Length": str(len(body)), **authorized}.items():
        connection.putheader(name, value)
    connection.endheaders()
    try:
        connection.send(body)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        return connection.getresponse().status
    except (ConnectionResetError, http.client.RemoteDisconnected):
        return "closed before the body was read"


status = oversized()
check(status in (413, "closed before the body was read"), status)
# Alive after all of it, for the server's own Origin too.
origin = url.rsplit("/", 1)[0]
status, text = post(body, {**authorized, "Origin": origin})
check(status == 200, (status, text))


def raw(method, data, headers):
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **headers,
    })
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


# A session ends with a status MCP clients read as ended (200 or 204).
status, headers, _ = raw("POST", body, authorized)
session_id = headers.get("Mcp-Session-Id")
check(status == 200 and session_id, (status, dict(headers)))
status, _, text = raw("DELETE", None, {**authorized, "Mcp-Session-Id": session_id})
check(status in (200, 204), (status, text))
print(json.dumps({"findings": found}))
