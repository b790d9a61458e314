"""The report page: small HTML helpers and the fixed page frame (no templates, no scripts).

Every value is escaped; a missing number is a cell with class "missing" that says so.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence

MISSING = '<td class="missing">missing</td>'

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f;
       max-width: 1180px; margin: 24px auto; padding: 0 20px; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 19px; margin-top: 34px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; } h3 { font-size: 15px; }
.meta { color: #666; } nav a { margin-right: 14px; }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 13px; }
th, td { border: 1px solid #d6d6d6; padding: 3px 8px; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
th { background: #f4f4f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.missing { color: #b00020; background: #fdecee; font-style: italic; }
img { max-width: 100%; border: 1px solid #eee; }
.side { display: flex; gap: 24px; align-items: flex-start; }
.side aside { max-width: 380px; background: #f7f7f9; border-left: 4px solid #4c72b0;
              padding: 10px 14px; }
.problems { color: #b00020; } code, pre { font-size: 12px; }
pre { background: #f7f7f9; padding: 8px; overflow-x: auto; max-height: 320px; }
details { margin: 4px 0; }
.grid { display: flex; flex-wrap: wrap; gap: 8px 22px; } .grid > div { max-width: 560px; }
.grid ul { font-size: 12px; padding-left: 18px; word-break: break-all; }
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def num(value: float | int | None, fmt: str = "{:.4g}") -> str:
    """A right-aligned number cell, or the missing cell."""
    if value is None:
        return MISSING
    return f'<td class="num">{esc(fmt.format(value))}</td>'


def pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return MISSING
    text = f"{value * 100:+.1f} pt" if signed else f"{value:.1%}"
    return f'<td class="num">{esc(text)}</td>'


def text(value: object) -> str:
    return f"<td>{esc(value)}</td>" if value is not None else MISSING


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """`rows` hold ready cells (from num/pct/text)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(f"<tr>{''.join(row)}</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def image(name: str, alt: str) -> str:
    return f'<img src="{esc(name)}" alt="{esc(alt)}">'


def json_details(summary: str, data: object) -> str:
    dumped = json.dumps(data, indent=2, sort_keys=True, default=str)
    return f"<details><summary>{esc(summary)}</summary><pre>{esc(dumped)}</pre></details>"


def page(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]]) -> str:
    """The whole document; `sections` are (anchor, heading, inner HTML)."""
    nav = "".join(f'<a href="#{esc(a)}">{esc(h)}</a>' for a, h, _ in sections)
    body = "".join(f'<section id="{esc(a)}"><h2>{esc(h)}</h2>{inner}</section>'
                   for a, h, inner in sections)  # fmt: skip
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{esc(title)}</h1><p class="meta">{esc(subtitle)}</p><nav>{nav}</nav>'
        f"{body}</body></html>\n"
    )
