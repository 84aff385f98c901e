"""Small modules: none over 450 lines, and no function over 80 lines in the extender's
and the agent's request paths (everything there but the CLI command modules)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("extender", "agent", "contracts", "planner", "predictor", "tandem", "lab")
REQUEST_PATH_PACKAGES = ("extender", "agent")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _modules(packages: tuple[str, ...]) -> list[Path]:
    """Every .py file under ``packages``, generated protobuf stubs (``*_pb2*.py``) excepted."""
    return sorted(
        p for pkg in packages for p in (ROOT / pkg).rglob("*.py") if "_pb2" not in p.name
    )


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def line_count(text: str) -> int:
    """Lines as ``wc -l`` counts them for a file that ends with a newline."""
    return len(text.splitlines())


def long_functions(source: str, limit: int) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function or method, nested ones included,
    whose ``def`` through its last line spans more than ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.name, node.lineno, length))
    return sorted(found, key=lambda f: f[1])


def test_every_package_has_modules_to_check() -> None:
    """A moved or misspelt package must not make the checks below pass vacuously."""
    for pkg in PACKAGES:
        assert (ROOT / pkg / "__init__.py") in _modules((pkg,)), pkg


def test_no_module_is_over_the_line_limit() -> None:
    over = {
        _rel(p): n
        for p in _modules(PACKAGES)
        if (n := line_count(p.read_text(encoding="utf-8"))) > MAX_MODULE_LINES
    }
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by responsibility): {over}"


def test_no_request_path_function_is_over_the_line_limit() -> None:
    over = {
        _rel(p): found
        for p in _modules(REQUEST_PATH_PACKAGES)
        if p.name != "commands.py"
        and (found := long_functions(p.read_text(encoding="utf-8"), MAX_FUNCTION_LINES))
    }
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (name, line, length): {over}"


def test_long_function_finder_counts_methods_nested_and_async_functions() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(80))  # def line + 80 = 81 lines
    source = (
        f"def long():\n{body}\n\n"
        f"def short():\n    return 1\n\n"
        f"class C:\n    async def method(self):\n{body.replace('    ', '        ')}\n\n"
        f"def outer():\n    def inner():\n{body.replace('    ', '        ')}\n    return inner\n"
    )
    found = long_functions(source, MAX_FUNCTION_LINES)
    assert [(name, length) for name, _, length in found] == [
        ("long", 81),
        ("method", 81),
        ("outer", 83),
        ("inner", 81),
    ]
    assert long_functions(source, 83) == []
