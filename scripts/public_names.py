"""Write, in every package's `__init__`, the table of the names other parts of ppscope import from its modules.

    python scripts/public_names.py          # print each package's names and where they live
    python scripts/public_names.py --write  # rewrite the tables (between the `# public names` markers)

A name a package lists beyond what the parts import (one it hands to users) is kept, unless its module lost it.
`tests/test_project_package.py` fails when a table misses a name; this script is how to bring them up to date.
Run `ruff check --fix` after it: the sort of the imports is ruff's.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "# public names: what other parts import (scripts/public_names.py)\n", "# end of public names\n"


def packages() -> list[str]:
    return sorted(str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "ppscope").rglob("__init__.py"))


def imported() -> dict[str, dict[str, str]]:
    """package -> {name: module inside it} of every `from package.module import name` made outside it."""
    pkgs = packages()
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for path in (ROOT / "ppscope").rglob("*.py"):
        here = str(path.relative_to(ROOT).with_suffix("")).replace("/", ".")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            owner = max((p for p in pkgs if node.module.startswith(p + ".")), key=len, default=None)
            if owner is None or here == owner or here.startswith(owner + "."):
                continue
            module = node.module[len(owner) + 1 :]
            submodules = {p.stem for p in (ROOT / owner.replace(".", "/")).iterdir()}
            for alias in node.names:
                if alias.name not in submodules:  # a name that is also a module's stays the module's
                    found[owner][alias.name] = module
    return found


def table(package: str, where: dict[str, str]) -> str:
    """The block: the names and their modules, typed for the checker, loaded on first use at run time."""
    rows = "".join(f'    "{name}": "{module}",\n' for name, module in sorted(where.items()))
    # one import a line, `name as name` (an explicit re-export); ruff's import sort orders them
    typed = "".join(f"    from {package}.{module} import {name} as {name}\n" for name, module in sorted(where.items()))
    return (
        BEGIN
        + "if TYPE_CHECKING:\n"
        + typed
        + "\n_WHERE = {\n"
        + rows
        + "}\n__all__ = sorted(_WHERE)\n__getattr__, __dir__ = public_names(__name__, _WHERE)\n"
        + END
    )


def defined(package: str, module: str) -> set[str]:
    """The names `package.module` binds at its top level (a name listed that its module lost is dropped)."""
    path = ROOT / package.replace(".", "/") / f"{module}.py"
    return _bound(ast.parse(path.read_text()).body) if path.exists() else set()


def _bound(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            names |= _bound([*node.body, *node.orelse, *getattr(node, "finalbody", [])])
            for handler in getattr(node, "handlers", []):
                names |= _bound(handler.body)
    return names


def current(text: str) -> dict[str, str]:
    if BEGIN not in text:
        return {}
    block = text[text.index(BEGIN) : text.index(END)]
    tree = ast.parse(block)
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_WHERE":
            return dict(ast.literal_eval(node.value))
    return {}


def main() -> int:
    write = "--write" in sys.argv
    for package, where in sorted(imported().items()):
        init = ROOT / package.replace(".", "/") / "__init__.py"
        text = init.read_text()
        merged = {n: m for n, m in {**current(text), **where}.items() if n in defined(package, m)}
        if not write:
            print(package, merged)
            continue
        block = table(package, merged)
        if BEGIN in text:
            text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
        else:
            text = (
                text.rstrip("\n")
                + "\n\nfrom typing import TYPE_CHECKING\n\nfrom ppscope.exports import public_names\n\n"
                + block
            )
        init.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
