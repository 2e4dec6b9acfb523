"""The repository stands on its own: what its docs name exists, and nothing points outside it.

* Every repository path that docs/architecture.md, docs/interfaces.md and README.md name (in backticks or
  as a Markdown link, with its #anchor) exists, and docs/interfaces.md has every FFI target csrc/ registers.
* Every citation of a doc section (`docs/numerics.md "Float32 range"`, `[numerics.md](numerics.md) "Quantize"`)
  names an existing page that holds that text.
* No file in jax_mxfp8/, csrc/, tests/ or docs/ (the journal docs/perf/journal/ aside) names a document that
  is not in the repository (the team briefing, the old interface notes), an absolute machine path, or work
  history ("session 9", "round A", "W2 3/6", "issue 17", "wave 2"): code and docs state what is.

CPU only, reads text files.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("jax_mxfp8", "csrc", "tests", "docs")
JOURNAL = "docs/perf/journal/"  # history belongs there
TEXT_SUFFIXES = {".py", ".md", ".cc", ".h", ".txt", ".toml", ".map", ".inc", ".cfg", ".ini", ".sh", ".bzl"}
SKIP_DIRS = {"__pycache__", "_lib", ".pytest_cache"}
SELF = Path(__file__).resolve()


# Documents outside the repository that files used to cite (spelled so that this file does not match).
OUTSIDE_DOCS = re.compile("DESIGN" + r"\.md|GEMM_" + "INTERFACE|ATTN_BWD_" + "INTERFACE")
# An absolute path of one machine: /work/..., /root/..., /tmp/... (not a URL's path, not $OUT/...).
ABSOLUTE_PATH = re.compile(r"(?<![\w.~$/:-])/(?:work|root|home|tmp|src|mnt|scratch)/")
HISTORY = (
    re.compile(r"\b[Ss]essions? \d+"),  # "session 9"
    re.compile(r"\brounds? [A-Z](?:/[A-Z])?\b"),  # "round A", "rounds A/B" (case-sensitive: not "round a")
    re.compile(r"\bW\d+ \d+/\d+\b"),  # "W2 3/6"
    re.compile(r"\b[Ii]ssues? #?\d+"),  # "issue 17"
    re.compile(r"\b[Ww]ave \d+\b"),  # "wave 2"
)

TOP_LEVEL = ("jax_mxfp8", "csrc", "tests", "docs", "examples", "tools", "benchmarks", "third_party")
TOP_FILES = ("BUILD.bazel", "WORKSPACE", "pyproject.toml", "README.md")
BUILT = ("jax_mxfp8/_lib/", "build/", "dist/", "bazel-bin/", ".venv-build/")  # build outputs, git-ignored
PATH_EXTENSIONS = (".py", ".cc", ".h", ".md", ".json", ".toml", ".txt", ".png", ".map", ".inc", ".bazel")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@functools.cache
def _scanned_files() -> tuple[Path, ...]:
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or path.suffix not in TEXT_SUFFIXES or path.resolve() == SELF:
                continue
            if SKIP_DIRS & set(path.relative_to(ROOT).parts) or _rel(path).startswith(JOURNAL):
                continue
            out.append(path)
    return tuple(out)


def _offences(path: Path) -> list[str]:
    """'file:line: what' for every outside pointer and history marker in a file."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        found = [m.group(0) for rx in (OUTSIDE_DOCS, ABSOLUTE_PATH, *HISTORY) for m in rx.finditer(line)]
        out += [f"{_rel(path)}:{n}: {text!r}" for text in found]
    return out


def test_history_patterns_catch_markers_and_spare_ordinary_words():
    """The patterns are precise: each marker is caught, ordinary prose is not."""
    caught = ["session 9", "Session 10", "round A", "rounds A/B", "W2 3/6", "issue 17", "Issue 16 item 5", "wave 2"]
    for text in caught:
        assert any(rx.search(text) for rx in HISTORY), text
    spared = [
        "the sessions of a user",
        "round to nearest even",
        "rounded once per tile",
        "around a ring",
        "round E4M3 values",
        "an issue with the layout",
        "W2 = W1 / 2",
        "a wave of 132 CTAs",
        "waves 15.5",
    ]
    for text in spared:
        assert not any(rx.search(text) for rx in HISTORY), text
    assert ABSOLUTE_PATH.search("see /work/shared/x.md") and ABSOLUTE_PATH.search("--out /tmp/p.json")
    assert not ABSOLUTE_PATH.search("https://github.com/NVIDIA/cutlass/tree/main/src/x") and not ABSOLUTE_PATH.search(
        "$OUT/tmp/x"
    )


def test_no_outside_pointers_or_history():
    """jax_mxfp8/, csrc/, tests/, docs/ (the journal aside): no outside document, machine path or history."""
    bad = [o for p in _scanned_files() for o in _offences(p)]
    assert not bad, "\n".join([f"{len(bad)} outside pointers / work-history markers:", *bad])


# ------------------------------------------------------------------------------------- paths in the docs
def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def _anchors(path: Path) -> frozenset[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return frozenset(_slug(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line))


def _path_exists(token: str) -> bool:
    if any(ch in token for ch in "*?["):
        return any(ROOT.glob(token))
    return (ROOT / token).exists()


def _named_paths(text: str, *, full_paths_only: bool) -> set[str]:
    """Repository paths in backticks: tokens under a top-level folder, top-level files, and (full_paths_only)
    every token with a file extension, which must then be a path from the root."""
    names = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for word in span.split():
            word = word.strip("()[],;:'\"")
            if not re.fullmatch(r"[\w.\-/*]+", word) or word.startswith(BUILT):
                continue
            top = word.split("/", 1)[0]
            if (top in TOP_LEVEL and "/" in word) or word in TOP_FILES:
                names.add(word)
            elif full_paths_only and word.endswith(PATH_EXTENSIONS) and not word.startswith("."):
                names.add(word)
    return names


def _links(doc: Path) -> list[tuple[str, str]]:
    """(target file relative to the root, anchor) of every relative Markdown link in `doc`."""
    out = []
    text = re.sub(r"`[^`\n]*`", "", doc.read_text(encoding="utf-8"))  # no links inside code spans
    for target in re.findall(r"\]\(([^()\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (doc.parent / file).resolve() if file else doc.resolve()
        out.append((resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(resolved), anchor))
    return out


def _check_doc(rel: str, *, full_paths_only: bool) -> list[str]:
    doc = ROOT / rel
    text = doc.read_text(encoding="utf-8")
    names = sorted(_named_paths(text, full_paths_only=full_paths_only))
    missing = [f"{rel}: `{name}` does not exist" for name in names if not _path_exists(name)]
    for target, anchor in _links(doc):
        if not (ROOT / target).exists():
            missing.append(f"{rel}: link to {target} does not exist")
        elif anchor and target.endswith(".md") and anchor not in _anchors(ROOT / target):
            missing.append(f"{rel}: link to {target}#{anchor}: no such heading")
    return missing


@pytest.mark.parametrize("rel", ["docs/architecture.md", "docs/interfaces.md"])
def test_every_path_in_the_architecture_docs_exists(rel):
    """Every backticked path (from the repository root) and every link of the op map and the FFI tables."""
    missing = _check_doc(rel, full_paths_only=True)
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("rel", ["README.md", "docs/numerics.md", "docs/build.md", "docs/distributed.md",
                                 "docs/attention-reference.md", "docs/perf/README.md", "docs/perf/quantize.md",
                                 "docs/perf/gemm.md", "docs/perf/attention-forward.md",
                                 "docs/perf/attention-backward.md", "docs/perf/training.md",
                                 "docs/what-runs-where.md", "docs/examples.md", "docs/diagnostics.md",
                                 "docs/testing.md", "docs/perf/removed-variants.md", "benchmarks/results/README.md",
                                 "tests/README.md"])  # fmt: skip
def test_every_path_under_a_top_level_folder_in_the_other_docs_exists(rel):
    """Backticked paths that start at a top-level folder (jax_mxfp8/..., tests/..., benchmarks/...) and links."""
    missing = _check_doc(rel, full_paths_only=False)
    assert not missing, "\n".join(missing)


def test_interfaces_cover_every_registered_ffi_target():
    targets = {t for cc in (ROOT / "csrc").glob("*.cc") for t in re.findall(
        r"JMX_REGISTER_FFI_TARGET\((\w+)\)", cc.read_text(encoding="utf-8"))}  # fmt: skip
    assert len(targets) > 10, targets
    interfaces = (ROOT / "docs/interfaces.md").read_text(encoding="utf-8")
    missing = sorted(t for t in targets if f"`{t}`" not in interfaces)
    assert not missing, f"docs/interfaces.md has no entry for {missing}"


# --------------------------------------------------------------------------------- section citations
CODE_CITATION = re.compile(r"\bdocs/([\w\-/]+\.md)[,;]? \"([^\"\n]+)\"")
LINK_CITATION = re.compile(r"\]\(([\w\-/.]+\.md)\)((?: (?:\"[^\"\n]+\",?)(?: and)?)+)")


def _citations() -> list[tuple[str, str, str]]:
    """(citing file:line, cited doc relative to the root, quoted title) for every section citation."""
    out = []
    for path in _scanned_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            where = f"{_rel(path)}:{n}"
            out += [(where, f"docs/{doc}", title) for doc, title in CODE_CITATION.findall(line)]
            if path.suffix == ".md":
                for doc, titles in LINK_CITATION.findall(line):
                    target = (path.parent / doc).resolve()
                    rel = target.relative_to(ROOT).as_posix() if target.is_relative_to(ROOT) else str(target)
                    out += [(where, rel, t) for t in re.findall(r"\"([^\"\n]+)\"", titles)]
    return out


def test_cited_doc_sections_exist():
    """`docs/numerics.md "Float32 range"`: the page exists and holds that text (a heading or a bold term)."""
    citations = _citations()
    assert len(citations) > 10
    bad = []
    for where, doc, title in citations:
        path = ROOT / doc
        if not path.exists():
            bad.append(f"{where}: {doc} does not exist")
        elif title not in path.read_text(encoding="utf-8"):
            bad.append(f"{where}: {doc} has no section {title!r}")
    assert not bad, "\n".join(bad)
