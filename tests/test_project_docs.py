"""The documentation says what the code does: docs/ARCHITECTURE.md lists the schema, kinds and causes the code
declares, every relative link resolves, every reference from the code names a section that exists, and every
file, module, function, class and member the documents cite exists where they say."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from ppscope.analysis.result import CAUSES
from ppscope.trace.model import COUNTER_COLUMNS, REQUEST_COLUMNS, SPAN_COLUMNS, Metric, RunMeta, SpanKind

ROOT = Path(__file__).resolve().parents[1]
ARCH = ROOT / "docs" / "ARCHITECTURE.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SECTION_REF = re.compile(r'docs/ARCHITECTURE\.md,\s+"([^"]+)"')


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _headings(path: Path) -> list[str]:
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            lines.append(line.lstrip("#").strip())
    return lines


def _table(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header starts with `| first_header |`, cells stripped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _dtype_name(t: object) -> str:
    return "str" if t is str else np.dtype(t).name  # type: ignore[call-overload]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    for target in _LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.is_relative_to(ROOT), f"{doc.name}: {target} points outside the repository"
        assert dest.exists(), f"{doc.name}: {target} does not exist"
        if anchor:
            assert anchor in {_anchor(h) for h in _headings(dest)}, f"{doc.name}: no heading for #{anchor}"


def test_readme_links_the_architecture() -> None:
    assert "](docs/ARCHITECTURE.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("header", "columns"),
    [("column", SPAN_COLUMNS), ("column", COUNTER_COLUMNS), ("column", REQUEST_COLUMNS)],
    ids=["spans", "counters", "requests"],
)
def test_schema_tables_match_the_code(header: str, columns: dict[str, object]) -> None:
    text = ARCH.read_text(encoding="utf-8")
    first_row = text.index(f"| `{next(iter(columns))}` |")
    rows = _table(text[text.rindex(f"| {header} |", 0, first_row) :], header)  # the table that row opens
    documented = {r[0].strip("`"): r[1] for r in rows}
    assert list(documented) == list(columns)
    assert documented == {c: _dtype_name(t) for c, t in columns.items()}


def test_kinds_causes_metrics_and_metadata_are_documented() -> None:
    text = ARCH.read_text(encoding="utf-8")
    kinds = {c.strip().strip("`") for row in _table(text, "kind") for c in row[0].split(",")}
    assert kinds == {str(k) for k in SpanKind}
    causes = [r[0].strip("`") for r in _table(text, "cause")]
    assert causes == list(CAUSES)
    fields = [r[0].strip("`") for r in _table(text, "field")]
    assert fields == [f.name for f in dataclasses.fields(RunMeta)]
    for metric in Metric:
        assert f"`{metric}`" in text


def test_references_from_the_code_name_real_sections() -> None:
    sections = set(_headings(ARCH))
    found = 0
    for path in sorted((ROOT / "ppscope").rglob("*.py")):
        text = re.sub(r"\s*\n\s*", " ", path.read_text(encoding="utf-8"))  # a reference may wrap
        for name in _SECTION_REF.findall(text):
            found += 1
            assert name in sections, f"{path.relative_to(ROOT)} cites {name!r}, not a section of docs/ARCHITECTURE.md"
    assert found


def test_nothing_cites_a_document_outside_the_repository() -> None:
    outside = "DESIGN" + ".md"
    for path in [*DOCS, *sorted((ROOT / "ppscope").rglob("*.py"))]:
        assert outside not in path.read_text(encoding="utf-8"), path


# Code names the documents cite. The code (every `.py` file under CODE_DIRS) is read with `ast`, never imported.
# In README.md and docs/ARCHITECTURE.md each backquoted span is cut at white space (in code blocks, each `.py`
# path is taken), and each piece is checked by its form:
# - a path from a top folder (`ppscope/trace/store.py`, `benchmarks/RESULTS.md`, `ppscope/trace/`) exists, a glob
#   (`tests/test_formats_*.py`) matches a file; a `<placeholder>` is not checked;
# - a `.py` path or a folder under no top folder (`trace/store.py`, as the data-flow diagram writes it;
#   `measured/fit.py`; `commands/`) is one path under `ppscope/`, and a bare file name (`facts.py`) the name of one
#   file of the code: a name two files share is written with its folder. In a row of the parts table both are
#   taken under the row's folder instead (`test_the_parts_table_names_every_module`);
# - a dotted path from a top folder (`ppscope.balance.measured.insitu`, `benchmarks.gpu_check`,
#   `ppscope.analysis.analyze`): its longest prefix that is a module, then the next name a submodule or bound at
#   that module's top level (a function, class, assignment, import or `__all__` entry), and after a class a member
#   of it;
# - `module.name` (`analyzer.choose_window`, `analysis.pipeline`): some module of that last name defines the name
#   at its top level (imports do not count) or has it as a submodule, and a class named so has the member after;
# - `Class.member` (`Trace.sorted()`, `RunTail.poll`; `meta.status` for `RunMeta.status`): some class of that name
#   has the member: a method, a name or field of its body, an attribute its methods set on `self`, or a member of
#   a base class of the code;
# - `name(...)`: a builtin, or a function or class the code defines, at any depth;
# - a bare identifier that looks like code, with an underscore or a capital after a small letter (`stage_bubbles`,
#   `RankDigest`, `VLLM_PP_LAYER_PARTITION`), occurs in the code: a name bound or used, an attribute, an argument,
#   or a word of a string (a column, a key, an environment variable); other tools' names are in ELSEWHERE;
# - another dotted form (`torch.cuda`, `np.fromstring`, `meta.json`) is not checked, unless the name after the
#   first dot is a function or class the code defines: then the first names a module that is gone
#   (`kineto_groups.group_placement`), and it fails.
# A name the text places in a file (`` `name` in `file.py` ``, `` `Name` (`file.py` ``, `` `file.py` (`name`, ...) ``,
# `` `file.py`, `name` ``) is moreover defined at that file's top level, not imported, or is a member of the class
# named there (`test_names_placed_in_a_file_are_defined_there`).

CITING = [ROOT / "README.md", ARCH]
CODE_DIRS = ("ppscope", "tests", "benchmarks", "scripts", "examples")
_TOP_DIRS = {*CODE_DIRS, "docs"}
_SPAN = re.compile(r"`([^`]+)`")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_PY_IN_BLOCK = re.compile(r"[\w/]+\.py\b")
_PATH = re.compile(r"[\w*-][\w.*-]*(?:/[\w.*-]+)+/?|\w[\w-]*/")
_PY_FILE = re.compile(r"[\w-]+\.py")
_CHAIN = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_CALL = re.compile(r"([A-Za-z_]\w*)\(")
_IDENTIFIER = re.compile(r"(?=\w*(?:_|[a-z][A-Z]))[A-Za-z_]\w*")
_NAME = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?", re.S)
_CODE_LIKE = re.compile(r"[_.(A-Z]")  # `drain` (`steps.py`, ...) names a cause: a plain word is not placed
_DATA_FILE = re.compile(r"[\w.-]+\.(?:json|jsonl|md|toml|ya?ml|sqlite|gz|txt|html|csv|safetensors)")
INSTANCES = {"meta": "RunMeta"}
"""First names the documents give an instance, with its class: `meta.status` is `RunMeta.status`."""
NOT_CODE = {
    "config.max_inflight": "a key of `RunMeta.config`, not a name of `ppscope/engine/config.py`",
    "config.replica_placement": "a key of `RunMeta.config`, not a name of `ppscope/engine/config.py`",
    "schedule.step": "the method of torch's schedule object, not a name of `ppscope/simulate/schedule.py`",
    "training.from": "a key of `ppscope rebalance --json`, not a name of a module `training`",
    "device_count": "torch.cuda's",
    "histogram_quantile": "PromQL's",
}
"""Cited names that look like the code's but are not, with what they name."""
ELSEWHERE = {
    "GLOO_SOCKET_IFNAME": "torch's gloo backend reads it",
    "NCCL_SOCKET_IFNAME": "NCCL reads it",
    "mesh_cp": "a DeviceMesh group name in torch's traces",
    "balance_by_time": "torchgpipe's",
    "do_bench": "Triton's",
}
"""Identifiers the documents cite from other tools, with whose they are."""


@dataclasses.dataclass
class _Module:
    names: set[str] = dataclasses.field(default_factory=set)  # bound at the top level, imports included
    own: set[str] = dataclasses.field(default_factory=set)  # defined there: functions, classes, assignments
    classes: dict[str, ast.ClassDef] = dataclasses.field(default_factory=dict)
    submodules: set[str] = dataclasses.field(default_factory=set)
    external: set[str] = dataclasses.field(default_factory=set)  # names imported from outside the code


def _bind(body: list[ast.stmt], module: _Module) -> None:
    """The names a block binds at its own level, into `if` and `try` but not into functions or classes."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            module.own.add(node.name)
            if isinstance(node, ast.ClassDef):
                module.classes[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            module.own |= bound
            if "__all__" in bound and isinstance(node.value, (ast.List, ast.Tuple)):
                module.names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = {(a.asname or a.name).split(".")[0] for a in node.names}
            module.names |= bound
            source = (node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name
            if isinstance(node, ast.Import) or (node.level == 0 and source.split(".")[0] not in CODE_DIRS):
                module.external |= bound | {source.split(".")[0]}
        elif isinstance(node, ast.If):
            _bind(node.body + node.orelse, module)
        elif isinstance(node, ast.Try):
            _bind(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body], module)
    module.names |= module.own


class Code:
    """The repository's code as `ast` reads it: modules by dotted name and by last name, classes by name."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        here = Path(__file__).resolve()  # this module names what is gone on purpose
        self.files = [p for top in CODE_DIRS for p in sorted((root / top).rglob("*.py")) if p.resolve() != here]
        self.modules: dict[str, _Module] = {}
        self.defined: set[str] = set()  # every function and class, at any depth
        self.words: set[str] = set()  # every identifier, and every word of a string
        for path in self.files:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            module = _Module()
            _bind(tree.body, module)
            self.modules[_dotted_name(path.relative_to(root))] = module
            kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            self.defined.update(n.name for n in ast.walk(tree) if isinstance(n, kinds))
            self.words |= _words(tree)
        self.by_last: dict[str, list[_Module]] = {}
        self.classes: dict[str, list[ast.ClassDef]] = {}
        for dotted, module in self.modules.items():
            parent, _, last = dotted.rpartition(".")
            self.by_last.setdefault(last, []).append(module)
            if parent in self.modules:
                self.modules[parent].submodules.add(last)
            for name, cls in module.classes.items():
                self.classes.setdefault(name, []).append(cls)
        self.external = {n for m in self.modules.values() for n in m.external}
        self.top_defs = {n for m in self.modules.values() for n in m.own if n in self.defined}

    def members(self, cls: ast.ClassDef, seen: frozenset[str] = frozenset()) -> set[str]:
        """What a class defines: its body's names, the attributes its methods set on `self`, its bases' members."""
        body = _Module()
        _bind(cls.body, body)
        found = body.names | {
            n.attr
            for n in ast.walk(cls)
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
            if n.value.id in ("self", "cls")
        }
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            for other in [] if name in seen else self.classes.get(name, []):
                found |= self.members(other, seen | {cls.name})
        return found

    def has(self, module: _Module, rest: list[str], *, own: bool = False) -> bool:
        """Whether `rest` is a submodule or a top-level name of `module` (with `own`, one it defines rather than
        imports), and the name after a class a member of it."""
        if not rest or rest[0] in module.submodules:
            return True
        if rest[0] not in (module.own if own else module.names):
            return False
        cls = module.classes.get(rest[0])
        return cls is None or len(rest) == 1 or rest[1] in self.members(cls)

    def dotted(self, chain: str) -> bool:
        """A dotted path from a top folder: its longest prefix that is a module, then the rest in it."""
        parts = chain.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in self.modules:
                return self.has(self.modules[".".join(parts[:i])], parts[i:])
        return False

    def short(self, chain: str) -> tuple[str, bool] | None:
        """`module.name` or `Class.member`, and whether it resolves; None where the first name is not the code's."""
        first, second, *_ = parts = chain.split(".")
        first = INSTANCES.get(first, first)
        if first in self.by_last:
            return "module.name", any(self.has(m, parts[1:], own=True) for m in self.by_last[first])
        if first in self.classes:
            return "Class.member", any(second in self.members(c) for c in self.classes[first])
        if first in self.external or second not in self.top_defs:
            return None
        return "module.name of no module", False

    def files_named(self, piece: str, base: Path | None) -> list[Path]:
        """The files or folders a path under no top folder, or a bare file name, names: under `base` (a row of the
        parts table), else under `ppscope/` for a path and in all the code for a bare name."""
        if "/" not in piece:
            return sorted(base.rglob(piece)) if base else [p for p in self.files if p.name == piece]
        if base:
            return [base / piece] if (base / piece).exists() else []
        return sorted((self.root / "ppscope").glob("**/" + piece.rstrip("/")))

    def check(self, piece: str, base: Path | None = None) -> tuple[str, bool] | None:
        """The form of a cited piece and whether it resolves; None for a piece that names no code."""
        piece = piece.strip(",;:.()[]\"'")
        if "<" in piece:
            return None
        top = piece.split("/")[0] in _TOP_DIRS
        if _PATH.fullmatch(piece) and top:
            found = any(self.root.glob(piece.rstrip("/"))) if "*" in piece else (self.root / piece).exists()
            return "path", found
        if (_PATH.fullmatch(piece) and piece.endswith((".py", "/")) and piece[0] != ".") or _PY_FILE.fullmatch(piece):
            return "path under no top folder" if "/" in piece else "file name", len(self.files_named(piece, base)) == 1
        if _IDENTIFIER.fullmatch(piece):
            return "identifier", piece in self.words or piece in ELSEWHERE
        chain, call = _CHAIN.match(piece), _CALL.match(piece)
        if call and not chain and call.group(1) not in NOT_CODE:
            return "name(...)", hasattr(builtins, call.group(1)) or call.group(1) in self.defined
        if chain is None or _DATA_FILE.fullmatch(piece) or chain.group() in NOT_CODE:
            return None
        if chain.group().split(".")[0] in ("ppscope", "benchmarks", "tests", "scripts"):
            return "module path", self.dotted(chain.group())
        return self.short(chain.group())

    def defined_in(self, name: str, path: str) -> bool:
        """Whether `name` (`func`, `Class`, `Class.member`) is defined at the top level of the file `path`."""
        relative = Path(path) if path.split("/")[0] in _TOP_DIRS else None
        if relative is None:
            found = self.files_named(path, None)
            relative = found[0].relative_to(self.root) if len(found) == 1 else Path(path)
        module = self.modules.get(_dotted_name(relative))
        return module is not None and self.has(module, name.split("."), own=True)


def _words(tree: ast.AST) -> set[str]:
    """Every identifier a module binds or uses, and every word of its strings."""
    found = set()
    for node in ast.walk(tree):
        found.update(
            v for attr in ("name", "id", "attr", "arg", "asname") if isinstance(v := getattr(node, attr, None), str)
        )
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(re.findall(r"\w+", node.value))
    return found


def _dotted_name(relative: Path) -> str:
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _prose(text: str) -> str:
    """The text with its code blocks blanked, lines kept."""
    return _FENCE.sub(lambda m: "\n" * m.group().count("\n"), text)


def _parts_rows(text: str) -> dict[int, Path]:
    """The lines of the parts table's rows, with the folder each describes (`ppscope/` for the files' row)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| folder |"))
    rows = {}
    for i in range(start + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        head = _SPAN.findall(lines[i].split("|")[1])[0]
        rows[i + 1] = ROOT / head if head.endswith("/") else ROOT / "ppscope"
    return rows


def cited(path: Path) -> list[tuple[int, str, Path | None]]:
    """Each piece of each backquoted span outside code blocks, and each `.py` path in code blocks: its line, and
    the folder it is named in (a row of the parts table), else None."""
    text = path.read_text(encoding="utf-8")
    prose, rows = _prose(text), _parts_rows(text) if path == ARCH else {}
    found = []
    for block in _FENCE.finditer(text):
        first = text.count("\n", 0, block.start()) + 1
        for m in _PY_IN_BLOCK.finditer(block.group()):
            found.append((first + block.group().count("\n", 0, m.start()), m.group(), None))
    for m in _SPAN.finditer(prose):
        line = prose.count("\n", 0, m.start()) + 1
        base = rows.get(line) if prose.rfind("|", 0, m.start()) > prose.rfind("\n", 0, m.start()) else None
        found += [(line, piece, base) for piece in m.group(1).split()]
    return found


def placed_in_files(text: str) -> list[tuple[int, str, str]]:
    """(line, name, file) for each name the text places in a `.py` file, by the four forms above."""
    prose = _prose(text)
    spans = list(_SPAN.finditer(prose))
    texts = [m.group(1) for m in spans]
    between = [prose[a.end() : b.start()] for a, b in itertools.pairwise(spans)] + [""]

    def line(i: int) -> int:
        return prose.count("\n", 0, spans[i].start()) + 1

    def name(i: int) -> str | None:
        m = _NAME.fullmatch(texts[i]) if i < len(texts) else None
        return m.group(1) if m else None

    def is_file(i: int) -> bool:
        return i < len(texts) and texts[i].endswith(".py") and "/" in texts[i] and "<" not in texts[i]

    def placed_by_in(i: int) -> bool:  # `name` in `file.py`
        return re.fullmatch(r"\s+in\s+", between[i]) is not None and is_file(i + 1)

    found = set()
    for i in range(len(spans)):
        paren = _CODE_LIKE.search(texts[i]) and re.fullmatch(r"\s+\(", between[i])  # `Name` (`file.py`
        if name(i) and (placed_by_in(i) or paren) and is_file(i + 1):
            found.add((line(i), name(i), texts[i + 1]))
        if not is_file(i):
            continue
        if re.fullmatch(r",\s+", between[i]) and name(i + 1) and not placed_by_in(i + 1):
            found.add((line(i + 1), name(i + 1), texts[i]))  # `file.py`, `name`
        depth, current, j = 1 if re.fullmatch(r"\s*\(", between[i]) else 0, texts[i], i + 1
        while depth > 0 and j < len(texts):  # `file.py` (`name`, ..., `other.py`, `its_name`, ...)
            if is_file(j):
                current = texts[j]
            elif name(j) and not placed_by_in(j):
                found.add((line(j), name(j), current))
            depth += between[j].count("(") - between[j].count(")")
            j += 1
    return sorted(found)


@pytest.fixture(scope="module")
def code() -> Code:
    return Code()


@pytest.mark.parametrize("doc", CITING, ids=lambda p: p.name)
def test_every_cited_code_name_exists(doc: Path, code: Code) -> None:
    checked = [(line, piece, code.check(piece, base)) for line, piece, base in cited(doc)]
    missing = [f"{doc.name}:{line}: {r[0]} `{piece}`" for line, piece, r in checked if r is not None and not r[1]]
    assert len([r for *_, r in checked if r is not None]) > 10
    assert not missing, "cited, not in the code (or, for a file name, in more than one file):\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", CITING, ids=lambda p: p.name)
def test_names_placed_in_a_file_are_defined_there(doc: Path, code: Code) -> None:
    wrong = [
        f"{doc.name}:{n}: `{name}` in `{file}`"
        for n, name, file in placed_in_files(doc.read_text(encoding="utf-8"))
        if not code.defined_in(name, file)
    ]
    assert not wrong, "not defined at the top level of the file cited:\n" + "\n".join(wrong)


def test_the_parts_table_names_every_module(code: Code) -> None:
    """Every module of the package but an `__init__.py` is named in the parts table, in its folder's row (or in the
    files' row); each `.py` name there resolves in its row's folder, as `test_every_cited_code_name_exists` checks."""
    named = set()
    for _, piece, base in cited(ARCH):
        piece = piece.strip(",;:.()")
        if base is not None and piece.endswith(".py"):
            named.update(code.files_named(piece, base) if not piece.startswith("ppscope/") else [ROOT / piece])
    modules = [p for p in sorted((ROOT / "ppscope").rglob("*.py")) if p.name != "__init__.py"]
    unnamed = [str(p.relative_to(ROOT)) for p in modules if p not in named]
    assert not unnamed, f"modules the parts table does not name: {unnamed}"


def test_the_function_cap_the_parts_give_is_the_one_tested() -> None:
    """The parts say how long a function may be: the number `tests/test_project_package.py` holds the package to."""
    tree = ast.parse((ROOT / "tests" / "test_project_package.py").read_text(encoding="utf-8"))
    (cap,) = [
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "MAX_FUNCTION_LINES"
        if isinstance(n.value, ast.Constant)
    ]
    parts = ARCH.read_text(encoding="utf-8").split("## The parts")[1].split("\n## ")[0]
    assert f"A function has one, {cap} lines" in parts


def test_the_checks_catch_names_that_are_gone(code: Code) -> None:
    """What the move of the formats and balance parts into folders left stale in the documents fails the checks."""
    gone = [
        "ppscope/formats/kineto.py",  # now ppscope/formats/kineto/reader.py
        "formats/nsys_import.py",  # as the data-flow diagram wrote it
        "kineto_json.py",
        "advice.py",  # two files: the dashboard's page and the balance's advice
        "ppscope.balance.runcosts",  # now ppscope.balance.measured.choose
        "analyzer._choose_window",  # now public
        "analyzer.Facts",  # imported by the analyzer, defined in facts.py
        "kineto_groups.group_placement",  # now groups.group_placement
        "Trace.no_such_member",
        "no_such_function(x)",
        "_choose_window",
    ]
    assert [piece for piece in gone if (code.check(piece) or ("", True))[1]] == []
    there = ["ppscope/formats/kineto/reader.py", "measured/fit.py", "facts.py", "ppscope.balance.measured.choose"]
    there += ["analyzer.choose_window", "facts.Facts", "groups.group_placement", "Trace.sorted()", "ppscope.RunTail"]
    assert [piece for piece in there if not (code.check(piece) or ("", False))[1]] == []
    placed = placed_in_files("the fit (`fit_layer_costs` in `ppscope/balance/costs.py`)")
    assert placed == [(1, "fit_layer_costs", "ppscope/balance/costs.py")]
    assert not code.defined_in("fit_layer_costs", "ppscope/balance/costs.py")
    assert code.defined_in("fit_layer_costs", "ppscope/balance/measured/fit.py")
