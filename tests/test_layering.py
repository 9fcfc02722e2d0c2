"""Dependencies between the four packages point one way only (README.md, Architecture)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "sdk", "lookup", "local_verifier")

# package -> the project packages it may import at module level
ALLOWED: dict[str, set[str]] = {
    "sdk": set(),
    "lookup": set(),
    "local_verifier": {"lookup"},
    "gateway": {"lookup", "sdk"},
}
# the gateway may import local_verifier only lazily (inside a function body)
LAZY_ONLY = {"gateway": {"local_verifier"}}


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in {
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    }


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(top-level package name, imported when the module loads?) for every import in the tree.

    Imports inside function bodies or ``if TYPE_CHECKING:`` blocks do not run at load time.
    """
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = (
                in_function
                or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                or _is_type_checking_block(child)
            )
            if isinstance(child, ast.Import):
                found.extend((a.name.split(".")[0], not in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module.split(".")[0], not in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def violations(root: Path = ROOT) -> list[str]:
    """Every import that points against the architecture's arrows."""
    bad: list[str] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for name, module_level in _imports(tree):
                if name not in PACKAGES or name == pkg or name in ALLOWED[pkg]:
                    continue
                if name in LAZY_ONLY.get(pkg, set()) and not module_level:
                    continue
                where = "module level" if module_level else "function body"
                bad.append(f"{path.relative_to(root)} imports {name} ({where})")
    return bad


def test_packages_import_along_the_arrows() -> None:
    assert violations() == []


@pytest.mark.parametrize(
    ("pkg", "source", "ok"),
    [
        ("lookup", "import gateway\n", False),
        ("sdk", "from local_verifier import engine\n", False),
        ("local_verifier", "from lookup import drafter\n", True),
        ("local_verifier", "import gateway.app\n", False),
        ("gateway", "import local_verifier\n", False),
        ("gateway", "def f():\n    import local_verifier\n", True),
        ("gateway", "from sdk.wire import ChatCompletion\n", True),
        (
            "gateway",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import local_verifier\n",
            True,
        ),
        (
            "lookup",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gateway\n",
            False,
        ),
    ],
)
def test_checker_catches_arrows_against_the_architecture(
    tmp_path: Path, pkg: str, source: str, ok: bool
) -> None:
    for p in PACKAGES:
        (tmp_path / p).mkdir()
    (tmp_path / pkg / "mod.py").write_text(source)
    assert (violations(tmp_path) == []) is ok
