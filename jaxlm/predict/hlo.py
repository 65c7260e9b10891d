"""Optimised HLO text (`compiled.as_text()`) read into computations, instructions and result types.

The GPU compiler's program is only reachable as text here (`cost_analysis()` of a step compiled for an abstract
GPU returns None, and jaxlib has no Python binding for HLO modules), so this is the slice of XLA's HLO parser a
cost model needs, written for the text XLA prints: one instruction per line, `%name = TYPE opcode(%a, %b),
attributes`. Operands carry no types in that text: each computation gets a name -> type table built from the
definitions (parameters included). The source locations (`stack_frame_id` in an instruction's metadata) resolve
through the module's FileNames / FunctionNames / FileLocations / StackFrames tables.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field

# Bytes per element; the sub-byte types count a fraction.
DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "f4e2m1fn": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
               "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
               "token": 0}

HOST_SPACE = 5  # XLA's memory space of pinned host memory (`S(5)` in a layout): where remat offload puts buffers
_COMMENT = re.compile(r"/\*.*?\*/")
_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\(.*\{\s*$")
_DEF = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*")
_ARRAY = re.compile(r"(\w+)\[([^\]]*)\](?:\{([^}]*)\})?")  # type, dims, layout (`1,0:S(5)`: in host memory)
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_NAME = re.compile(r"%([\w.\-]+)")
_FRAME_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


@dataclass(frozen=True)
class Array:
    """One array of a result type: element type and dimensions."""

    dtype: str
    dims: tuple[int, ...]
    space: int = 0  # the layout's memory space: 0 device memory, HOST_SPACE host memory (offloaded buffers)

    @property
    def on_host(self) -> bool:
        return self.space == HOST_SPACE

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> float:
        return self.elements * DTYPE_BYTES.get(self.dtype, 4)


def parse_type(text: str) -> tuple[Array, ...]:
    """The arrays of a result type, in order: one for `f32[8,64]{1,0}`, each leaf of a (nested) tuple."""
    return tuple(Array(t, tuple(int(d.lstrip("<=")) for d in dims.split(",") if d), _space(layout))
                 for t, dims, layout in _ARRAY.findall(text) if t in DTYPE_BYTES or re.fullmatch(r"f8\w+", t))


def _space(layout: str) -> int:
    m = re.search(r"S\((\d+)\)", layout)
    return int(m.group(1)) if m else 0


def nbytes(arrays: tuple[Array, ...]) -> float:
    return sum(a.nbytes for a in arrays)


def _balanced(text: str, start: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes text[start] (== open_), skipping quoted strings."""
    depth, i, quote = 0, start, False
    while i < len(text):
        c = text[i]
        if quote:
            i += c == "\\"  # an escaped character
            quote = c != '"'
        elif c == '"':
            quote = True
        elif c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


@dataclass
class Instr:
    """One instruction: its result arrays, opcode, operand names and the attribute text after the operands."""

    name: str
    shape: tuple[Array, ...]
    opcode: str
    operands: tuple[str, ...]
    args: str  # the text between the opcode's parentheses (a parameter's number, a constant's value)
    attrs: str
    is_root: bool = False

    def attr(self, key: str) -> str | None:
        """The raw value of `key=...` (up to the next top-level comma), or None."""
        m = re.search(rf"(?:^|[,\s]){re.escape(key)}=", self.attrs)
        if not m:
            return None
        i = m.end()
        if i < len(self.attrs) and self.attrs[i] in "{[":
            return self.attrs[i:_balanced(self.attrs, i, self.attrs[i], "}" if self.attrs[i] == "{" else "]")]
        return re.match(r'"(?:[^"\\]|\\.)*"|[^,\s]*', self.attrs[i:]).group(0).strip('"')

    def ints(self, key: str) -> tuple[int, ...]:
        value = self.attr(key)
        return tuple(int(x) for x in re.findall(r"\d+", value)) if value else ()

    @functools.cached_property
    def config(self) -> dict:
        """backend_config as JSON ({} when absent or not JSON)."""
        value = self.attr("backend_config")
        try:
            return json.loads(value) if value and value.startswith("{") else {}
        except ValueError:
            return {}

    @property
    def callees(self) -> tuple[str, ...]:
        """Computations this instruction runs (fusion bodies, loop bodies, branches, appliers)."""
        names = []
        for key in ("calls", "body", "condition", "to_apply", "true_computation", "false_computation",
                    "branch_computations"):
            value = self.attr(key)
            if value:
                names += _NAME.findall(value)
        return tuple(names)

    @property
    def op_name(self) -> str:
        m = re.search(r'op_name="((?:[^"\\]|\\.)*)"', self.attrs)
        return m.group(1).replace("\\'", "'") if m else ""

    @property
    def frame(self) -> int | None:
        m = re.search(r"stack_frame_id=(\d+)", self.attrs)
        return int(m.group(1)) if m else None


@dataclass
class Computation:
    name: str
    instrs: dict[str, Instr] = field(default_factory=dict)  # in program order

    @property
    def root(self) -> Instr:
        return next((i for i in self.instrs.values() if i.is_root), list(self.instrs.values())[-1])

    @functools.cached_property
    def users(self) -> dict[str, list[Instr]]:
        out: dict[str, list[Instr]] = {}
        for ins in self.instrs.values():
            for op in ins.operands:
                out.setdefault(op, []).append(ins)
        return out

    def parameters(self) -> list[Instr]:
        """Parameter instructions by parameter number."""
        params = [i for i in self.instrs.values() if i.opcode == "parameter"]
        return sorted(params, key=lambda i: int(i.args))


@dataclass
class Module:
    computations: dict[str, Computation]
    entry: str
    header: str
    frames: dict[int, tuple[str, str, int]]  # stack frame id -> (file, function, line)
    parents: dict[int, int]  # stack frame id -> its caller's id

    @property
    def partitions(self) -> int:
        m = re.search(r"num_partitions=(\d+)", self.header)
        r = re.search(r"replica_count=(\d+)", self.header)
        return int(m.group(1) if m else 1) * int(r.group(1) if r else 1)

    def chain(self, frame: int | None) -> list[tuple[str, str, int]]:
        """(file, function, line) from the innermost frame out to the outermost."""
        out, seen = [], set()
        while frame in self.frames and frame not in seen:
            seen.add(frame)
            out.append(self.frames[frame])
            frame = self.parents.get(frame)
        return out


def _instr(line: str) -> Instr | None:
    d = _DEF.match(line)
    if not d:
        return None
    i = d.end()
    if line[i] == "(":
        end = _balanced(line, i, "(", ")")
    else:
        m = re.compile(r"\w+\[[^\]]*\](\{[^}]*\})?").match(line, i)
        if not m:
            return None
        end = m.end()
    op = _OPCODE.match(line, end)
    if not op:
        return None
    close = _balanced(line, op.end() - 1, "(", ")")
    args = line[op.end():close - 1]
    return Instr(d.group(2), parse_type(line[i:end]), op.group(1), tuple(_NAME.findall(args)), args,
                 line[close:].lstrip(", "), bool(d.group(1)))


def _short_path(path: str) -> str:
    """jaxlm/nn/attention.py, optax/_src/transform.py: the package-relative part of a source path."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return "jaxlm/" + path.rsplit("/jaxlm/", 1)[1] if "/jaxlm/" in path else path.rsplit("/", 1)[-1]


def _frame_tables(tables: dict[str, dict[int, str]]) -> tuple[dict, dict]:
    files, funcs = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locations = {}
    for k, v in tables.get("FileLocations", {}).items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        locations[k] = (_short_path(files.get(int(f.get("file_name_id", 0)), "")),
                        funcs.get(int(f.get("function_name_id", 0)), ""), int(f.get("line", 0)))
    frames, parents = {}, {}
    for k, v in tables.get("StackFrames", {}).items():
        f = {a: int(b) for a, b in re.findall(r"(\w+)=(\d+)", v)}
        if f.get("file_location_id") in locations:
            frames[k] = locations[f["file_location_id"]]
        # XLA prints a frame's parent one above its id (frame 1, the outermost, shows parent_frame_id=1)
        if f.get("parent_frame_id", 0) > 1:
            parents[k] = f["parent_frame_id"] - 1
    return frames, parents


def parse_module(text: str) -> Module:
    """Every computation of an HloModule's text, the entry's name and the source-location tables."""
    comps: dict[str, Computation] = {}
    tables: dict[str, dict[int, str]] = {}
    entry = table = ""
    current: Computation | None = None
    header = text.split("\n", 1)[0]
    for raw in text.splitlines():
        line = _COMMENT.sub("", raw)
        if current is not None:
            if line.strip() == "}":
                current = None
            elif (ins := _instr(line)) is not None:
                current.instrs[ins.name] = ins
            continue
        if (h := _HEADER.match(line)) is not None:
            current = comps.setdefault(h.group(2), Computation(h.group(2)))
            entry = h.group(2) if h.group(1) else entry
        elif line.strip() in _FRAME_TABLES:
            table = line.strip()
        elif table and (m := re.match(r"(\d+) (.*)$", line)):
            tables.setdefault(table, {})[int(m.group(1))] = m.group(2).strip().strip('"')
    if not entry:
        raise ValueError("no ENTRY computation: not the text of an HloModule")
    frames, parents = _frame_tables(tables)
    return Module(comps, entry, header, frames, parents)
