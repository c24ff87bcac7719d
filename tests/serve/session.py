"""One whole debugging session on the Raft stale-read finding, driven by the
official MCP Python SDK over stdio against `detvisor serve` (tests/serve.rs).

argv: DETVISOR ROOT CAMPAIGN PATCHED_IMAGE OLD_LEADER (paths relative to ROOT).
Prints one JSON line of figures at the end; any failed check raises.
"""

import asyncio
import json
import sys
import time

import anyio
import jsonschema
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

detvisor, root, campaign, patched, leader = sys.argv[1:6]


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def result(res, tool):
    check(not res.isError, f"{tool} failed: {res.content[0].text if res.content else res}")
    return res.structuredContent


async def main():
    params = StdioServerParameters(command=detvisor, args=["serve", "--root", root])
    figures = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            for name in ["findings", "finding", "events", "moments", "rewind", "branch",
                         "wait", "wait_until", "exec", "extract", "processes", "inspect",
                         "verify", "likelihood", "properties", "nodes"]:
                check(name in tools, f"tool {name}")
            for tool in tools.values():
                jsonschema.Draft202012Validator.check_schema(tool.inputSchema)
                jsonschema.Draft202012Validator.check_schema(tool.outputSchema)
            for name in ["findings", "events", "processes", "extract", "inspect"]:
                check(tools[name].annotations.readOnlyHint is True, f"{name} is read-only")
            check(tools["branch"].annotations.readOnlyHint is False, "branch moves")

            # The findings, and the failure moment.
            listed = result(await s.call_tool("findings", {"campaign": campaign}), "findings")
            stale = [f for f in listed["findings"] if f["key"].startswith("checker:linearizability:")]
            check(stale, f"a linearizability finding in {listed}")
            finding = stale[0]["dir"]
            about = result(await s.call_tool("finding", {"finding": finding}), "finding")
            failure = about["failure_moment"]
            check(failure == f"{finding}@failure", failure)

            # Rewind 1 s before the failure (far from boot: progress is told).
            told = []

            async def progress(done, total, message):
                told.append((done, total, message))

            start = time.monotonic()
            at = result(await s.call_tool("rewind", {"moment": failure, "by": "1s"},
                                          progress_callback=progress), "rewind")
            figures["rewind_s"] = time.monotonic() - start
            # At the first exit at or after the time asked for.
            failure_ns = about["failure"]["virtual_ns"]
            check(failure_ns - 1_000_000_000 <= at["virtual_ns"] < failure_ns, (at, failure_ns))
            check(told, "progress while replaying")
            check(at["budget"]["call"]["virtual_time"] > 0, at["budget"])
            before = f"{finding}@-1s"

            # Processes and a file in the old leader's node, in forks.
            start = time.monotonic()
            listed = result(await s.call_tool("processes", {"moment": before, "node": leader}), "processes")
            figures["processes_s"] = time.monotonic() - start
            check(listed["at"]["digest"] == at["digest"], (listed["at"], at))
            check(any("raftkv" in " ".join(p["command"]) for p in listed["processes"]), listed)
            extracted = result(await s.call_tool("extract", {"moment": before, "node": leader,
                                                             "path": "/etc/passwd", "encoding": "text"}), "extract")
            check("root:" in extracted["text"], extracted)
            check(extracted["budget"]["call"]["bytes"] == len(extracted["text"].encode()), extracted["budget"])

            # A command in a branch: the nodes run on, the branch ends later.
            frozen = result(await s.call_tool("exec", {"moment": before, "node": leader,
                                                       "command": ["cat", "/proc/1/cmdline"]}), "exec")
            check("raftkv" in frozen["stdout"] and frozen["end"] is None, frozen)
            ran = result(await s.call_tool("exec", {"moment": before, "node": leader, "branch": True,
                                                    "command": ["sleep", "1"]}), "exec")
            check(ran["status"] == 0, ran)
            check(ran["end"]["virtual_ns"] >= ran["at"]["virtual_ns"] + 1_000_000_000, ran)
            check(ran["end"]["moment"] != ran["at"]["moment"], ran)
            check(ran["at"]["digest"] == at["digest"], ran)

            # The history is unchanged: the same moment, the same digest.
            again = result(await s.call_tool("rewind", {"moment": before}), "rewind")
            check(again["digest"] == at["digest"], (again, at))

            # A call a budget refuses before it starts, naming the budget.
            refused = await s.call_tool("wait", {"moment": before, "duration": "2h"})
            check(refused.isError, "a wait past the call's virtual budget is refused")
            text = refused.content[0].text
            check("budget call_virtual" in text and "over" in text, text)

            # Malformed calls are errors; the server goes on serving.
            bad = await s.call_tool("exec", {"moment": before, "command": "not a list"})
            check(bad.isError, "bad arguments")
            outside = await s.call_tool("extract", {"moment": "../etc@1s", "path": "/etc/passwd"})
            check(outside.isError and "`..`" in outside.content[0].text, outside)
            try:
                await s.call_tool("no_such_tool", {})
                raise AssertionError("an unknown tool is a JSON-RPC error")
            except Exception as error:  # McpError
                check("no tool" in str(error), str(error))

            # Cancellation: a long wait is cancelled; its work stops.
            request_id = s._request_id
            cancelled_progress = []

            async def long_progress(done, total, message):
                cancelled_progress.append(done)

            async def long_wait():
                await s.call_tool("wait", {"moment": before, "duration": "50m"},
                                  progress_callback=long_progress)

            async with anyio.create_task_group() as group:
                group.start_soon(long_wait)
                while len(cancelled_progress) < 2:
                    await anyio.sleep(0.2)
                await s.send_notification(types.ClientNotification(types.CancelledNotification(
                    params=types.CancelledNotificationParams(requestId=request_id, reason="test"))))
                cancelled_at = time.monotonic()
                # The client's next call runs once the cancelled one stopped.
                spent = result(await s.call_tool("budget", {}), "budget")
                figures["cancel_s"] = time.monotonic() - cancelled_at
                group.cancel_scope.cancel()
            client = [b for b in spent["shared"] if b["scope"] == "client"][0]
            # Far less than the 50 min asked for was simulated.
            check(client["used"]["virtual_time"] < 10 * 60 * 10**9, client)

            # Verify the source patch with 2 seeds.
            verify_told = []

            async def verify_progress(done, total, message):
                verify_told.append(message)

            start = time.monotonic()
            report = result(await s.call_tool("verify", {"finding": finding, "image": patched, "seeds": 2},
                                              progress_callback=verify_progress), "verify")
            figures["verify_s"] = time.monotonic() - start
            check(report["verified"] is True, report)
            check(len(report["seeds"]) == 2, report)
            check(report["control_check"]["reproduced"] is True, report)
            check(len(verify_told) == 2, verify_told)
            check(report["spent"]["call"]["virtual_time"] > 0, report["spent"])
    print(json.dumps(figures))


asyncio.run(main())
