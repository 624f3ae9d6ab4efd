"""The documentation's links resolve, and the README stays a front page (issue 46, item 8).

Every relative markdown link `[text](path#anchor)` in README.md, docs/*.md and examples/*/README.md names a file
or folder of the repository, and its `#anchor` a heading of the target, by GitHub's rule (lowercase, spaces to
`-`, punctuation but `-` and `_` dropped; a repeated heading gets `-1`, `-2`, ...). http(s) links and links inside
code (fenced blocks, inline spans) are not checked. Torch-free, reads text only."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

README_MAX_LINES = 300
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("examples/*/README.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def prose_lines_raw(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, as written (headings keep their code spans)."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def prose_lines(text: str) -> list[tuple[int, str]]:
    """prose_lines_raw with inline code spans blanked (a link inside one is not a link)."""
    return [(n, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: "x" * len(m.group(0)), line))
            for n, line in prose_lines_raw(text)]


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines_raw(path.read_text()):
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def broken_links(files: list[Path], root: Path = REPO) -> list[str]:
    """Every relative link of `files` that names no file or folder under `root` (or one under root/shared), or an
    anchor that no heading of its markdown target has."""
    root = root.resolve()
    problems = []
    for f in files:
        for n, line in prose_lines(f.read_text()):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto, ...
                    continue
                where = f"{f.resolve().relative_to(root)}:{n}: ({target})"
                path, _, anchor = target.partition("#")
                dest = (f.parent / path).resolve() if path else f.resolve()
                if root not in (dest, *dest.parents):
                    problems.append(f"{where}: outside the repository")
                elif root / "shared" in (dest, *dest.parents):
                    problems.append(f"{where}: into shared/")
                elif not dest.exists():
                    problems.append(f"{where}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(root)}")
    return problems


def test_the_slug_rule():
    assert slug("Real checkpoints: `model=qwen`") == "real-checkpoints-modelqwen"
    assert slug("Comparing runs: `python -m harness.report`") == "comparing-runs-python--m-harnessreport"
    assert slug("Runs on a cluster: signals, pause, exit codes") == "runs-on-a-cluster-signals-pause-exit-codes"
    assert slug("Batch semantics (every RL arm)") == "batch-semantics-every-rl-arm"


def test_every_relative_link_and_anchor_resolves():
    files = doc_files()
    assert len(files) > 10
    assert broken_links(files) == []


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "x.md").write_text("# x\n")
    (tmp_path / "README.md").write_text("# harness\n")
    (tmp_path / "docs" / "arms.md").write_text("# Arms\n\n## Batch semantics (every RL arm)\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# A page\n\n## Twice\n\n## Twice\n\n"
                    "[ok](arms.md#batch-semantics-every-rl-arm) [ok](#twice-1) [ok](../README.md) [ok](https://x.org/y) "
                    "[code is skipped: `[x](nowhere.md)`]\n\n```\n[x](nowhere.md)\n```\n\n"
                    "[bad](nowhere.md) [bad](arms.md#no-such-heading) [bad](#twice-2) [bad](../shared/x.md) "
                    "[bad](../../x.md)\n")
    problems = broken_links([page], root=tmp_path)
    assert [p.split(": ", 2)[1] for p in problems] == [
        "(nowhere.md)", "(arms.md#no-such-heading)", "(#twice-2)", "(../shared/x.md)", "(../../x.md)"], problems


def test_the_readme_is_a_front_page():
    text = (REPO / "README.md").read_text()
    assert text.startswith("# harness\n\n```bash\n./run.sh\n./test.sh\n```\n\nThe first runs the default job")
    assert len(text.splitlines()) <= README_MAX_LINES
    # where debug=tiny is introduced, what it shows: the policy abstains everywhere, and the run says so
    tiny = text[text.index("`debug=tiny` makes any arm finish in about 20 s"):]
    assert "NO SIGNAL" in tiny[:2000] and "abstain" in tiny[:2000]


def test_the_readme_and_the_docs_index_list_every_page():
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md")
    readme, index = (REPO / "README.md").read_text(), (REPO / "docs" / "README.md").read_text()
    assert [p for p in pages if f"](docs/{p})" not in readme] == []
    assert [p for p in pages if f"]({p})" not in index] == []


def test_the_readme_repeats_the_documented_qwen_pipeline_check():
    """The front page's copy of the Qwen pipeline check is the one tests/integration/test_readme_qwen.py runs."""
    doc = (REPO / "docs" / "real-checkpoints.md").read_text()
    block = re.search(r"```bash\n(.*?)```", doc[doc.index("What the random-weight fixture does"):], re.S).group(1)
    readme = {" ".join(line.split()) for line in (REPO / "README.md").read_text().splitlines()}
    assert [line for line in block.splitlines() if " ".join(line.split()) not in readme] == []
