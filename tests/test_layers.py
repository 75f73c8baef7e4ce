"""The package's layers import only downwards, its modules form no import
circle, and none uses another module's private (_underscored) names.

errors < datapath (the loader) < control < perf, lab < bench < cli, demo.
perf and lab stand side by side and import neither each other.  Lazy
imports inside functions count too: a circle hidden in a function still
ties the modules together.  The tests themselves are exempt from the
private-name rule (a test may check a module's helper directly) and
cannot be in a circle (nothing imports them).
"""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mrc_ebpf"
RANK = {"errors": 0, "datapath": 1, "control": 2, "perf": 3, "lab": 3, "bench": 4, "cli": 5, "demo": 5}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "mrc_ebpf" and len(parts) > 1 else None


def _modules(pkg: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of the package at PKG."""
    out = {}
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg.parent).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


def _imports(path: Path, module: str):
    """(target, name or None, local name, line) of each import in the
    file; `from A import n as m` gives (A, n, m), `import A.b` (A.b, None, A)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, alias.asname or alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[:-node.level] if path.name != "__init__.py" else \
                    module.split(".")[:len(module.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield target, alias.name, alias.asname or alias.name, node.lineno


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def graph(pkg: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The package's import graph (module -> the modules it imports, at
    any depth of the file) and its uses of other modules' private names
    ("file:line module._name"), through `from M import _n` or `m._n`
    after `import M as m` / `from P import m`."""
    modules = _modules(pkg)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for module, path in modules.items():
        bound = {}          # local name -> the module it stands for
        where = path.relative_to(pkg.parent)
        for target, name, local, line in _imports(path, module):
            sub = f"{target}.{name}" if name else target
            if sub in modules:              # a module, by itself
                edges[module].add(sub)
                # `import a.b` binds a, `import a.b as m` and `from a import b as m` bind m
                bound[local] = target.split(".")[0] if not name and local == target.split(".")[0] else sub
            elif target in modules:         # a name from a module
                edges[module].add(target)
                if _private(name) and target != module:
                    private.append(f"{where}:{line} {target}.{name}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                owner = _dotted(node.value)
                if owner is None or owner.split(".")[0] not in bound:
                    continue
                first, _, rest = owner.partition(".")
                full = ".".join(filter(None, [bound[first], rest]))
                if full in modules and full != module:
                    private.append(f"{where}:{node.lineno} {full}.{node.attr}")
    return edges, sorted(set(private))


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or one
    importing itself): Tarjan's algorithm, iterative."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in edges.get(v, ()):
                    out.append(sorted(comp))
    return sorted(out)


def test_every_module_belongs_to_a_layer():
    strays = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
              if p.relative_to(PKG).parts[0].removesuffix(".py") not in RANK and p.name != "__init__.py"]
    assert not strays, f"modules outside every layer: {strays}"


def test_imports_go_only_downwards():
    upward = []
    for module, path in _modules(PKG).items():
        own = _layer(module)
        if own is None:
            continue
        for target, name, _, line in _imports(path, module):
            if target == "mrc_ebpf" and name:     # from mrc_ebpf import lab: the names are layers
                target = f"mrc_ebpf.{name}"
            other = _layer(target)
            if other is None or other == own:
                continue
            if RANK[other] >= RANK[own]:
                upward.append(f"{path.relative_to(PKG.parent)}:{line} ({own}) imports {target} ({other})")
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_no_import_circles():
    found = circles(graph(PKG)[0])
    assert not found, "modules importing each other (directly or round a loop):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_no_private_names_of_other_modules():
    found = graph(PKG)[1]
    assert not found, "private names used outside their module (make them public where " \
        "they belong, or move them):\n" + "\n".join(found)


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


CLEAN = {
    "a.py": "from pkg import b\nfrom pkg.c import public\n\ndef _mine():\n    return b.f(), b.__name__, public\n",
    "b.py": "import pkg.c\n\ndef f():\n    return pkg.c.public, _g()\n\ndef _g():\n    pass\n",
    "c.py": "public = 1\n_hidden = 2\n",
    "sub/__init__.py": "from . import d\n",
    "sub/d.py": "from ..c import public\n",
}


def test_checker_passes_a_clean_package(tmp_path):
    edges, private = graph(_package(tmp_path, CLEAN))
    assert edges["pkg.a"] == {"pkg.b", "pkg.c"} and edges["pkg.sub.d"] == {"pkg.c"}
    assert circles(edges) == [] and private == []


def test_checker_finds_a_circle_through_a_function_level_import(tmp_path):
    pkg = _package(tmp_path, {**CLEAN, "c.py": "public = 1\n\ndef later():\n    from pkg import a\n"})
    assert circles(graph(pkg)[0]) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_checker_finds_a_relative_circle_in_a_subpackage(tmp_path):
    pkg = _package(tmp_path, {**CLEAN, "sub/e.py": "from .d import x\n",
                              "sub/d.py": "from . import e\n"})
    assert circles(graph(pkg)[0]) == [["pkg.sub.d", "pkg.sub.e"]]


def test_checker_finds_private_names_imported_or_reached(tmp_path):
    pkg = _package(tmp_path, {**CLEAN, "e.py": "from pkg.c import _hidden\n",
                              "f.py": "from pkg import b\nimport pkg.c as cc\n\n"
                                      "def h():\n    return b._g(), cc._hidden\n",
                              "g.py": "import pkg.c\nx = pkg.c._hidden\n",
                              "sub/d.py": "from ..b import _g\n"})
    assert graph(pkg)[1] == ["pkg/e.py:1 pkg.c._hidden", "pkg/f.py:5 pkg.b._g", "pkg/f.py:5 pkg.c._hidden",
                             "pkg/g.py:2 pkg.c._hidden", "pkg/sub/d.py:1 pkg.b._g"]


def test_startup_imports_stay_light():
    """Every mrcctl run imports the CLI and, for most verbs, control.paths and
    the loader; pyroute2 and tabulate (~200 ms together) are imported only by
    the functions that use them (docs/ops.md, start-up time)."""
    import subprocess
    import sys
    code = ("import sys, mrc_ebpf.cli.mrcctl, mrc_ebpf.control.paths, mrc_ebpf.control.status, "
            "mrc_ebpf.control.templates, mrc_ebpf.datapath.loader; "
            "print(sorted(m for m in ('pyroute2', 'tabulate', 'bcc', 'scapy', 'yaml', 'prometheus_client') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60, cwd=PKG.parent).stdout.strip()
    assert out == "[]", f"imported at start-up: {out}"
