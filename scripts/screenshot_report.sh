#!/usr/bin/env bash
# Render a report page headless with Debian's Chromium and save a PNG screenshot, and beside it
# the page's structure (its sections and (method, learning rate) rows) as OUT.structure.json:
#   scripts/screenshot_report.sh results/report/report.html docs/report.png [HEIGHT]
# (writes docs/report.png and docs/report.structure.json; tests/test_docs.py checks that the
# current report still has that structure, so a stale picture is noticed).
# Needs `chromium` (apt-get install -y chromium) and mini_trainer importable (the .venv's python
# when there is one, else python3; set PYTHON to choose). No network is used: the page and its
# PNGs are local files, and every background service of the browser is switched off.
set -euo pipefail
page=${1:?usage: $0 REPORT.html OUT.png [HEIGHT]}
out=${2:?usage: $0 REPORT.html OUT.png [HEIGHT]}
height=${3:-2000}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$([ -x "$here/.venv/bin/python" ] && echo "$here/.venv/bin/python" || echo python3)}
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "$0: chromium is not installed (apt-get install -y chromium)" >&2
  exit 3
fi
structure="${out%.png}.structure.json"
"$python" -m mini_trainer.report.structure "$page" > "$structure.tmp"
profile=$(mktemp -d)
trap 'rm -rf "$profile" "$structure.tmp"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$profile" --screenshot="$(realpath -m "$out")" \
  --window-size=1280,"$height" "file://$(realpath "$page")" >/dev/null 2>&1
test -s "$out"
mv "$structure.tmp" "$structure"
echo "wrote $out and $structure"
