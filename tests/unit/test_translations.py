"""The Simplified Chinese catalogue is complete, compiles, and the committed .mo is up to date."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
# Inside the engine's package, so that the wheel ships it.
CATALOGUE = ROOT / "tasks" / "locale" / "zh_Hans" / "LC_MESSAGES"


def entries(po_text: str) -> list[tuple[str, str]]:
    """(msgid, msgstr) pairs of a .po file, multi-line strings joined; plurals use msgstr[0]."""
    pairs, msgid, msgstr, current = [], None, None, None
    for line in [*po_text.splitlines(), ""]:
        if line.startswith("msgid "):
            if msgid is not None:
                pairs.append((msgid, msgstr or ""))
            msgid, msgstr, current = line[7:-1], None, "id"
        elif line.startswith("msgid_plural "):
            current = "plural"
        elif line.startswith("msgstr ") or line.startswith("msgstr[0] "):
            msgstr, current = line.split('"', 1)[1][:-1], "str"
        elif line.startswith("msgstr["):
            current = "other"
        elif line.startswith('"') and current == "id":
            msgid += line[1:-1]
        elif line.startswith('"') and current == "str":
            msgstr += line[1:-1]
    if msgid is not None:
        pairs.append((msgid, msgstr or ""))
    return [(i, s) for i, s in pairs if i]


def test_every_string_is_translated():
    po = (CATALOGUE / "django.po").read_text(encoding="utf-8")
    missing = [msgid for msgid, msgstr in entries(po) if not msgstr]
    assert not missing, f"{len(missing)} untranslated: {missing[:10]}"
    assert "#, fuzzy" not in po


@pytest.mark.skipif(shutil.which("msgfmt") is None, reason="gettext's msgfmt is missing (apt-get install gettext)")
def test_the_catalogue_compiles_and_the_committed_mo_is_current(tmp_path):
    compiled = tmp_path / "django.mo"
    result = subprocess.run(
        ["msgfmt", "--check-format", "-o", str(compiled), str(CATALOGUE / "django.po")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert compiled.read_bytes() == (CATALOGUE / "django.mo").read_bytes(), "run: python manage.py compilemessages"
