"""The documentation, checked: the README leads with the answer and stays short, every link
and every path it names exists, every `gdrprobe COMMAND` and its flags are real, no dated lab
timing has crept back in (those live in benchmarks/RESULTS.md), and the Slurm prolog drains
exactly the exit codes the command says drain."""

from __future__ import annotations

import argparse
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, ROOT / "SECURITY.md", *DOCS]

MAX_README_LINES = 350
FIRST_SCREEN_LINES = 40
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMAND = re.compile(r"\bgdrprobe ([a-z][a-z-]*)(.*)")
# Where a shell line stops being the gdrprobe command's own arguments.
COMMAND_END = re.compile(r"\s(?:\||;|&&|#|>)|\)$")
REPO_PATH = re.compile(r"^(?:gdrprobe|csrc|lab|tests|benchmarks|docs)/[\w./-]*$")
PACKAGE_PATH = re.compile(
    r"^(?:cli|rdma|memory|protocol|measure|nccl|doctor|campaign|report)/[\w./-]*$")


def text(page: pathlib.Path) -> str:
    return page.read_text()


def rel(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    found, seen = set(), {}
    for line in FENCE.sub("", text(page)).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: pathlib.Path) -> list[str]:
    return LINK.findall(FENCE.sub("", text(page)))


def code(page: pathlib.Path) -> list[str]:
    """The lines of fenced blocks and the inline code spans outside them: where commands,
    flags and paths are named."""
    body = text(page)
    blocks = [line for block in FENCE.findall(body) for line in block.splitlines()[1:-1]]
    return blocks + CODE_SPAN.findall(FENCE.sub("", body))


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from gdrprobe.cli import build_parser

    actions = [action for action in build_parser()._actions
               if isinstance(action, argparse._SubParsersAction)]
    return dict(actions[0].choices)


def test_the_readme_is_short():
    lines = len(text(README).splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_first_screen_leads_with_the_answer():
    first = "\n".join(text(README).splitlines()[:FIRST_SCREEN_LINES])
    assert "gdrprobe check" in first
    assert "pip install ." in first and "apt-get install" in first


def test_the_readme_names_the_test_command_and_the_demo_in_it():
    readme = text(README)
    assert "./dev test" in readme
    assert "and the demo" in readme     # ./dev test runs the demo: a broken demo fails it


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_points_to_something_that_exists(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue                                  # https:, mailto:
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme_and_exists():
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for target in links(README) if target.startswith("docs/")}
    assert linked, "the README links no page under docs/"
    assert all(path.exists() for path in linked)
    assert {path.resolve() for path in DOCS} <= linked, "a docs/ page the README does not link"
    assert (ROOT / "SECURITY.md").resolve() in {
        (README.parent / target.partition("#")[0]).resolve() for target in links(README)}


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_dated_lab_timing(page):
    """Dated measurements live in benchmarks/RESULTS.md only."""
    assert DATE.findall(text(page)) == []


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_flag_table_repeats_help(page):
    headers = [line for line in text(page).splitlines()
               if line.startswith("|") and re.match(r"^\|\s*flag\s*\|", line)]
    assert headers == [], "point to 'gdrprobe COMMAND --help' instead"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_command_and_flag_named_is_real(page):
    commands = subcommands()
    unknown = []
    for snippet in code(page):
        for match in COMMAND.finditer(snippet):
            name, rest = match.groups()
            if name not in commands:
                unknown.append(f"gdrprobe {name}")
                continue
            rest = COMMAND_END.split(rest)[0]
            known = commands[name]._option_string_actions
            unknown += [f"gdrprobe {name} {flag}"
                        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest)
                        if flag not in known]
    assert unknown == []


def test_the_readme_names_every_command():
    named = {match.group(1) for snippet in code(README) for match in COMMAND.finditer(snippet)}
    assert set(subcommands()) <= named


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_path_named_exists(page):
    """`gdrprobe/errors.py`, `csrc/gdr_loop.c`, `measure/options.py` (under gdrprobe/),
    `memory/causes` (a module): a file moved in the code is a page to update."""
    missing = []
    for span in CODE_SPAN.findall(FENCE.sub("", text(page))):
        if REPO_PATH.match(span):
            base = ROOT / span
        elif PACKAGE_PATH.match(span):
            base = ROOT / "gdrprobe" / span
        else:
            continue
        if not any(path.exists() for path in (base, base.with_name(base.name + ".py"))):
            missing.append(span)
    assert missing == []


def test_the_exit_code_table_lists_every_code():
    from gdrprobe.errors import ExitCode

    table = text(README).split("| exit | meaning | prolog action |")[1].split("\n\n")[0]
    codes = {int(code) for line in table.splitlines()[2:]
             for code in line.strip("|").split("|")[0].split(",")}
    assert codes == {int(code) for code in ExitCode}
