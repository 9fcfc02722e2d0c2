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


def _tree(root: Path, path: str, source: str) -> Path:
    """``root`` with the four packages and one module at ``path`` holding ``source``."""
    for pkg in PACKAGES:
        (root / pkg).mkdir()
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(source)
    return root


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
    assert (violations(_tree(tmp_path, f"{pkg}/mod.py", source)) == []) is ok


# test and benchmark code: the product's modules never import it, not even lazily
TEST_ONLY = ("local_verifier.testing", "tests")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, root: Path) -> set[str]:
    """Every module an import anywhere in ``path`` names (relative imports made absolute)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def imports_of_test_code(root: Path = ROOT) -> list[str]:
    """Every import of test or benchmark code from a product module."""
    bad: list[str] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            if _module_name(path, root).startswith("local_verifier.testing"):
                continue
            for module in sorted(_imported_modules(path, root)):
                if any(module == t or module.startswith(t + ".") for t in TEST_ONLY):
                    bad.append(f"{path.relative_to(root)} imports {module}")
    return bad


def test_the_product_does_not_import_test_code() -> None:
    assert imports_of_test_code() == []


@pytest.mark.parametrize(
    ("path", "source", "ok"),
    [
        ("local_verifier/engine.py", "from local_verifier.testing import generate\n", False),
        (
            "local_verifier/loader.py",
            "def f():\n    import local_verifier.testing.kv_cache\n",
            False,
        ),
        ("local_verifier/model.py", "from .testing.kv_cache import KVCache\n", False),
        ("local_verifier/model.py", "from . import testing\n", False),
        ("gateway/app.py", "def f():\n    from tests.conftest import x\n", False),
        ("local_verifier/model.py", "from local_verifier.kv_storage import KVStorage\n", True),
        (
            "local_verifier/testing/generate.py",
            "from local_verifier.testing import kv_cache\n",
            True,
        ),
    ],
)
def test_checker_catches_the_product_importing_test_code(
    tmp_path: Path, path: str, source: str, ok: bool
) -> None:
    assert (imports_of_test_code(_tree(tmp_path, path, source)) == []) is ok


def test_the_vllm_plugin_and_the_packages_import_nothing_of_each_other() -> None:
    """``integrations/vllm`` runs inside vLLM's own environment, where draftgate is not
    installed; the gateway speaks to it over the wire only."""
    plugin = ROOT / "integrations" / "vllm" / "draftgate_vllm"
    found = [
        (path.relative_to(ROOT), name)
        for path in sorted(plugin.rglob("*.py"))
        for name, _ in _imports(ast.parse(path.read_text(encoding="utf-8")))
        if name in PACKAGES
    ]
    found += [
        (path.relative_to(ROOT), name)
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
        for name, _ in _imports(ast.parse(path.read_text(encoding="utf-8")))
        if name == "draftgate_vllm"
    ]
    assert list(plugin.glob("*.py")) and found == []
