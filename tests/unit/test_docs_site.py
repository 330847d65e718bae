"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, which fails on a link or an
anchor that leads nowhere: mkdocs.yml's ``validation`` makes each of those a warning, and --strict a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mkdocs_build(config_dir: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    # NO_MKDOCS_2_WARNING: mkdocs-material's banner about its successor, printed on every build (not a warning).
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(config_dir / "mkdocs.yml"),
            "-d",
            str(site_dir),
        ],
        cwd=config_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_site_builds_strict(tmp_path):
    built = mkdocs_build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    # Every page of the nav is in the site, the architecture page with ARCHITECTURE.md's own text.
    pages = {path.name for path in (ROOT / "docs").glob("*.md")}
    for page in pages - {"index.md"}:
        assert (tmp_path / "site" / page.removesuffix(".md") / "index.html").is_file(), page
    architecture = (tmp_path / "site" / "architecture" / "index.html").read_text(encoding="utf-8")
    assert "Who owns what" in architecture and "--8&lt;--" not in architecture


def test_a_broken_anchor_or_page_fails_the_build(tmp_path):
    """The validation settings are what makes --strict fail: a copy of the docs with one bad link each."""
    for broken, named in [
        ("[x](guarantees.md#no-such-heading)", "no-such-heading"),
        ("[x](no-such-page.md)", "no-such-page.md"),
    ]:
        copy = tmp_path / named
        shutil.copytree(ROOT / "docs", copy / "docs")
        shutil.copy(ROOT / "mkdocs.yml", copy)
        shutil.copy(ROOT / "ARCHITECTURE.md", copy)
        index = copy / "docs" / "index.md"
        index.write_text(index.read_text(encoding="utf-8") + f"\n{broken}\n", encoding="utf-8")
        built = mkdocs_build(copy, copy / "site")
        assert built.returncode != 0, broken
        assert named in built.stdout + built.stderr, built.stdout + built.stderr
