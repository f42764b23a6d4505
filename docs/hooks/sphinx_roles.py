"""mkdocs hook: the docstrings' Sphinx roles (:class:`Client`, :meth:`close`) shown as plain code.

The API reference renders docstrings as Markdown, which keeps a role's name as text in front of its
code span (":class:Client"); the docstrings stay as they are (they are read in editors and ``help()``
too), and the role name is dropped from the page's HTML here.
"""
from __future__ import annotations

import re

ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj|const):(?=<code>)")


def on_page_content(html: str, **_kwargs) -> str:
    return ROLE.sub("", html)
