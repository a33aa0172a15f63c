#!/bin/sh
# Stand-in for a document converter: "converts" /input/report.docx into /output/report.pdf
# by writing a header line and the input's sha256, so a run's artifact is checkable.
set -eu
input=/input/report.docx
output=/output/report.pdf
digest=$(sha256sum "$input" | cut -d' ' -f1)
printf '%%PDF-airlock-example converted from %s\nsha256:%s\n' "$input" "$digest" > "$output"
echo "wrote $output"
