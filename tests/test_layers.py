"""The package's layers import only downwards.

errors < datapath (the loader) < control < perf, lab < bench < cli, demo.
perf and lab stand side by side and import neither each other.  Lazy
imports inside functions count too.
"""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mrc_ebpf"
RANK = {"errors": 0, "datapath": 1, "control": 2, "perf": 3, "lab": 3, "bench": 4, "cli": 5, "demo": 5}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "mrc_ebpf" and len(parts) > 1 else None


def _imports(path: Path, module: str):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[:-node.level] if path.name != "__init__.py" else \
                    module.split(".")[:len(module.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "mrc_ebpf":     # from mrc_ebpf import lab: the names are layers
                for alias in node.names:
                    yield f"mrc_ebpf.{alias.name}", node.lineno
            else:
                yield target, node.lineno


def test_every_module_belongs_to_a_layer():
    strays = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
              if p.relative_to(PKG).parts[0].removesuffix(".py") not in RANK and p.name != "__init__.py"]
    assert not strays, f"modules outside every layer: {strays}"


def test_imports_go_only_downwards():
    upward = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        own = _layer(module)
        if own is None:
            continue
        for target, line in _imports(path, module):
            other = _layer(target)
            if other is None or other == own:
                continue
            if RANK[other] >= RANK[own]:
                upward.append(f"{path.relative_to(PKG.parent)}:{line} ({own}) imports {target} ({other})")
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


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
