"""deliverables.memory_profile: the buffer assignment and live ranges XLA dumps, read into a memory timeline, the
phases of a train step and the largest buffers, checked by hand on small dumps and once on a real compile."""

import pytest

from deliverables import memory_profile as profile
from jaxlm.predict import hlo
from tests.train_helpers import needs

# Three instructions: p (a parameter, 100 bytes) is updated in place by `upd` (same slot); `a` (40 bytes) lives from
# 0 to 1 and `b` (30 bytes, a tuple's element) from 1 to 2, in the temp allocation at other offsets.
ASSIGNMENT = """\
BufferAssignment:
allocation 0: size 100, parameter 0, shape |f32[25]| at ShapeIndex {}, maybe-live-out:
 value: <1 p @0> (size=100,offset=0): f32[25]{0}
 value: <4 upd @0> (size=100,offset=0): f32[25]{0}
allocation 1: size 80, preallocated-temp:
 value: <2 a @0> (size=40,offset=0): f32[10]{0}
 value: <3 b{1} @0> (size=30,offset=40): f32[3,2,5]{2,1,0}
"""
LIVE_RANGE = """\
HloLiveRange (max 2):
  InstructionSequence:
    0:a
    1:b
    2:upd
  BufferLiveRange:
    p{}:0-2
    a{}:0-1
    b{1}:1-2
    upd{}:2-2
  Live ranges at 1 (peak):
    p{}: 100 bytes (cumulative: 100 bytes)
"""


def test_the_timeline_counts_both_ends_and_an_in_place_slot_once():
    assert profile.values(ASSIGNMENT)["b{1}"] == ((1, 40), 30, "f32[3,2,5]", "preallocated-temp")
    order, ranges = profile.schedule(LIVE_RANGE)
    assert order == ["a", "b", "upd"] and ("upd{}", 2, 2) in ranges
    # 0: p + a = 140; 1: p + a + b = 170 (a's last use and b's definition meet); 2: p/upd (one slot) + b = 130
    assert profile.timeline(ASSIGNMENT, LIVE_RANGE) == [140, 170, 130]


def test_a_train_step_splits_where_most_instructions_change_phase():
    labels = ["forward", None, "forward", "backward", "update", "backward", "backward", "update", "update", "backward",
              "update", "update"]
    # the forward leads most up to position 3 (forward 0 and 2); from 3 the backward leads most up to 7 (backward 3, 5
    # and 6 against the update's 4), so the update begins at 7 though one backward op (9) comes later
    back = profile._split(labels, "forward", "backward")
    assert back == 3 and profile._split(labels, "backward", "update", back) == 7


MODULE = """\
HloModule m, entry_computation_layout={()->f32[]}

%fused (p: f32[4,8]) -> f32[4,8] {
  %p = f32[4,8]{1,0} parameter(0)
  ROOT %pad.1 = f32[4,8]{1,0} copy(%p)
}

ENTRY %main (w: f32[4,8]) -> f32[] {
  %w = f32[4,8]{1,0} parameter(0), metadata={op_name="state.params"}
  %dot.1 = f32[4,8]{1,0} dot(%w, %w), metadata={op_name="jit(train_step)/jvp(ki,oi->ko)/dot_general" stack_frame_id=1}
  %dot.2 = f32[4,8]{1,0} dot(%w, %w), metadata={op_name="jit(train_step)/jvp(ki,oi->ko)/dot_general" stack_frame_id=1}
  %f.1 = f32[4,8]{1,0} fusion(%w), kind=kLoop, calls=%fused
  ROOT %r = f32[] constant(0)
}

FileNames
1 "/src/jaxlm/nn/layers.py"

FunctionNames
1 "dense"

FileLocations
1 {file_name_id=1 function_name_id=1 line=64}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
"""
MODULE_ASSIGNMENT = """\
allocation 0: size 128, parameter 0, shape |f32[4,8]| at ShapeIndex {}:
 value: <1 w @0> (size=128,offset=0): f32[4,8]{1,0}
allocation 1: size 512, preallocated-temp:
 value: <2 dot.1 @0> (size=128,offset=0): f32[4,8]{1,0}
 value: <3 dot.2 @0> (size=128,offset=128): f32[4,8]{1,0}
 value: <4 f.1 @0> (size=128,offset=256): f32[4,8]{1,0}
"""


def test_the_largest_buffers_are_grouped_with_their_op_and_source_line():
    module = hlo.parse_module(MODULE)
    found = profile.largest(MODULE_ASSIGNMENT, module)
    assert found[0] == {"bytes": 128, "shape": "f32[4,8]", "op": "jvp(ki,oi->ko)/dot_general",
                        "source": "jaxlm/nn/layers.py:64 dense", "count": 2, "example": "dot.1"}
    # the parameter is not the step's own buffer; a fusion without metadata is named by its fused root
    assert [g["op"] for g in found] == ["jvp(ki,oi->ko)/dot_general", "copy"]
    assert found[1]["source"] == "no source line (XLA's own copy)"


@needs("gpu-compile")
@pytest.mark.slow
def test_a_compiled_train_step_peaks_within_its_compiled_total():
    """A 2-layer model compiled for an H100 with the dump on: the timeline's peak is what the buffers hold at once,
    within the compiled total (which adds the heap's padding) and close to it; forward, backward and update follow
    each other; the largest buffer has a source line of jaxlm."""
    from deliverables.compiled_memory import job
    from jaxlm.predict.target import parse_target

    j = job("small", 128, 2, "float32", extra=["model.num_layers=2"])
    r = profile.profile(j, parse_target("h100-80gb"))
    assert 0.9 * r["total_bytes"] <= r["peak_live_bytes"] <= r["total_bytes"]
    (f0, f1), (b0, b1), (u0, u1) = r["phases"].values()
    assert f0 == 0 and f1 + 1 == b0 and b1 + 1 == u0 and u1 == r["instructions"] - 1
    assert len(r["timeline"]) == profile.POINTS and max(r["timeline"]) == r["peak_live_bytes"]
    assert any(g["source"].startswith("jaxlm/nn/") for g in r["largest"])
