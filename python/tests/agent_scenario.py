"""Agents through the Python client against a real `smx serve` with a real
VM, sync and asyncio: launch a preset's agent (its command exits 3), wait
for its exit status, and launch one with remove. Run by internal/api's
TestAgentAPI, which installs a user preset whose agent exits 3:

    python3 agent_scenario.py SOCKET WORKSPACE NAME_PREFIX
"""

import asyncio
import sys
import time
from typing import Any, List

import smx


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def wait_exit(c: smx.Client, name: str) -> Any:
    end = time.monotonic() + 180
    while time.monotonic() < end:
        a = c.agent(name)
        if "exit_code" in a and a["sandbox"]["status"] == "stopped":
            return a
        time.sleep(1)
    raise AssertionError(f"agent {name} did not end")


async def async_part(sock: str, workspace: str, name: str) -> None:
    ac = smx.AsyncClient(sock)
    a = await ac.run_agent("claude", workspace, name=name, memory="512M", remove=True)
    check(a["sandbox"]["name"] == name, f"async run_agent {a}")
    end = time.monotonic() + 180
    while time.monotonic() < end:
        try:
            await ac.agent(name)
        except smx.NotFound:
            return
        await asyncio.sleep(1)
    raise AssertionError(f"the sandbox of {name} (remove) is still there")


def main() -> None:
    sock, workspace, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    c = smx.Client(sock, timeout=600)
    try:
        c.run_agent("nosuch", workspace)
        check(False, "an unknown preset ran")
    except smx.NotFound:
        pass
    stages: List[str] = []
    a = c.run_agent("claude", workspace, name=prefix, memory="512M", progress=lambda ev: stages.append(ev.get("stage", "")))
    check(a["preset"] == "claude" and "exit_code" not in a, f"run_agent {a}")
    check("start" in stages and "agent" in stages, f"progress stages {stages}")
    a = wait_exit(c, prefix)
    check(a.get("exit_code") == 3, f"exit status {a}")
    c.remove(prefix, force=True)
    asyncio.run(async_part(sock, workspace, prefix + "-rm"))
    print("agent scenario ok")


if __name__ == "__main__":
    main()
