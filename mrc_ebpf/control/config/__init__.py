"""A host's whole mrc-ebpf config as one YAML document (docs/ops.md).

  schema   the format's keys, the one table of ranges (`mrcctl attach`'s
           options come from it too), the canonical form's helpers;
  parse    `load` a file (every error `FILE:LINE: reason`) into the
           canonical form, `dump` it back, where `save` writes it;
  state     the running state: the same form read back from an
            attachment's maps, routes and pins;
  changes   one dataclass per kind of change, with describe() and apply();
  planner   `plan`: the changes that turn the running form into the wanted
            one (paths matched by what they are: a kept path keeps its id);
  executor  `execute` a plan on an attachment opened for a change, and
            `apply` a file: attach, change in place or re-attach.

The names below are the package's public API, each imported from its
module when first used: the CLI imports `schema` at start-up, and YAML or
the loader only when a verb needs them.
"""
from __future__ import annotations

import importlib

_WHERE = {
    "schema": ("VERSION", "MODES", "GRANULARITIES", "RANGES", "TIMER_RANGES", "SETTING_RANGES",
               "MIN_ACTIVE_RANGE", "LINK_RATE_RANGE", "DEFAULTS", "ATTACH_KEYS", "REATTACH_KEYS",
               "DEFAULT_POLICY", "MAX_CLASS_NAME", "ConfigError", "Config", "merge_entropy",
               "canonical_metrics", "effective_metrics"),
    "parse": ("DEFAULT_DIR", "compose", "load", "load_file", "dump", "save_path", "write_atomically"),
    "state": ("APPLIED_PIN", "APPLIED_BYTES", "UNRECORDED_KEY", "read_applied", "write_applied",
                "used_mode", "granularity", "signing_key", "running", "running_with_ids",
                "running_templates"),
    "changes": ("Change", "delete_class"),
    "planner": ("plan", "reattach_reasons"),
    "executor": ("Applied", "apply", "execute"),
}
_MODULE = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE)


def __getattr__(name: str):
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # no exported name is a module's name: importing a submodule sets it
    # on the package, over the name
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
