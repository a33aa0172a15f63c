# The payload side of examples/broker/airlock.toml: generates a one-page PDF for the case
# named by argv[1] and asks the broker to store it. One request per connection to
# $AIRLOCK_BROKER, one JSON line each way (docs/credentials.md, "The broker").
import base64, json, os, socket, sys

case_id = sys.argv[1]
text = "Case %s: generated summary" % case_id
stream = "BT /F1 18 Tf 72 720 Td (%s) Tj ET" % text
objects = [
    "<< /Type /Catalog /Pages 2 0 R >>",
    "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
    "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
    "/Resources << /Font << /F1 5 0 R >> >> >>",
    "<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
    "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
]
pdf, offsets = "%PDF-1.4\n", []
for number, body in enumerate(objects, 1):
    offsets.append(len(pdf))
    pdf += "%d 0 obj\n%s\nendobj\n" % (number, body)
xref = len(pdf)
pdf += "xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
pdf += "".join("%010d 00000 n \n" % o for o in offsets)
pdf += "trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)

request = {
    "action": "store_case_document",
    "request": {
        "case_id": case_id,
        "file_name": "summary-%s.pdf" % case_id,
        "content": base64.b64encode(pdf.encode()).decode(),
    },
}
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
connection.connect(os.environ["AIRLOCK_BROKER"])
connection.sendall(json.dumps(request).encode() + b"\n")
reply = b""
while not reply.endswith(b"\n"):
    chunk = connection.recv(65536)
    if not chunk:
        break
    reply += chunk
print(reply.decode().strip())
sys.exit(0 if json.loads(reply)["ok"] else 1)
