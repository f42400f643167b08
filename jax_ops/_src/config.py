"""Overrides for tests and experiments (forced algorithm, splits, persistence, cluster size), one mechanism for
every family.

A family declares its knobs once::

    KNOBS = Knobs("attention", kv_splits=Knob(None, env="JAX_OPS_ATTENTION_KV_SPLITS", parse=int))

reads them at trace time (``KNOBS.kv_splits``) and passes them to kernels as static attributes, and users or
tests override them for a block::

    with jax_ops.attention.overrides(kv_splits=4):
        ...

Environment variables are read here and nowhere else (once, at first use). A knob's value must be part of any
cache key that depends on it (read it before calling a ``functools.cache``'d builder, pass it as an argument).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any


@dataclasses.dataclass(frozen=True)
class Knob:
    default: Any
    env: str | None = None  # environment variable that sets the process-wide default
    parse: Callable[[str], Any] = str
    doc: str = ""


class Knobs:
    """The knobs of one family: attribute access reads the current value (override > environment > default)."""

    def __init__(self, family: str, **knobs: Knob):
        self._family = family
        self._knobs = knobs
        self._env_defaults: dict[str, Any] | None = None
        self._overrides: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar(
            f"jax_ops_{family}_overrides", default=()
        )

    def _defaults(self) -> dict[str, Any]:
        if self._env_defaults is None:
            values = {}
            for name, knob in self._knobs.items():
                raw = os.environ.get(knob.env, "") if knob.env else ""
                if raw.strip() == "":
                    values[name] = knob.default
                    continue
                try:
                    values[name] = knob.parse(raw.strip())
                except ValueError as e:
                    raise ValueError(f"environment variable {knob.env}={raw!r}: {e}") from e
            self._env_defaults = values
        return self._env_defaults

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._knobs:
            raise AttributeError(f"{self._family} has no knob {name!r} (knobs: {sorted(self._knobs)})")
        overrides = dict(self._overrides.get())
        return overrides[name] if name in overrides else self._defaults()[name]

    def values(self) -> dict[str, Any]:
        """Every knob's current value (hashable as a tuple of items: use it in cache keys)."""
        return {name: getattr(self, name) for name in self._knobs}

    @contextlib.contextmanager
    def override(self, **values: Any) -> Iterator[None]:
        unknown = set(values) - set(self._knobs)
        if unknown:
            raise TypeError(
                f"{self._family} overrides: unknown knob(s) {sorted(unknown)} (knobs: {sorted(self._knobs)})"
            )
        token = self._overrides.set(tuple({**dict(self._overrides.get()), **values}.items()))
        try:
            yield
        finally:
            self._overrides.reset(token)

    def describe(self) -> str:
        """One line per knob: name, default, environment variable, what it does (for docs and --help)."""
        lines = []
        for name, knob in self._knobs.items():
            env = f" (env {knob.env})" if knob.env else ""
            lines.append(f"{name} = {knob.default!r}{env}: {knob.doc}")
        return "\n".join(lines)
