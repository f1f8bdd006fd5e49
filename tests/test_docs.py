"""The docs' relative links point at files that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://|#|mailto:", target):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)} links to a missing {target}"


def test_the_readme_snippet_runs_verbatim(capsys):
    """README's first Python block, as a user pastes it (on the GPU if there is one)."""
    text = (ROOT / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(snippet, "README.md", "exec"), {})
    ids, total = capsys.readouterr().out.rsplit("]", 1)
    assert len(ids.strip("[").split(",")) == 16 and abs(float(total) - 1.0) < 1e-5
