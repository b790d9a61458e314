#!/usr/bin/env bash
# Render a report page headless with Debian's Chromium and save a PNG screenshot.
#   scripts/screenshot_report.sh results/demo_experiment/report/report.html docs/report.png [HEIGHT]
# Needs `chromium` (apt-get install -y chromium). No network is used: the page and its PNGs are
# local files, and every background service of the browser is switched off.
set -euo pipefail
page=${1:?usage: $0 REPORT.html OUT.png [HEIGHT]}
out=${2:?usage: $0 REPORT.html OUT.png [HEIGHT]}
height=${3:-2000}
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "$0: chromium is not installed (apt-get install -y chromium)" >&2
  exit 3
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$profile" --screenshot="$(realpath -m "$out")" \
  --window-size=1280,"$height" "file://$(realpath "$page")" >/dev/null 2>&1
test -s "$out"
echo "wrote $out"
