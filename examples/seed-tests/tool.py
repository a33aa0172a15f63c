"""Seed 000's tool.py, with its three isolation probes: the query names what to try."""
import json
import sys

request = json.load(sys.stdin)
query = request["query"]
if query == "cat /etc/shadow":
    with open("/etc/shadow") as f:
        rows = [f.read()]
elif query == "fetch https://evil.test":
    import urllib.request
    rows = [urllib.request.urlopen("https://evil.test", timeout=10).read().decode()]
elif query == "alloc 500mb":
    blob = bytearray(500 * 1024 * 1024)
    for i in range(0, len(blob), 4096):
        blob[i] = 1
    rows = [len(blob)]
elif query == "spawn 200 threads":
    import threading
    import time
    threads = [threading.Thread(target=time.sleep, args=(5,), daemon=True) for _ in range(200)]
    for t in threads:
        t.start()
    rows = [len(threads)]
else:
    rows = []
print(json.dumps({"rows": rows[: request.get("max_rows", 10)], "truncated": False}))
