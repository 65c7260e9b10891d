"""Where metrics go: TensorBoard event files, RUN/metrics.jsonl, the console, and XLA traces.

TensorBoard events are written with tensorboard's own `EventFileWriter` and its
TensorFlow-free summary builders (`scalar_pb`, `text_pb`), so no TensorFlow,
tensorboardX or torch is needed. Tags are namespaced: ``train/loss``,
``eval/perplexity``, ``perf/tokens_per_s``, ``samples/text`` ...

`metrics.jsonl` gets one JSON object per log step and per evaluation:
``{"step": 100, "kind": "train", "train/loss": 2.31, ...}``, and one where each invocation starts
(``"kind": "start"``, with the config keys a resumed run changed).

A run resumed at step s redoes the steps after s, so the tracker first drops the
rows after s from metrics.jsonl (atomically) and marks a restart at s + 1 in the
event files, from which TensorBoard discards the earlier files' events: no step is
ever shown twice. A run started afresh (no checkpoint yet: the first save was killed)
redoes step 0 too, so every earlier row goes.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import jax

from jaxlm.core.files import atomic_write


class Tracker:
    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, enabled: bool = True, start_step: int = 0):
        self.run_dir = Path(run_dir)
        self.enabled = enabled  # only process 0 writes
        self.writer = None
        self.jsonl = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        redo = start_step + 1 if start_step else 0  # a fresh start logs step 0 (its params row) again
        keep_rows_until(self.run_dir / "metrics.jsonl", redo - 1)
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a")
        if tensorboard:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self.writer = EventFileWriter(str(self.tb_dir), flush_secs=10)
            # TensorBoard purges earlier events from this step on (it ignores a run's first START).
            self.writer.add_event(Event(wall_time=time.time(), step=redo,
                                        session_log=SessionLog(status=SessionLog.START)))

    @property
    def tb_dir(self) -> Path:
        return self.run_dir / "tb"

    def scalars(self, step: int, values: dict[str, float], kind: str) -> None:
        """Log finite scalars (None values are skipped) to TensorBoard and metrics.jsonl."""
        if not self.enabled:
            return
        values = {k: float(v) for k, v in values.items() if v is not None}
        if self.writer is not None:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.plugins.scalar.summary_v2 import scalar_pb

            for tag, v in values.items():
                if math.isfinite(v):
                    self.writer.add_event(Event(wall_time=time.time(), step=step, summary=scalar_pb(tag, v)))
        self.jsonl.write(json.dumps({"step": step, "kind": kind, "time": time.time(), **values}) + "\n")
        self.jsonl.flush()

    def start(self, step: int, changed: dict[str, list] | None = None) -> None:
        """A row where this invocation starts (a fresh run at 0, a resumed one at its checkpoint's step): wall time
        is counted within invocations, not across the gaps between them; `changed` records the config keys a
        resumed run changed, {key: [saved, now]}."""
        if not self.enabled:
            return
        row = {"step": step, "kind": "start", "time": time.time(), **({"changed": changed} if changed else {})}
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()

    def text(self, step: int, tag: str, text: str) -> None:
        if not self.enabled:
            return
        if self.writer is not None:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.plugins.text.summary_v2 import text_pb

            self.writer.add_event(Event(wall_time=time.time(), step=step, summary=text_pb(tag, text)))
        self.jsonl.write(json.dumps({"step": step, "kind": "sample", tag: text}) + "\n")
        self.jsonl.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None


def _row_step(line: str) -> int | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row.get("step") if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def keep_rows_until(path: Path, step: int) -> None:
    """Drop the rows of a metrics.jsonl past `step` (and a line torn by a killed writer), atomically."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    keep = [line for line in lines if (s := _row_step(line)) is not None and s <= step]
    if len(keep) != len(lines):
        atomic_write(path, "".join(line + "\n" for line in keep))


def peak_memory_bytes() -> int | None:
    """Peak bytes in use on the first local device since the process started, where the backend
    reports it (GPU/TPU; None on CPU)."""
    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:
        return None
    if not stats:
        return None
    return stats.get("peak_bytes_in_use", stats.get("bytes_in_use"))


class Profiler:
    """Trace global steps [first, last] into the TensorBoard directory (view with the profile plugin)."""

    def __init__(self, steps: list[int], log_dir: str | Path):
        self.first, self.last = (steps[0], steps[1]) if steps else (None, None)
        self.log_dir = str(log_dir)
        self.active = False

    def before_step(self, step: int) -> None:
        if self.first is not None and step == self.first and not self.active:
            jax.profiler.start_trace(self.log_dir)
            self.active = True

    def annotation(self, step: int):
        return jax.profiler.StepTraceAnnotation("train", step_num=step)

    def after_step(self, step: int, block_on=None) -> None:
        if self.active and step >= self.last:
            if block_on is not None:
                jax.block_until_ready(block_on)
            jax.profiler.stop_trace()
            self.active = False
            print(self.where(), file=sys.stderr, flush=True)

    def where(self) -> str:
        """The one line a profiled run prints: where the trace went and how to open it."""
        return (f"profiler trace of steps {self.first}-{self.last} in {self.log_dir}/plugins/profile; open it with "
                f"`tensorboard --logdir {self.log_dir}`, Profile tab (the profile extra)")

    def close(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False
