"""The datapath's C source and the constants it shares with Python.

bpf/mrc_common.h and the headers of bpf/lib/common/ it includes (one
concern each: sizes, wire format, peers, paths, counters, events, ...) are
the single definition of sizes, flags and counters: this module reads their
``#define``s and ``enum mrc_counter`` so Python never keeps a second copy
of them.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

# In a checkout the sources are the tree's bpf/; an installed package carries
# them as mrc_ebpf/bpf (pyproject maps the one onto the other).
_HERE = Path(__file__).resolve().parent
_INSTALLED, _CHECKOUT = _HERE.parent / "bpf", _HERE.parent.parent / "bpf"
BPF_DIR = Path(os.environ.get("MRC_BPF_DIR") or (_CHECKOUT if (_CHECKOUT / "mrc.c").is_file() else _INSTALLED))
LAB_BPF_DIR = BPF_DIR / "lab"
MAIN_SOURCE = BPF_DIR / "mrc.c"
COMMON_HEADER = BPF_DIR / "mrc_common.h"

_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*(?:/\*.*\*/)?\s*$')


def expand(path: Path = MAIN_SOURCE, _seen: set | None = None) -> str:
    """Inline the quoted includes of `path` (each file once), keeping
    #line markers so compiler messages name the real file and line.

    bcc rewrites map calls and finds programs only in the one file it is
    given; this makes the whole datapath that one file.
    """
    seen = set() if _seen is None else _seen
    path = path.resolve()
    if path in seen:
        return ""
    seen.add(path)
    out = [f'#line 1 "{path}"']
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = _QUOTED_INCLUDE.match(line)
        if not match:
            out.append(line)
            continue
        included = _resolve(match.group(1), path.parent)
        out.append(expand(included, seen))
        out.append(f'#line {number + 1} "{path}"')
    return "\n".join(out) + "\n"


def _resolve(name: str, here: Path) -> Path:
    for base in (here, BPF_DIR):
        candidate = base / name
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"#include \"{name}\" not found from {here}")


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


@functools.lru_cache(maxsize=None)
def header_text(path: Path = COMMON_HEADER) -> str:
    """The C file at `path` with its quoted includes inlined: for
    mrc_common.h, every header of lib/common/, in its order."""
    return expand(Path(path))


@functools.lru_cache(maxsize=None)
def constants(path: Path = COMMON_HEADER, prefix: str = "MRC_") -> dict[str, int]:
    """Integer #defines named PREFIX* in the C file at `path` and what it
    includes (mrc_common.h by default), function-like macros excluded."""
    values: dict[str, int] = {}
    text = _strip_comments(header_text(path))
    pattern = rf"^[ \t]*#define[ \t]+({re.escape(prefix)}\w+)[ \t]+(.+?)[ \t]*$"
    for name, expr in re.findall(pattern, text, flags=re.M):
        expr = re.sub(rf"\b({re.escape(prefix)}\w+)\b",
                      lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), expr)
        if re.fullmatch(r"[0-9xXa-fA-F()+\-*/ <>|&]+", expr):
            values[name] = int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - digits and operators only
    return values


@functools.lru_cache(maxsize=None)
def _function_macros(path: Path = COMMON_HEADER) -> dict[str, tuple[list[str], str]]:
    """Function-like #defines of the file: name -> (parameters, body)."""
    text = _strip_comments(header_text(path))
    found = re.findall(r"^[ \t]*#define[ \t]+(\w+)\(([^)]*)\)[ \t]+(.+?)[ \t]*$", text, flags=re.M)
    return {name: ([p.strip() for p in params.split(",")], body) for name, params, body in found}


@functools.lru_cache(maxsize=4096)      # a pure function of the file: per-path callers
def macro(name: str, *args: int, path: Path = COMMON_HEADER) -> int:
    """The value of the function-like macro NAME(ARGS...) of the C file (its
    body may use integer constants and other such macros):
    `macro("MRC_SRH_LEN", 2)` -> 88."""
    macros, values = _function_macros(path), constants(path, "")
    params, body = macros[name]
    if len(params) != len(args):
        raise TypeError(f"{name} takes {len(params)} argument(s)")
    expr = re.sub(r"\b\w+\b", lambda m: str(args[params.index(m.group(0))])
                  if m.group(0) in params else m.group(0), body)
    while True:   # innermost calls first: their arguments are numbers by then
        call = re.search(r"\b([A-Za-z_]\w*)\(([^()]*)\)", expr)
        if not call or call.group(1) not in macros:
            break
        inner = [int(eval(a, {"__builtins__": {}})) for a in call.group(2).split(",")]  # noqa: S307
        expr = expr[:call.start()] + str(macro(call.group(1), *inner, path=path)) + expr[call.end():]
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(values[m.group(0)]), expr)
    if not re.fullmatch(r"[0-9xXa-fA-F()+\-*/ <>|&]+", expr):
        raise ValueError(f"{name}: cannot evaluate {body!r}")
    return int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - digits and operators only


@functools.lru_cache(maxsize=None)
def enum_names(enum: str, path: Path = COMMON_HEADER) -> list[str]:
    """The names of `enum ENUM` in the C file at `path`, in value order (the
    enum must not assign values)."""
    text = _strip_comments(header_text(path))
    body = re.search(rf"enum\s+{re.escape(enum)}\s*{{(.*?)}}", text, flags=re.S).group(1)
    names = [n.strip() for n in body.split(",") if n.strip()]
    if any("=" in n for n in names):
        raise ValueError(f"enum {enum} must not assign values")
    return names


@functools.lru_cache(maxsize=None)
def counter_names() -> list[str]:
    """Names of enum mrc_counter in index order, without the MRC_ prefix."""
    names = enum_names("mrc_counter")
    assert names[-1] == "MRC_COUNTER_MAX"
    return [n[len("MRC_"):].lower() for n in names[:-1]]


C = constants()


def prefixed(prefix: str) -> list[str]:
    """The names of C's `PREFIX*` constants, lower case, by value
    (`prefixed("MRC_POLICY_")` -> ["rr", "weighted", ...])."""
    return [n[len(prefix):].lower() for n, _ in sorted(C.items(), key=lambda kv: kv[1])
            if n.startswith(prefix)]
