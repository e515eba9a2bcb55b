"""docs/architecture.md names every module, so a newcomer finds the file for any concept from it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_imports import declared_layers

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_is_on_the_architecture_map():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for path in sorted((ROOT / "kvviz").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" and rel.count("/") > 1:
            rel = rel.rsplit("/", 1)[0] + "/"  # a package: its folder
        elif path.name in ("__init__.py", "__main__.py"):
            continue
        folder, name = rel.rsplit("/", 1) if not rel.endswith("/") else (rel, "")
        named = rel in doc or (f"{folder}/" in doc and name in doc)
        if path.parent.name == "ui" and name.startswith("tab_"):
            named = named or "tab_*.py" in doc
        if not named:
            missing.append(rel)
    assert not missing, f"docs/architecture.md does not mention: {missing}"


def test_the_map_draws_the_packages_in_the_layer_order():
    """The diagram's top-level boxes appear in the order tests/test_imports.py enforces on the imports."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    diagram = doc[doc.index("```\n") : doc.index("```\n", doc.index("```\n") + 4)]
    level = {u: i for i, line in enumerate(declared_layers(doc)) for u in line}
    drawn = [m.group(1) for m in re.finditer(r"^(?:Trace ──► )?kvviz/(\w+)", diagram, re.M)]
    levels = [level[u] for u in drawn if u in level]
    assert levels == sorted(levels), f"boxes drawn out of the layer order: {drawn}"
    assert len(levels) >= 10


def test_the_glossary_defines_the_projects_own_words():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    glossary = doc[doc.index("### Glossary") : doc.index("### Where is")]
    for word in ("engine", "paged start-up", "room", "show-me", "few rows", "Trace"):
        assert f"| {word} |" in glossary, word
