"""The package layout is the architecture (ARCHITECTURE.md): every module's imports, read with ast,
go down the layers only; plotly and ipywidgets stay in ``show``; the top level stays small."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "parallel_lab"

# Lowest first. A unit may import only units of a lower layer (and itself); units on one layer are
# independent of each other.
LAYERS = (
    ("__init__", "checks", "i18n"),
    ("hardware", "models"),
    ("runtime",),
    ("tensor", "pipeline", "zero", "moe", "context"),
    ("planning",),
    ("parallel3d",),
    ("exercises",),
    ("course",),
    ("bench", "show", "service"),
    ("doctor",),
    ("cli",),
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
DRAWING = ("plotly", "ipywidgets", "IPython.display", "anywidget")


def modules():
    """{dotted module name: path} of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def unit_of(module: str) -> str:
    """``parallel_lab.pipeline.executor`` -> ``pipeline``; ``parallel_lab.cli`` -> ``cli``."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def imports(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, at any depth, relative ones resolved."""
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.lineno))
            # `from parallel_lab.pipeline import stages` imports the module parallel_lab.pipeline.stages
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def edges():
    """(importer module, imported package module, line) for every import of the package by itself."""
    known = modules()
    out = []
    for module, path in known.items():
        for target, line in imports(module, path):
            if target in known:
                out.append((module, target, line))
    return out


def test_the_top_level_holds_at_most_six_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 6, top
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert set(folders) | {p[:-3] for p in top} <= set(RANK), "a new unit needs its place in LAYERS"


def test_imports_go_down_the_layers_only():
    wrong = [f"{a} (line {line}) imports {b}: {unit_of(a)} (layer {RANK[unit_of(a)]}) may not import "
             f"{unit_of(b)} (layer {RANK[unit_of(b)]})"
             for a, b, line in edges()
             if unit_of(a) != unit_of(b) and RANK[unit_of(b)] >= RANK[unit_of(a)]]
    assert not wrong, "\n".join(wrong)


def test_no_cycle_between_units():
    graph: dict[str, set[str]] = {}
    for a, b, _ in edges():
        if unit_of(a) != unit_of(b):
            graph.setdefault(unit_of(a), set()).add(unit_of(b))

    def visit(node, path):
        assert node not in path, f"import cycle between units: {' -> '.join(path + [node])}"
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])

    for unit in sorted(graph):
        visit(unit, [])


def test_only_show_draws_and_nothing_outside_it_imports_show():
    drawing = [f"{m} (line {line}) imports {t}" for m, path in modules().items()
               if unit_of(m) not in ("show", "doctor")
               for t, line in imports(m, path) if t.split(".")[0] in {d.split(".")[0] for d in DRAWING}]
    assert not drawing, "\n".join(drawing)
    into_show = [f"{a} imports {b}" for a, b, _ in edges() if unit_of(b) == "show" and unit_of(a) != "show"]
    assert not into_show, "\n".join(into_show)


def test_the_checker_sees_an_upward_import(tmp_path):
    """The checks above can fail: an engine module that imports a lesson picture is caught."""
    path = tmp_path / "executor.py"
    path.write_text("from parallel_lab.show import pipeline\nfrom ..planning import cost\n")
    found = [t for t, _ in imports("parallel_lab.pipeline.executor", path)]
    assert "parallel_lab.show.pipeline" in found and "parallel_lab.planning.cost" in found
    assert RANK[unit_of("parallel_lab.show.pipeline")] > RANK[unit_of("parallel_lab.pipeline.executor")]


def test_every_parallel_lab_name_in_the_text_exists():
    """Names written in lessons, docs, docstrings and quiz banks (``parallel_lab.pipeline.simulate``,
    ``parallel_lab.course.quiz.answers:gpu_hours``) resolve to a module or an attribute, so a move
    cannot leave a stale reference behind."""
    import importlib
    import re

    root = PACKAGE.parent
    texts = [*root.glob("lessons/src/*.py"), *root.glob("*.md"), *PACKAGE.rglob("*.py"), *root.glob("quizzes/*.yaml"),
             *root.glob("tools/*.py")]
    stale = set()
    for path in texts:
        for name in re.findall(r"\bparallel_lab(?:\.\w+)+(?::\w+)?", path.read_text(encoding="utf-8")):
            module_path, _, attr = name.partition(":")
            parts = module_path.split(".")
            for n in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
                try:
                    obj = importlib.import_module(".".join(parts[:n]))
                except ImportError:
                    continue
                try:
                    for part in parts[n:] + ([attr] if attr else []):
                        obj = getattr(obj, part)
                except AttributeError:
                    stale.add(f"{path.relative_to(root)}: {name}")
                break
    assert not stale, "\n".join(sorted(stale))


def test_the_names_architecture_md_gives_exist():
    """ARCHITECTURE.md names modules and functions relative to the package (``pipeline.validate``,
    ``planning.cost.step_time``): each one exists."""
    import importlib
    import re

    units = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} | \
        {p.stem for p in PACKAGE.glob("*.py")}
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = []
    for name in sorted(set(re.findall(r"`((?:\w+\.)+\w+)", text))):
        parts = name.split(".")
        if parts[0] not in units or name.endswith((".py", ".md", ".yaml", ".ipynb", ".cfg")):
            continue
        for n in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module("parallel_lab." + ".".join(parts[:n]))
            except ImportError:
                continue
            try:
                for part in parts[n:]:
                    obj = getattr(obj, part)
            except AttributeError:
                missing.append(name)
            break
        else:
            missing.append(name)
    assert not missing, missing


def test_the_init_files_that_import_are_the_ones_architecture_md_lists():
    """``__init__.py`` files are maps of their folder and import nothing, except those
    ARCHITECTURE.md names (re-exports), so that ``parallel-lab schedule`` does not pay torch's import."""
    import re

    importing = {str(path.parent.relative_to(PACKAGE)) for path in PACKAGE.rglob("__init__.py")
                 if any(isinstance(node, (ast.Import, ast.ImportFrom))
                        for node in ast.walk(ast.parse(path.read_text())))}
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    paragraph = re.search(r"Package `__init__.py` files are .*?(?:\n\n|$)", text, re.S)
    assert paragraph, "ARCHITECTURE.md no longer says which __init__ files import"
    folders = {p for p in re.findall(r"`([\w/]+)`", paragraph.group(0)) if (PACKAGE / p / "__init__.py").exists()}
    assert folders == importing
