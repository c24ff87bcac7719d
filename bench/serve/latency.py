"""The client half of scripts/bench-serve-latency (the official MCP Python SDK).

argv: http URL TOKEN_FILE MOMENT NODE | stdio DETVISOR ROOT MOMENT NODE
"""

import asyncio
import statistics
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client


async def calls(session, moment, node):
    await session.initialize()
    started = time.monotonic()
    result = await session.call_tool("rewind", {"moment": moment})
    assert not result.isError, result.content
    print(f"rewind {moment} cold: {time.monotonic() - started:.3f} s")
    for tool, arguments in [
        ("processes", {"moment": moment, "node": node}),
        ("exec", {"moment": moment, "node": node, "command": ["cat", "/proc/1/cmdline"]}),
    ]:
        times = []
        for _ in range(3):
            started = time.monotonic()
            result = await session.call_tool(tool, arguments)
            times.append(time.monotonic() - started)
            assert not result.isError, result.content
        print(f"{tool} there, checkpoint kept: median {statistics.median(times):.3f} s "
              f"(runs: {', '.join(f'{t:.3f}' for t in times)})")


async def main():
    mode = sys.argv[1]
    if mode == "http":
        url, token_file, moment, node = sys.argv[2:6]
        token = open(token_file).read().strip()
        headers = {"Authorization": f"Bearer {token}"}
        async with streamablehttp_client(url, headers=headers, timeout=600,
                                         sse_read_timeout=600) as (r, w, _):
            async with ClientSession(r, w) as session:
                await calls(session, moment, node)
    else:
        detvisor, root, moment, node = sys.argv[2:6]
        server = StdioServerParameters(command=detvisor, args=["serve", "--root", root])
        async with stdio_client(server) as (r, w):
            async with ClientSession(r, w) as session:
                await calls(session, moment, node)


asyncio.run(main())
