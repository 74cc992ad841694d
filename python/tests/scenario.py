"""The client scenario against a real `smx serve` with real VMs, sync and
asyncio: create, exec with streamed output, cp, snapshot, fork, logs
--verify, rm. Run by internal/api's TestClientScenarios:

    python3 scenario.py SOCKET NAME_PREFIX
"""

import asyncio
import io
import sys
import tarfile
import time
import urllib.request

import smx


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def make_tar(name, data):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o640
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sync_part(c, name, snap, fork):
    sb = c.create(name, memory="256M", idle_stop="1h", start=True)
    check(sb["status"] == "running", f"create: {sb}")
    check(sb.get("idle_stop") == "1h" and "timeout" not in sb, f"create's limits: {sb}")

    # Output streams as it is written: three chunks a third of a second apart.
    chunks, errs, when = [], [], []
    st = c.exec(name, ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo err >&2; exit 4"],
                stdout=lambda b: (chunks.append(b), when.append(time.monotonic())), stderr=errs.append)
    check(st.code == 4, f"exit status {st}")
    check(b"".join(chunks) == b"line1\nline2\nline3\n", f"stdout {chunks}")
    check(len(chunks) >= 3 and when[-1] - when[0] > 0.4, f"output was not streamed: {chunks} {when}")
    check(b"".join(errs) == b"err\n", f"stderr {errs}")
    out = []
    check(c.exec(name, ["tr", "a-z", "A-Z"], stdin=b"stdin data\n", stdout=out.append).code == 0, "stdin exec")
    check(b"".join(out) == b"STDIN DATA\n", f"stdin round trip {out}")
    # A guest server published on host loopback, reached with urllib.
    c.exec(name, ["sh", "-c", "mkdir -p /www && echo from-guest > /www/index.html && httpd -p 8000 -h /www"])
    pl = c.add_port(name, "0:8000")
    bound = pl["ports"][0]["bound"]
    check(pl["running"] and bound > 0 and pl["ports"][0]["host_ip"] == "127.0.0.1", f"add_port: {pl}")
    with urllib.request.urlopen(f"http://127.0.0.1:{bound}/", timeout=30) as r:
        check(r.read() == b"from-guest\n", "published port")
    try:
        c.add_port(name, "0.0.0.0:0:8000")
        check(False, "0.0.0.0 published without publish_external")
    except smx.Invalid:
        pass
    check(c.remove_port(name, str(bound))["ports"] == [], "remove_port")
    # A signal through an exec session.
    with c.exec_session(name, ["sh", "-c", "trap 'echo term; exit 9' TERM; echo ready; while :; do sleep 0.1; done"]) as sess:
        seen, sent = b"", False
        for stream, data in sess:
            seen += data
            if b"ready" in seen and not sent:
                sess.signal(15)
                sent = True
        check(sess.status is not None and sess.status.code == 9 and b"term" in seen, f"signal: {sess.status} {seen!r}")
    try:
        c.exec(name, ["/no/such/cmd"])
        check(False, "missing command ran")
    except smx.ExecStartError as e:
        check(e.exit_code == 127, f"missing command exit {e.exit_code}")
    try:
        c.exec("no-such-sandbox", ["true"])
        check(False, "exec in a missing sandbox ran")
    except smx.NotFound as e:
        check(e.status == 404, f"exec in a missing sandbox: status {e.status}")
    try:
        c.inspect("no-such-sandbox")
        check(False, "inspect of a missing sandbox succeeded")
    except smx.NotFound as e:
        check(e.status == 404, f"status {e.status}")

    # cp, both ways.
    check(c.copy_in(name, "/tmp", make_tar("py-file.txt", b"from python\n")) > 0, "copy in")
    r = c.run(name, ["cat", "/tmp/py-file.txt"])
    check(r["stdout"] == "from python\n", f"after copy in {r}")
    with tarfile.open(fileobj=io.BytesIO(c.copy_out(name, "/tmp/py-file.txt"))) as t:
        m = t.next()
        check(m is not None and m.name == "py-file.txt", f"copy out entry {m}")
        check(t.extractfile(m).read() == b"from python\n", "copy out content")

    # Snapshot and fork.
    sn = c.snapshot(name, snap)
    check(sn["name"] == snap and sn["memory_state_bytes"] > 0, f"snapshot {sn}")
    fk = c.fork(snap, fork)
    check(fk["status"] == "running", f"fork {fk}")
    check(fk.get("idle_stop") == "1h", f"the fork keeps its source's idle_stop: {fk}")
    check(c.run(fork, ["cat", "/tmp/py-file.txt"])["stdout"] == "from python\n", "fork has the file")

    # Logs and their verification.
    kinds = [r["kind"] for r in c.logs(name)]
    check("sandbox.create" in kinds and "exec.start" in kinds and "snapshot.create" in kinds, f"log kinds {kinds}")
    rep = c.verify_log(name)
    check(rep["ok"] and rep["records"] > 0, f"verify {rep}")


async def async_part(sock, name, fork):
    ac = smx.AsyncClient(sock)
    names = [s["name"] for s in await ac.list()]
    check(name in names and fork in names, f"async list {names}")
    chunks = []
    st = await ac.exec(fork, ["sh", "-c", "echo a; sleep 0.3; echo b; exit 2"], stdout=chunks.append)
    check(st.code == 2 and b"".join(chunks) == b"a\nb\n" and len(chunks) >= 2, f"async exec {st} {chunks}")
    out = []
    st = await ac.exec(fork, ["cat"], stdin=b"async stdin", stdout=out.append)
    check(st.code == 0 and b"".join(out) == b"async stdin", f"async stdin {out}")
    r = await ac.run(fork, ["sh", "-c", "echo $((6*7))"])
    check(r["stdout"] == "42\n", f"async run {r}")
    check(await ac.copy_in(fork, "/tmp", make_tar("a.txt", b"x")) > 0, "async copy in")
    check(len(await ac.copy_out(fork, "/tmp/a.txt")) > 0, "async copy out")
    kinds = [r["kind"] async for r in ac.logs(fork)]
    check("snapshot.restore" in kinds or "sandbox.start" in kinds, f"async log kinds {kinds}")
    check((await ac.verify_log(fork))["ok"], "async verify")
    try:
        await ac.inspect("no-such-sandbox")
        check(False, "async inspect of a missing sandbox succeeded")
    except smx.NotFound:
        pass


def main():
    sock, prefix = sys.argv[1], sys.argv[2]
    name, snap, fork = prefix, prefix + "-snap", prefix + "-fork"
    c = smx.Client(sock, timeout=600)
    try:
        sync_part(c, name, snap, fork)
        asyncio.run(async_part(sock, name, fork))
        c.remove(fork, force=True)
        c.remove(name, force=True)
        c.remove_snapshot(snap)
        try:
            c.inspect(name)
            check(False, "sandbox still there after rm")
        except smx.NotFound:
            pass
    finally:
        for n in (fork, name):
            try:
                c.remove(n, force=True)
            except smx.SmxError:
                pass
        try:
            c.remove_snapshot(snap)
        except smx.SmxError:
            pass
    print("scenario ok")


if __name__ == "__main__":
    main()
