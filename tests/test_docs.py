"""The documentation site as a reader gets it: the generated reference pages describe every
spec field, setting and `opd` option from the code (92 of 216 spec fields had no words), and
no page, generated or written, shows an escaped pipe (`\\|` inside a code span) or loses a
`<placeholder>` to the browser as an unknown HTML tag (`default <home>/opd.db` read
"default /opd.db")."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import markdown

from app.core.config import Settings

ROOT = Path(__file__).resolve().parents[1]
HTML_TAGS = {
    "a", "br", "code", "div", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "img", "li",
    "ol", "p", "pre", "span", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul",
    "details", "summary", "blockquote", "sup",
}  # fmt: skip
"""What the site's Markdown makes (and raw HTML a page may hold on purpose)."""
EXTENSIONS = ["tables", "admonition", "toc", "pymdownx.superfences"]
"""mkdocs.yml's, those that change what HTML a page becomes."""


def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "scripts/docs_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_spec_field_setting_and_command_option_says_what_it_is():
    docs = reference()
    fields = [(path, info) for _, _, rows in docs.spec_sections() for path, info in rows]
    settings = list(Settings.model_fields.items())
    options = [
        (" ".join([*path, *action.option_strings]) or action.dest, action.help)
        for path, parser in docs.parsers(docs.build_parser(), ["opd"])
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]

    assert len(fields) > 200 and len(settings) > 50 and len(options) > 200
    assert [path for path, info in fields if not info.description] == []
    assert [name for name, info in settings if not info.description] == []
    assert [name for name, text in options if not text] == []
    assert not any("api_key_env" in path for path, _ in fields), "refused: not to be written"


def rendered_pages() -> dict[str, str]:
    """Every page of the site as HTML: the generated ones and those under docs/."""
    pages = dict(reference().pages())
    pages |= {
        str(page.relative_to(ROOT / "docs")): page.read_text()
        for page in (ROOT / "docs").rglob("*.md")
    }
    return {name: markdown.markdown(text, extensions=EXTENSIONS) for name, text in pages.items()}


def test_no_page_shows_an_escaped_pipe_or_swallows_a_placeholder():
    pages = rendered_pages()
    assert {"reference/spec.md", "reference/settings.md", "get-started/install.md"} <= set(pages)

    escaped = {name: html.count("\\|") for name, html in pages.items() if "\\|" in html}
    unknown = {
        name: sorted(set(tags) - HTML_TAGS)
        for name, html in pages.items()
        if set(tags := re.findall(r"<([A-Za-z][\w-]*)", html)) - HTML_TAGS
    }
    assert escaped == {}
    assert unknown == {}
    settings = pages["reference/settings.md"]
    assert "<code>sqlite:///$OPD_HOME/opd.db</code>" in settings and "required" not in settings


def test_the_user_pages_say_how_to_build_the_docs_and_keep_internals_out():
    pages = {
        str(page.relative_to(ROOT / "docs")): page.read_text()
        for folder in ("get-started", "how-to")
        for page in (ROOT / "docs" / folder).glob("*.md")
    }
    install = pages["get-started/install.md"]
    assert "`docs` (" in install and "`eval` (" in install and "mkdocs serve" in install
    assert (
        "`opd vllm setup`" in pages["how-to/cli.md"] and "(see above)" not in pages["how-to/cli.md"]
    )
    internal = ("schemathesis", "hypothesis", "the issue", "lent to this project", "test_first_job")
    assert {
        name: [word for word in internal if word in text.lower()]
        for name, text in pages.items()
        if any(word in text.lower() for word in internal)
    } == {}
