"""The docs: relative links resolve, the README snippet runs, the API page lists the registry."""

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


def test_api_lists_every_schema():
    """docs/api.md's schema list is the registry's: every op, each schema as registered."""
    import torch

    import kimi_router_ops  # noqa: F401  (registers torch.ops.kimi)

    text = (ROOT / "docs" / "api.md").read_text()
    block = re.search(r"## Op schemas.*?```\n(.*?)```", text, re.S).group(1)
    documented = {}
    for line in block.strip().splitlines():
        schema = torch._C.parse_schema("kimi::" + line)
        documented[schema.name.split("::")[1]] = schema
    registered = sorted(n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("kimi::"))
    assert sorted(documented) == registered
    for name in registered:
        assert documented[name] == getattr(torch.ops.kimi, name).default._schema, name
