"""python_snippet: runs {code}, returns what it printed and the exception it raised."""
import contextlib
import io
import json
import sys
import traceback

request = json.load(sys.stdin)
printed = io.StringIO()
error = None
with contextlib.redirect_stdout(printed):
    try:
        exec(compile(request["code"], "<snippet>", "exec"), {"__name__": "__snippet__"})
    except BaseException:  # the snippet's own failure is its output
        error = traceback.format_exc(limit=-3)
print(json.dumps({"printed": printed.getvalue()[-65536:], "error": error}))
