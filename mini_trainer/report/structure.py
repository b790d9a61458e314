"""What a report page is made of, read back from its HTML: its sections' headings and the
(method, learning rate) rows of its summary table.

`scripts/screenshot_report.sh` records this beside the picture it takes (docs/report.png ->
docs/report.structure.json), so a test can tell when the page has changed shape (a section
added or renamed, a method added to the default experiment) since the picture was taken.

    python -m mini_trainer.report.structure REPORT.html > STRUCTURE.json
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path


def page_structure(page: str) -> dict:
    """{"sections": [heading, ...], "rows": [[method, learning rate], ...]} of a report page."""
    sections = [html.unescape(h) for h in re.findall(r'<section id="[^"]+"><h2>(.*?)</h2>', page)]
    rows = []
    if '<section id="summary">' in page:
        summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
        body = summary.split("<tbody>", 1)[-1].split("</tbody>", 1)[0]
        rows = [[html.unescape(m), html.unescape(lr)]
                for m, lr in re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", body)]  # fmt: skip
    return {"sections": sections, "rows": rows}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m mini_trainer.report.structure REPORT.html", file=sys.stderr)
        return 2
    try:
        page = Path(argv[0]).read_text(encoding="utf-8")
    except OSError as error:
        print(f"error: {argv[0]}: {error.strerror or error}", file=sys.stderr)
        return 2
    print(json.dumps(page_structure(page), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
