"""The documentation site is wired: every page is in mkdocs.yml's nav, every command is on the CLI page.

``bash scripts/dev.sh docs`` (CI) builds the site with ``mkdocs build --strict``, which fails on a broken
link or anchor and, as mkdocs.yml's ``validation`` asks, on a page left out of the nav.  These checks
run without mkdocs (fast): a new page that is not in the nav, a new ``graphfeed`` command or benchmark
that the CLI reference does not name, a mkdocstrings directive naming an object that is gone, or a
README link to a moved page fails here first.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import yaml

from graphfeed.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
CLI_PAGE = DOCS / "reference" / "cli.md"


def _nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists():
    nav = _nav_pages(yaml.safe_load(CONFIG.read_text())["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == sorted(nav), f"a page is twice in mkdocs.yml's nav: {nav}"
    assert not set(pages) - set(nav), f"docs pages missing from mkdocs.yml's nav: {sorted(set(pages) - set(nav))}"
    assert not set(nav) - set(pages), f"mkdocs.yml's nav names missing pages: {sorted(set(nav) - set(pages))}"


def _subcommands(parser) -> dict:
    """name -> sub-parser of ``parser``'s sub-commands (argparse keeps them on its subparsers action)."""
    [action] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(action.choices)


def test_every_cli_command_and_benchmark_is_on_the_cli_reference_page():
    page = CLI_PAGE.read_text()
    parser, _ = build_parser(["bench"])        # "bench" wanted: its benchmarks are added too
    commands = _subcommands(parser)
    named = [f"graphfeed {name}" for name in commands]
    named += [f"graphfeed bench {name}" for name in _subcommands(commands["bench"])]
    missing = [name for name in named if f"`{name}`" not in page]
    assert len(named) > 10
    assert not missing, f"{CLI_PAGE.relative_to(ROOT)} does not name {missing}: add a row for each"


def test_every_api_reference_directive_names_an_object_that_exists():
    directives = [(page, m.group(1)) for page in DOCS.rglob("*.md")
                  for m in re.finditer(r"^::: ([\w.]+)$", page.read_text(), re.M)]
    assert len(directives) > 10
    for page, path in directives:
        module, _, name = path.rpartition(".")
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = False
        found = found or importlib.util.find_spec(path) is not None
        assert found, f"{page.relative_to(ROOT)}: `::: {path}` names nothing importable"


def test_readme_links_point_at_files_that_exist():
    """The README is not part of the site, so the --strict build does not check its links."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local
    assert not [link for link in local if not (ROOT / link).exists()], "README.md links to missing files"


def test_ci_builds_the_docs_after_lint_and_before_the_tests():
    steps = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    steps = [s for s in steps if s.startswith("bash scripts/dev.sh")]
    assert steps == ["bash scripts/dev.sh lint", "bash scripts/dev.sh docs", "bash scripts/dev.sh test"]


def test_every_test_a_page_names_exists():
    """A page that says "shown by tests/x.py::test_y" (the threat model, the how-tos) names a test that is there:
    a renamed or removed test must not leave a claim without its proof."""
    named = {(page.relative_to(ROOT), f, name) for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]
             for f, name in re.findall(r"(tests/[\w/]+\.py)::(\w+)", page.read_text())}
    assert any(page.name == "threat-model.md" for page, _, _ in named), "the threat model names no test"
    missing = [f"{page}: {f}::{name}" for page, f, name in sorted(named)
               if not (ROOT / f).is_file()
               or not re.search(rf"^(async )?def {name}\(", (ROOT / f).read_text(), re.M)]
    assert not missing, "pages name tests that do not exist:\n" + "\n".join(missing)
