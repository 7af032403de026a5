"""mkdocs hook: render the Sphinx roles some docstrings use (:class:`~streamrt.Completion`) as code.

mkdocstrings renders docstrings as Markdown, where a role shows up as the text ":class:" before the
code span. This hook drops the role and, as Sphinx does for a leading "~", keeps only the last
component of the name.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def _code(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(_code, html)
