"""Kernel counts of a compiled module's while-loop body, from ``compiled.as_text()`` (optimised HLO).

``while_body_counts(text)`` finds the body of the (largest) ``while`` and counts, per opcode, the instructions
that launch work on a GPU: ``fusion`` (one kernel each), ``custom-call`` (an FFI target: one or more kernels),
``copy``, ``reduce``/other unfused ops; it follows ``call`` instructions (XLA GPU's command buffers wrap
sequences of commands in ``call``\\ s to ``command_buffer`` computations) and nested ``while``\\ s, and reports
which fusions are *scalar-only* (every array in the fusion's result has at most ``scalar_max`` elements, e.g.
the ``[k]`` scalars of a block LSMR). Plain text parsing: meant for benchmark tables and notes, not for code
that must be exact about every HLO spelling.
"""

from __future__ import annotations

import collections
import re

# Computation header: "%name (params...) -> type {"  or "ENTRY %name ... {"  (older dumps omit the "%").
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$")
# Instruction: "[ROOT] %name = type opcode(operands), attrs"
_INST = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
_SHAPE = re.compile(r"\b(pred|s8|s16|s32|s64|u8|u16|u32|u64|f16|bf16|f32|f64)\[([\d,]*)\]")
# No runtime work.
_FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
    "partition-id", "replica-id",
}  # fmt: skip


def _computations(text: str) -> dict[str, list[tuple[str, str, str, str]]]:
    comps: dict[str, list[tuple[str, str, str, str]]] = {}
    cur = None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and "=" not in line.split("(")[0]:
            cur = m.group(2)
            comps[cur] = []
            continue
        if line.strip() == "}":
            cur = None
            continue
        if cur is None:
            continue
        mi = _INST.match(line)
        if mi:
            comps[cur].append((mi.group(2), mi.group(3), mi.group(4), mi.group(5)))
    return comps


def _max_elems(shape_text: str) -> int:
    best = 1
    for _, dims in _SHAPE.findall(shape_text):
        n = 1
        for d in dims.split(","):
            if d:
                n *= int(d)
        best = max(best, n)
    return best


def _attr(rest: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=%?([\w.\-]+)", rest)
    return m.group(1) if m else None


def while_body_counts(text: str, scalar_max: int = 64) -> dict:
    """Counts for the body of the while loop with the most instructions (``{}`` when there is no while)."""
    comps = _computations(text)
    whiles = []
    for insts in comps.values():
        for _, _, op, rest in insts:
            if op == "while":
                body, cond = _attr(rest, "body"), _attr(rest, "condition")
                if body in comps:
                    whiles.append((len(comps[body]), body, cond))
    if not whiles:
        return {}
    _, body, cond = max(whiles)
    ops: collections.Counter = collections.Counter()
    targets: collections.Counter = collections.Counter()
    scalar_fusions = 0
    calls = 0

    def walk(name: str, depth: int = 0) -> None:
        nonlocal scalar_fusions, calls
        for _, shape, op, rest in comps.get(name, []):
            if op in _FREE:
                continue
            if op in ("call", "while", "conditional") and depth < 8:
                if op == "call":
                    calls += 1
                for key in ("to_apply", "body", "condition", "calls"):
                    sub = _attr(rest, key)
                    if sub and sub in comps:
                        walk(sub, depth + 1)
                if op != "call":
                    ops[op] += 1
                continue
            ops[op] += 1
            if op == "fusion" and _max_elems(shape) <= scalar_max:
                scalar_fusions += 1
            if op == "custom-call":
                m = re.search(r'custom_call_target="([^"]+)"', rest)
                targets[m.group(1) if m else "?"] += 1

    walk(body)
    cond_ops: collections.Counter = collections.Counter(
        op for _, _, op, _ in comps.get(cond, []) if op not in _FREE
    )
    launches = sum(n for op, n in ops.items() if op not in ("while", "conditional"))
    return {
        "body": body,
        "launches": launches,  # kernels + library calls per loop trip (custom-calls counted once)
        "fusions": ops.get("fusion", 0),
        "scalar_fusions": scalar_fusions,
        "custom_calls": ops.get("custom-call", 0),
        "command_buffer_calls": calls,
        "ops": dict(ops),
        "custom_call_targets": dict(targets),
        "condition_ops": dict(cond_ops),
    }
