"""db_query: one read-only query over /data/inventory.sqlite; the validated input on stdin,
one JSON value on stdout (docs/tools.md)."""
import json
import sqlite3
import sys

request = json.load(sys.stdin)
max_rows = request.get("max_rows", 10)
# immutable=1: no journal, no lock file (the directory is read-only anyway).
db = sqlite3.connect("file:/data/inventory.sqlite?mode=ro&immutable=1", uri=True)
db.execute("PRAGMA query_only = 1")
try:
    cursor = db.execute(request["query"])
except sqlite3.Error as err:
    print(f"db_query: {err}", file=sys.stderr)
    sys.exit(1)
rows = cursor.fetchmany(max_rows + 1)
columns = [d[0] for d in cursor.description or []]
print(json.dumps({"columns": columns, "rows": [list(r) for r in rows[:max_rows]],
                  "truncated": len(rows) > max_rows}))
