"""A PyTorch TCPStore peer driven over stdin/stdout by the Go tests.

Each stdin line is a JSON command {"id": N, "op": ..., ...}; each reply is
one stdout line {"id": N, "ok": result} or {"id": N, "err": "Type: text"}.
Commands with "async": true run in a thread of their own, so that a blocked
wait does not hold up the others. Values travel as hex. Importing torch takes
seconds, so one process serves a whole test.
"""
import datetime
import json
import sys
import threading
import time

try:
    import torch
    import torch.distributed as dist
except Exception as e:  # reported to the test, which skips
    print(json.dumps({"skip": "%s: %s" % (type(e).__name__, e)}), flush=True)
    sys.exit(0)

stores = {}
out_lock = threading.Lock()


def reply(msg):
    with out_lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def ms(n):
    return datetime.timedelta(milliseconds=n)


def run(c):
    op = c["op"]
    if op == "open":
        s = dist.TCPStore(c.get("host", "127.0.0.1"), c.get("port", 0), c.get("world"),
                          c.get("master", False), ms(c.get("timeout_ms", 20000)),
                          c.get("wait_for_workers", True))
        stores[c["s"]] = s
        return s.port
    if op == "prefix":
        # A PrefixStore over another named store, as torch's env:// init
        # makes over torchrun's agent store.
        stores[c["s"]] = dist.PrefixStore(c["prefix"], stores[c["base"]])
        return None
    if op == "close":
        del stores[c["s"]]
        return None
    if op == "version":
        return torch.__version__
    s = stores.get(c.get("s"))
    if op == "set":
        s.set(c["key"], bytes.fromhex(c["hex"]))
        return None
    if op == "get":
        return s.get(c["key"]).hex()
    if op == "add":
        return s.add(c["key"], c["n"])
    if op == "cas":
        return s.compare_set(c["key"], bytes.fromhex(c["exp"]), bytes.fromhex(c["des"])).hex()
    if op == "wait":
        t0 = time.monotonic()
        try:
            if "timeout_ms" in c:
                s.wait(c["keys"], ms(c["timeout_ms"]))
            else:
                s.wait(c["keys"])
        except Exception as e:
            raise RuntimeError("%s (after %d ms)" % (e, (time.monotonic() - t0) * 1000))
        return None
    if op == "num_keys":
        return s.num_keys()
    if op == "delete":
        return s.delete_key(c["key"])
    if op == "add_many":
        # Each named store adds 1 to key n times, all stores at once.
        results, errors = [], []
        lock = threading.Lock()

        def adder(name):
            try:
                got = [stores[name].add(c["key"], 1) for _ in range(c["n"])]
            except Exception as e:
                with lock:
                    errors.append("%s: %s" % (type(e).__name__, e))
                return
            with lock:
                results.extend(got)

        ts = [threading.Thread(target=adder, args=(n,)) for n in c["stores"]]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise RuntimeError("; ".join(errors))
        return results
    raise ValueError("unknown op %r" % op)


def serve(c):
    try:
        reply({"id": c["id"], "ok": run(c)})
    except Exception as e:
        reply({"id": c["id"], "err": "%s: %s" % (type(e).__name__, e)})


reply({"ready": torch.__version__})
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    c = json.loads(line)
    if c.get("op") == "quit":
        break
    if c.get("async"):
        threading.Thread(target=serve, args=(c,), daemon=True).start()
    else:
        serve(c)
