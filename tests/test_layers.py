"""The package's import rules, checked on its source with :mod:`ast`.

Three rules, over every import in every module of ``npydask/`` (imports inside functions and under
``if TYPE_CHECKING:`` count, and so does ``from npydask.x import y`` where ``y`` is a module):

- **cycle**: no import cycle among npydask's modules;
- **up**: a module imports only modules of its own wing or of a lower one (``LAYERS``, lowest first);
  a module whose wing is not in ``LAYERS`` fails too (**wing**);
- **private**: no module imports a ``_name`` from another module, and a private module (``_x.py``) is
  imported only by modules inside its own package folder.

``KNOWN`` lists accepted violations (none today). The test fails on a violation that is not in
``KNOWN`` and on a ``KNOWN`` entry that no longer occurs. Keys carry no line numbers (edits elsewhere
in a file do not change them); the failure messages do.

The scripts beside the package (``benchmarks/``, ``examples/``, ``ci/``) use npydask as a user does:
they import no private module or name of it, and reach no ``_name`` through an npydask module
(``SCRIPTS_KNOWN`` lists the white-box probes allowed to, each with its reason).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "npydask"

# Wings, lowest first; the wings of one tuple share a layer (they may import each other, cycles aside).
# A module's wing is its first name under npydask: ``npydask.storage.local`` is in ``storage``,
# ``npydask.reader`` in ``reader``, the package itself in ``__init__``.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "config", "_keywords"),
    ("_buffers",),
    ("format",),
    ("plan",),
    ("cache",),
    ("storage",),
    ("backends",),
    ("reader",),
    ("gpu",),
    ("graph",),
    ("array",),
    ("dataset",),
    ("write",),
    ("samplers",),
    ("loader",),
    ("torch",),
    ("ray",),
    ("xarray",),
    # The command line and the test kit are clients of the public surface (``import npydask``), as a user is
    ("__init__",),
    ("cli",),
    ("testing",),
    ("__main__",),
]

# Accepted violations, sorted: none. An entry needs a reason beside it.
KNOWN: tuple[str, ...] = ()


def _module_name(path: Path, root: Path) -> str:
    name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _rank(module: str) -> int | None:
    wing = _wing(module)
    for rank, layer in enumerate(LAYERS):
        if wing in layer:
            return rank
    return None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str | None:
    """The module an ``ImportFrom`` names, relative imports resolved."""
    if node.level == 0:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class Import:
    """One import of an npydask module by another: who, what, which line, which names."""

    def __init__(self, source: str, target: str, line: int, names: tuple[str, ...] = ()):
        self.source, self.target, self.line, self.names = source, target, line, names


def imports(root: Path) -> tuple[dict[str, Path], list[Import]]:
    """Every module of the tree at ``root`` and every import among them."""
    modules = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    found: list[Import] = []
    top = root.name
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == top:
                        found.append(Import(module, alias.name, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(node, module, path.name == "__init__.py")
                if not target or target.split(".")[0] != top:
                    continue
                names = []
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in modules:  # ``from npydask.x import y`` where y is a module
                        found.append(Import(module, sub, node.lineno))
                    else:
                        names.append(alias.name)
                if names or not node.names:
                    found.append(Import(module, target, node.lineno, tuple(names)))
    return modules, [i for i in found if i.target != i.source]


def _cycles(modules: dict[str, Path], found: list[Import]) -> dict[str, int]:
    """Strongly connected components (Tarjan, iterative): module -> component id, for those in a cycle."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in found:
        if i.target in modules:
            graph[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    component: dict[str, int] = {}
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    members = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        members.append(w)
                        if w == v:
                            break
                    if len(members) > 1:
                        for w in members:
                            component[w] = index[v]
    return component


def violations(root: Path) -> dict[str, list[str]]:
    """The tree's violations: key (no line numbers) -> messages naming file, line and rule."""
    modules, found = imports(root)
    out: dict[str, list[str]] = {}

    def add(key: str, i: Import | None, message: str) -> None:
        where = f"{modules[i.source].relative_to(root.parent)}:{i.line}" if i else str(modules[key.split()[1]])
        out.setdefault(key, []).append(f"{where}: {message}")

    for module in modules:
        if _rank(module) is None:
            add(f"wing: {module}", None, f"{module}'s wing {_wing(module)!r} is not in LAYERS")
    component = _cycles(modules, found)
    for i in found:
        if i.target not in modules:
            continue
        if i.source in component and component.get(i.target) == component[i.source]:
            members = sorted(m for m, c in component.items() if c == component[i.source])
            add(
                f"cycle: {i.source} -> {i.target}",
                i,
                f"{i.source} imports {i.target}, which imports it back (cycle: {', '.join(members)})",
            )
        low, high = _rank(i.source), _rank(i.target)
        if low is not None and high is not None and high > low:
            add(
                f"up: {i.source} -> {i.target}",
                i,
                f"{i.source} imports {i.target}, upward from wing {_wing(i.source)!r} to {_wing(i.target)!r}",
            )
        parts = i.target.split(".")
        home = i.source + "." if modules[i.source].name == "__init__.py" else i.source
        for k in range(1, len(parts)):
            package = ".".join(parts[:k])
            if _is_private(parts[k]) and not home.startswith(package + "."):
                add(
                    f"private: {i.source} -> {i.target}",
                    i,
                    f"{i.source} imports private module {i.target} from outside {package}",
                )
                break
        for name in i.names:
            if _is_private(name):
                add(
                    f"private: {i.source} -> {i.target}.{name}",
                    i,
                    f"{i.source} imports private name {name} from {i.target}",
                )
    return out


def report(found: dict[str, list[str]], known: tuple[str, ...]) -> list[str]:
    """What fails: each violation not in ``known``, and each ``known`` entry that no longer occurs."""
    lines = [f"{msg}  [new: {key}]" for key in sorted(set(found) - set(known)) for msg in found[key]]
    lines += [f"{key!r} no longer occurs: remove it from KNOWN" for key in sorted(set(known) - set(found))]
    return lines


SCRIPT_FOLDERS = ("benchmarks", "examples", "ci")

# Accepted private imports by the scripts, sorted, each with its reason.
SCRIPTS_KNOWN: tuple[str, ...] = (
    # fault injection on a GPU machine, as tests/gpu does: kvikio's open wrapped to shrink a file mid-read
    "ci/gpu_probes.py -> npydask.gpu._kvikio",
    # the open-CuFile peak and kvikio's mode, printed by the probes beside what they read
    "ci/gpu_probes.py -> npydask.gpu._kvikio_runtime",
    # the pinned ring's slots in the reading thread (the probe checks there are SLOTS of them)
    "ci/gpu_probes.py -> npydask.gpu._pinned",
    # the process that first used CUDA, read and (dry run) set to provoke the forked-worker error
    "ci/gpu_probes.py -> npydask.gpu.process._CUDA_PID",
    # the toolkit check's remembered outcome, reset so the check runs again
    "ci/gpu_probes.py -> npydask.gpu.toolkit._outcome",
)


def script_violations(root: Path, folders: tuple[str, ...] = SCRIPT_FOLDERS) -> dict[str, list[str]]:
    """Private npydask imports in the scripts under ``root``'s ``folders``: key -> messages (file and line)."""
    out: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            modules: dict[str, str] = {}  # local name -> the npydask module it is bound to
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            found: list[tuple[int, str]] = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] == "npydask":
                            modules[alias.asname or "npydask"] = alias.name if alias.asname else "npydask"
                            found.append((node.lineno, alias.name))
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    if node.module.split(".")[0] == "npydask":
                        for alias in node.names:
                            found.append((node.lineno, f"{node.module}.{alias.name}"))
                            modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and _is_private(node.attr):
                    chain, value = [node.attr], node.value
                    while isinstance(value, ast.Attribute):
                        chain.append(value.attr)
                        value = value.value
                    if isinstance(value, ast.Name) and value.id in modules:
                        found.append((node.lineno, ".".join([modules[value.id], *reversed(chain)])))
            for line, name in found:
                parts = name.split(".")
                for k, part in enumerate(parts):
                    if _is_private(part):
                        target = ".".join(parts[: k + 1])
                        out.setdefault(f"{rel} -> {target}", []).append(
                            f"{rel}:{line}: uses {name}, private to npydask ({target}): give it a public home "
                            "or use the public API"
                        )
                        break
    return out


def test_layers():
    lines = report(violations(ROOT), KNOWN)
    assert not lines, "\n".join(lines)


def test_scripts_use_npydask_as_users_do():
    lines = report(script_violations(ROOT.parent), SCRIPTS_KNOWN)
    assert not lines, "\n".join(lines)


def test_known_is_sorted_without_duplicates():
    assert list(KNOWN) == sorted(set(KNOWN))
    assert list(SCRIPTS_KNOWN) == sorted(set(SCRIPTS_KNOWN))


def test_layers_name_each_wing_once():
    wings = [w for layer in LAYERS for w in layer]
    assert len(wings) == len(set(wings))


# The checker itself, on tiny trees.


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "npydask"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_checker_finds_a_cycle_through_a_lazy_import(tmp_path):
    root = _tree(
        tmp_path,
        {
            "errors.py": "from npydask import config\n",
            "config.py": "def f():\n    import npydask.errors\n",
        },
    )
    found = violations(root)
    assert sorted(found) == ["cycle: npydask.config -> npydask.errors", "cycle: npydask.errors -> npydask.config"]
    assert found["cycle: npydask.config -> npydask.errors"] == [
        "npydask/config.py:2: npydask.config imports npydask.errors, which imports it back"
        " (cycle: npydask.config, npydask.errors)"
    ]


def test_checker_finds_a_cycle_under_type_checking(tmp_path):
    root = _tree(
        tmp_path,
        {
            "storage/__init__.py": "",
            "storage/a.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from npydask.storage.b import B\n"
            ),
            "storage/b.py": "from .a import A\n",
        },
    )
    assert sorted(violations(root)) == [
        "cycle: npydask.storage.a -> npydask.storage.b",
        "cycle: npydask.storage.b -> npydask.storage.a",
    ]


def test_checker_finds_an_upward_import_even_inside_a_function(tmp_path):
    root = _tree(
        tmp_path,
        {
            "plan/__init__.py": "",
            "plan/region.py": "def f():\n    from npydask.array import from_npy\n",
            "array.py": "from npydask.plan import region\n",
        },
    )
    found = violations(root)
    assert "up: npydask.plan.region -> npydask.array" in found
    assert found["up: npydask.plan.region -> npydask.array"] == [
        "npydask/plan/region.py:2: npydask.plan.region imports npydask.array, upward from wing 'plan' to 'array'"
    ]
    assert "up: npydask.array -> npydask.plan.region" not in found


def test_checker_fails_a_module_outside_the_layers(tmp_path):
    root = _tree(tmp_path, {"widgets.py": "from npydask import errors\n", "errors.py": ""})
    assert list(violations(root)) == ["wing: npydask.widgets"]


def test_checker_finds_private_names_and_private_modules(tmp_path):
    root = _tree(
        tmp_path,
        {
            "storage/__init__.py": "",
            "storage/_handles.py": "def _changed(): ...\n",
            "storage/local.py": "from npydask.storage._handles import _changed\n",
            "storage/_batch.py": "from npydask.storage import _handles\n",
            "reader.py": "import npydask.storage._handles\nfrom npydask.storage.local import __doc__, _x\n",
            "_buffers.py": "",
            "format/__init__.py": "",
            "format/header.py": "from npydask import _buffers\n",
            "xarray/__init__.py": "from npydask.xarray._open import open_npy\n",
            "xarray/_open.py": "def open_npy(): ...\n",
        },
    )
    assert sorted(violations(root)) == [
        "private: npydask.reader -> npydask.storage._handles",
        "private: npydask.reader -> npydask.storage.local._x",
        "private: npydask.storage.local -> npydask.storage._handles._changed",
    ]


def test_known_only_shrinks(tmp_path):
    root = _tree(tmp_path, {"errors.py": "import npydask.array\n", "array.py": ""})
    found = violations(root)
    key = "up: npydask.errors -> npydask.array"
    assert report(found, ()) == [
        f"npydask/errors.py:1: npydask.errors imports npydask.array, upward from wing 'errors' to 'array'  [new: {key}]"
    ]
    assert report(found, (key,)) == []
    assert report({}, (key,)) == [f"{key!r} no longer occurs: remove it from KNOWN"]


def test_checker_finds_private_npydask_names_in_scripts(tmp_path):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "_common.py").write_text("import os\n")  # (a script's own private helpers are its business)
    (bench / "b.py").write_text(
        textwrap.dedent("""\
        import _common
        import npydask
        import npydask.storage as st
        from npydask._buffers import pieces
        from npydask.dataset.open import _select, open_dataset
        from npydask.gpu import _kvikio as kb
        from npydask.storage import local
        kb.describe()
        npydask.storage._handles.clear_cache()
        st._x
        local._scan
        npydask.open_dataset
    """)
    )
    found = script_violations(tmp_path, ("benchmarks",))
    assert sorted(found) == [
        "benchmarks/b.py -> npydask._buffers",
        "benchmarks/b.py -> npydask.dataset.open._select",
        "benchmarks/b.py -> npydask.gpu._kvikio",
        "benchmarks/b.py -> npydask.storage._handles",
        "benchmarks/b.py -> npydask.storage._x",
        "benchmarks/b.py -> npydask.storage.local._scan",
    ]
    assert found["benchmarks/b.py -> npydask._buffers"] == [
        "benchmarks/b.py:4: uses npydask._buffers.pieces, private to npydask (npydask._buffers): give it a public "
        "home or use the public API"
    ]
