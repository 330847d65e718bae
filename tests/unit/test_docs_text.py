"""What the README, ARCHITECTURE.md and the pages under docs/ show holds up: every Python block compiles and is
formatted as ruff formats the code, and every relative link of the README and ARCHITECTURE.md (which GitHub
shows, outside the docs site's own checks) leads to a file that exists and to a heading it has."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
DOCUMENTS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *PAGES]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[\w+-]*)")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>[^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """Each fenced code block: its first line's number, its info word and its text, dedented (a list item's)."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence, body = opening["indent"], opening["fence"], []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index][len(indent) :] if lines[index].startswith(indent) else lines[index])
            index += 1
        blocks.append((index - len(body), opening["info"].lower(), textwrap.dedent("\n".join(body))))
        index += 1
    return blocks


def prose(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced blocks, with their numbers, inline code removed."""
    kept, fence = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening["fence"]
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            kept.append((number, CODE_SPAN.sub("", line)))
    return kept


def anchors(path: Path) -> set[str]:
    """The ids mkdocs' toc extension gives the headings of a page (the slugs GitHub makes agree for these)."""
    ids = set()
    for _, line in prose(path.read_text(encoding="utf-8").replace("`", "")):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            text = LINK.sub(lambda link: link["text"], heading[1]).replace("**", "")
            ids.add(slugify(text, "-"))
    return ids


def python_blocks() -> list:
    return [
        pytest.param(name(path), line, code, id=f"{name(path)}:{line}")
        for path in DOCUMENTS
        for line, info, code in fenced_blocks(path.read_text(encoding="utf-8"))
        if info in ("python", "py")
    ]


def test_every_python_fence_is_found_a_list_item_s_too():
    fences = sum(len(re.findall(r"^[ \t]*```py(thon)?$", path.read_text(encoding="utf-8"), re.M)) for path in DOCUMENTS)
    blocks = python_blocks()
    assert len(blocks) == fences
    assert "README.md" in {block.values[0] for block in blocks}


@pytest.mark.parametrize(("path", "line", "code"), python_blocks())
def test_every_python_block_compiles(path, line, code):
    compile(code, f"{path}:{line}", "exec")


def test_ruff_formats_the_python_blocks_of_every_document():
    """make lint's ``ruff format --check .`` covers them (ruff formats Markdown's Python blocks since 0.16):
    every document was read and none needs formatting."""
    checked = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *map(name, DOCUMENTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(DOCUMENTS)} files already formatted" in checked.stdout, checked.stdout + checked.stderr


@pytest.mark.parametrize("document", ["README.md", "ARCHITECTURE.md"])
def test_every_relative_link_leads_to_a_file_and_a_heading(document):
    path, broken, seen = ROOT / document, [], 0
    for number, line in prose(path.read_text(encoding="utf-8")):
        for target in [match["target"] for match in LINK.finditer(line)] + IMAGE.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            seen += 1
            file_part, _, anchor = unquote(target).partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{document}:{number}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{document}:{number}: {target}: {name(linked)} has no heading #{anchor}")
    assert seen, f"{document} has no relative link to check"
    assert not broken, "\n".join(broken)


def test_the_pages_architecture_md_names_exist():
    named = set(re.findall(r"`(docs/[\w/.-]+\.md)`", (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")))
    assert named, "ARCHITECTURE.md names no page of docs/"
    assert sorted(page for page in named if not (ROOT / page).is_file()) == []
