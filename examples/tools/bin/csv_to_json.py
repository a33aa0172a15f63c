"""csv_to_json: CSV text in, {columns, rows} out."""
import csv
import io
import json
import sys

request = json.load(sys.stdin)
reader = csv.DictReader(io.StringIO(request["csv"]), delimiter=request.get("delimiter", ","))
rows = [{k: v for k, v in row.items() if k is not None} for row in reader]
print(json.dumps({"columns": reader.fieldnames or [], "rows": rows}))
