"""The report's code in two layers: the analysis (ddp_core/analysis) below the pages (ddp_core/report), and what
measures and trains (the benchmarks, the engine, the launchers, the study runner) independent of the pages."""

import ast

from conftest import REPO


def imported_modules(path) -> set[str]:
    """Every module a Python file imports, at its top or inside a function, but for annotations alone (under
    `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_neither_the_analysis_nor_what_measures_and_trains_imports_a_page():
    below = [
        *(REPO / "ddp_core").glob("*.py"),
        *(REPO / "benchmarks").rglob("*.py"),
        *(REPO / "book" / "_ext").glob("*.py"),
        *(
            path
            for folder in ("analysis", "engine", "launch", "bench", "studies")
            for path in (REPO / "ddp_core" / folder).glob("*.py")
        ),
    ]
    assert len(below) > 40 and (REPO / "ddp_core" / "analysis" / "results.py") in below
    offenders = {
        str(path.relative_to(REPO)): sorted(m for m in imported_modules(path) if m.startswith("ddp_core.report"))
        for path in below
    }
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_a_page_imports_no_other_page():
    """What a page shares with another (the key findings quote every chapter) lives in the analysis layer."""
    pages = [path for path in (REPO / "ddp_core" / "report").glob("*.py") if path.stem not in ("__init__", "page")]
    assert {"intro", "nodes", "gpu"} <= {path.stem for path in pages}
    offenders = {
        path.stem: sorted(
            m
            for m in imported_modules(path)
            if m.startswith("ddp_core.report") and m not in ("ddp_core.report", "ddp_core.report.page")
        )
        for path in pages
    }
    assert {page: modules for page, modules in offenders.items() if modules} == {}


def test_the_modules_import_each_other_without_a_circle():
    modules = {
        f"ddp_core.{path.parent.name}.{path.stem}": path
        for folder in ("analysis", "report", "engine", "launch", "studies", "bench")
        for path in (REPO / "ddp_core" / folder).glob("*.py")
        if path.stem != "__init__"
    }
    graph = {name: {m for m in imported_modules(path) if m in modules and m != name} for name, path in modules.items()}
    done, path = set(), []

    def visit(name):
        assert name not in path, f"an import circle: {' -> '.join(path[path.index(name) :] + [name])}"
        if name in done:
            return
        path.append(name)
        for imported in sorted(graph[name]):
            visit(imported)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_no_function_of_ddp_core_takes_more_than_eight_parameters():
    """Values go by name in a dataclass past eight (`Placement`, `NodeLinks`): a call a reader can follow."""

    def parameters(function) -> int:
        args = function.args
        named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        return len([a for a in named if a.arg not in ("self", "cls")]) + bool(args.vararg) + bool(args.kwarg)

    over = [
        f"{path.relative_to(REPO)}:{node.name}"
        for path in (REPO / "ddp_core").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameters(node) > 8
    ]
    assert over == []
